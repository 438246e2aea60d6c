//! Cross-cutting checks on the model: rules that involve more than one part of the tool.

use super::model::{Output, ToolFn};
use crate::ctxt::Ctxt;

pub(crate) fn tool(cx: &Ctxt, tool: &ToolFn<'_>) {
    if tool.description.as_deref().is_none_or(|d| d.trim().is_empty()) {
        let message = "a tool needs a description: add a doc comment or `description = \"...\"`";
        match &tool.args.description {
            Some(lit) => cx.error_spanned_by(lit, message),
            None => cx.error_spanned_by(&tool.func.sig.ident, message),
        }
    }

    // OpenAI's function-name rule; other providers are no looser.
    let name_ok = !tool.name.is_empty()
        && tool.name.len() <= 64
        && tool.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        let message = format!("invalid tool name {:?}: use 1 to 64 of `a-z A-Z 0-9 _ -`", tool.name);
        match &tool.args.name {
            Some(lit) => cx.error_spanned_by(lit, message),
            None => cx.error_spanned_by(&tool.func.sig.ident, message),
        }
    }

    if let Some(on_error) = &tool.args.on_error
        && !matches!(tool.output, Output::Result { .. })
    {
        cx.error_spanned_by(
            on_error,
            "`#[tool(on_error = ...)]` needs a tool that returns `Result<T, E>`: there is no error to recover from",
        );
    }
}
