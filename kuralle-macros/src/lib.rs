//! Implementation detail of the `kuralle` crate: the `#[tool]` and `#[agent]` attributes.

use proc_macro::TokenStream;

/// Turns an async fn into a kuralle tool.
#[proc_macro_attribute]
pub fn tool(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Declares an agent.
#[proc_macro_attribute]
pub fn agent(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
