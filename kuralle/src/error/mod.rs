//! Typed errors, one per file: what a tool call can end in ([`ToolError`]), and what can end a
//! run ([`RunError`]).

mod run;
mod tool;

pub use run::RunError;
pub use tool::ToolError;
