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

    // DESIGN §8: guards come first. A non-replayed call gets a fresh journal key each time,
    // so after a crash its unfinished intent cannot be matched to the retry.
    let never_replayed = tool.args.replay.as_ref().is_some_and(|r| !r.value);
    let at_most_once = tool.args.at_most_once.as_ref().is_some_and(|a| a.value);
    if never_replayed
        && at_most_once
        && let Some(span) = tool.args.later_of("replay", "at_most_once")
    {
        cx.error_at(
            span,
            "`#[tool(replay = false)]` cannot be combined with `at_most_once`: a call cut off by a crash \
             could not be told apart from a fresh one (a call that is never replayed gets a new journal \
             key each time), so it could run twice; drop `replay = false` to keep the at-most-once guarantee",
        );
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::{ItemFn, parse_quote};

    use super::*;
    use crate::tool::args::ToolArgs;

    fn errors(args: proc_macro2::TokenStream) -> String {
        let cx = Ctxt::new();
        let args = ToolArgs::parse(&cx, args);
        let func: ItemFn = parse_quote! {
            /// Charge.
            async fn charge(cents: u64) -> u64 { cents }
        };
        let tool = ToolFn::from_syn(&cx, &args, &func);
        super::tool(&cx, &tool);
        cx.into_compile_errors().to_string()
    }

    #[test]
    fn replay_false_excludes_at_most_once_in_either_order() {
        for args in [quote!(replay = false, at_most_once), quote!(at_most_once, replay = false)] {
            assert!(errors(args).contains("could run twice"));
        }
        assert!(errors(quote!(replay = false, at_most_once = false)).is_empty());
        assert!(errors(quote!(replay = true, at_most_once)).is_empty());
    }
}
