//! Implementation detail of the `kuralle` crate: the `#[tool]` and `#[agent]` attributes.
//!
//! Each macro runs parse → model → check → expand: the arguments and the item are parsed into
//! a model that borrows `syn`, cross-cutting checks run on the model, and expansion is a pure
//! function of the model. Errors are collected with spans and emitted together with the
//! user's item, so one mistake does not cascade.

mod agent;
mod args;
mod ctxt;
mod docs;
mod path;
#[cfg(test)]
mod snapshots;
mod tool;

use proc_macro::TokenStream;

/// Turns an async fn into a kuralle tool: a unit struct (the fn name in PascalCase) that
/// implements `kuralle::Tool`, and an input struct (`<Name>Input`) built from the params.
///
/// Use it through `kuralle::tool`, whose documentation lists every argument with an example
/// and the code the macro writes (the examples live there so they run as `kuralle`'s doc
/// tests).
#[proc_macro_attribute]
pub fn tool(args: TokenStream, item: TokenStream) -> TokenStream {
    tool::expand(args.into(), item.into()).into()
}

/// Declares an agent on a unit struct: its doc comment is the instructions, its arguments the
/// id, tools and limits. Implements `kuralle::Agent`.
///
/// Use it through `kuralle::agent`, whose documentation lists every argument with an example
/// and the code the macro writes.
#[proc_macro_attribute]
pub fn agent(args: TokenStream, item: TokenStream) -> TokenStream {
    agent::expand(args.into(), item.into()).into()
}
