//! `#[tool(...)]` arguments → [`ToolArgs`], parsed with `syn::meta::parser`.

use proc_macro2::{Span, TokenStream};
use syn::{Expr, LitBool, LitStr, Path, meta::ParseNestedMeta, parse::Parser};

use crate::ctxt::Ctxt;

/// Every argument `#[tool]` accepts, in the order the error message lists them.
const VALID: &[&str] = &[
    "name",
    "description",
    "parallel_safe",
    "idempotency_key",
    "timeout",
    "interruptible",
    "replay",
    "needs_approval",
    "at_most_once",
    "on_error",
];

/// A value with the span of the argument that set it.
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// `parallel_safe` alone, or `parallel_safe = expr`.
pub(crate) enum ParallelSafe {
    Always,
    Predicate(Expr),
}

/// The parsed `#[tool(...)]` arguments. Absent arguments are `None`.
#[derive(Default)]
pub(crate) struct ToolArgs {
    pub(crate) name: Option<LitStr>,
    pub(crate) description: Option<LitStr>,
    pub(crate) parallel_safe: Option<Spanned<ParallelSafe>>,
    pub(crate) idempotency_key: Option<Expr>,
    /// The timeout in milliseconds.
    pub(crate) timeout_ms: Option<Spanned<u64>>,
    pub(crate) interruptible: Option<Spanned<bool>>,
    pub(crate) replay: Option<Spanned<bool>>,
    pub(crate) needs_approval: Option<Spanned<bool>>,
    pub(crate) at_most_once: Option<Spanned<bool>>,
    pub(crate) on_error: Option<Path>,
}

impl ToolArgs {
    /// Parses the argument tokens, recording every mistake in `cx`.
    pub(crate) fn parse(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut args = Self::default();
        let parser = syn::meta::parser(|meta| {
            args.parse_one(cx, &meta)?;
            Ok(())
        });
        if let Err(e) = parser.parse2(tokens) {
            cx.syn_error(e);
        }
        args
    }

    fn parse_one(&mut self, cx: &Ctxt, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(key) = meta.path.get_ident().map(ToString::to_string) else {
            let shown = quote::ToTokens::to_token_stream(&meta.path).to_string().replace(' ', "");
            return unknown(cx, meta, &shown);
        };
        let span = meta.path.get_ident().map_or_else(Span::call_site, syn::Ident::span);
        match key.as_str() {
            "name" => set(cx, &mut self.name, meta.value()?.parse()?, &key, span),
            "description" => set(cx, &mut self.description, meta.value()?.parse()?, &key, span),
            "parallel_safe" => {
                let value = if meta.input.peek(syn::Token![=]) {
                    ParallelSafe::Predicate(meta.value()?.parse()?)
                } else {
                    ParallelSafe::Always
                };
                set(cx, &mut self.parallel_safe, Spanned { value, span }, &key, span);
            }
            "idempotency_key" => set(cx, &mut self.idempotency_key, meta.value()?.parse()?, &key, span),
            "timeout" => {
                let lit: LitStr = meta.value()?.parse()?;
                match parse_duration_ms(&lit.value()) {
                    Ok(ms) => set(cx, &mut self.timeout_ms, Spanned { value: ms, span: lit.span() }, &key, span),
                    Err(why) => cx.error_spanned_by(&lit, why),
                }
            }
            "interruptible" => set(cx, &mut self.interruptible, flag(meta, span)?, &key, span),
            "replay" => set(cx, &mut self.replay, flag(meta, span)?, &key, span),
            "needs_approval" => set(cx, &mut self.needs_approval, flag(meta, span)?, &key, span),
            "at_most_once" => set(cx, &mut self.at_most_once, flag(meta, span)?, &key, span),
            "on_error" => set(cx, &mut self.on_error, meta.value()?.parse()?, &key, span),
            other => return unknown(cx, meta, other),
        }
        Ok(())
    }
}

/// Stores `value` in `slot`, or reports a duplicate on the second occurrence.
fn set<T>(cx: &Ctxt, slot: &mut Option<T>, value: T, key: &str, span: Span) {
    if slot.is_some() {
        cx.error_at(span, format!("duplicate `#[tool]` argument `{key}`"));
    } else {
        *slot = Some(value);
    }
}

/// `key` alone means `true`; `key = true` / `key = false` are explicit.
fn flag(meta: &ParseNestedMeta<'_>, span: Span) -> syn::Result<Spanned<bool>> {
    if meta.input.peek(syn::Token![=]) {
        let lit: LitBool = meta.value()?.parse()?;
        Ok(Spanned { value: lit.value, span })
    } else {
        Ok(Spanned { value: true, span })
    }
}

/// Reports an unknown argument and skips its value, so the arguments after it are still checked.
fn unknown(cx: &Ctxt, meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<()> {
    let valid = VALID.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
    cx.error_spanned_by(&meta.path, format!("unknown `#[tool]` argument `{key}`; expected one of {valid}"));
    if meta.input.peek(syn::Token![=]) {
        let _: Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|nested| {
            let _: TokenStream = nested.input.parse()?;
            Ok(())
        })?;
    }
    Ok(())
}

/// `"250ms"`, `"5s"`, `"2m"` → milliseconds.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let expected = "expected a duration like \"250ms\", \"5s\" or \"2m\" (an integer, then `ms`, `s` or `m`)";
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("invalid `timeout` {text:?}: {expected}"));
    }
    let factor = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        _ => return Err(format!("invalid `timeout` unit in {text:?}: {expected}")),
    };
    let ms = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("`timeout` {text:?} is too large"))?;
    if ms == 0 {
        return Err("`timeout` must be greater than zero".to_owned());
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("5s"), Ok(5000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert!(parse_duration_ms("5").is_err());
        assert!(parse_duration_ms("s").is_err());
        assert!(parse_duration_ms("5 s").is_err());
        assert!(parse_duration_ms("1.5s").is_err());
        assert!(parse_duration_ms("0s").is_err());
        assert!(parse_duration_ms("99999999999999999999s").is_err());
    }

    #[test]
    fn all_arguments_combine() {
        let cx = Ctxt::new();
        let args = ToolArgs::parse(
            &cx,
            quote!(
                name = "n",
                description = "d",
                parallel_safe = |_| true,
                idempotency_key = key,
                timeout = "5s",
                interruptible = false,
                replay = false,
                needs_approval,
                at_most_once,
                on_error = recover
            ),
        );
        assert!(!cx.has_errors());
        assert_eq!(args.name.map(|n| n.value()).as_deref(), Some("n"));
        assert!(matches!(args.parallel_safe.map(|p| p.value), Some(ParallelSafe::Predicate(_))));
        assert_eq!(args.timeout_ms.map(|t| t.value), Some(5000));
        assert_eq!(args.interruptible.map(|t| t.value), Some(false));
        assert_eq!(args.needs_approval.map(|t| t.value), Some(true));
        assert!(args.on_error.is_some());
    }

    #[test]
    fn duplicates_and_unknowns_are_errors() {
        let cx = Ctxt::new();
        let _ = ToolArgs::parse(&cx, quote!(replay = false, replay = true));
        assert!(cx.has_errors());
        let cx = Ctxt::new();
        let _ = ToolArgs::parse(&cx, quote!(descripton = "x"));
        assert!(cx.into_compile_errors().to_string().contains("expected one of `name`"));
    }
}
