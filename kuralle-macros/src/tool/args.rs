//! `#[tool(...)]` arguments → [`ToolArgs`], parsed with `syn::meta::parser`.

use proc_macro2::{Span, TokenStream};
use syn::{Expr, LitStr, Path, meta::ParseNestedMeta, parse::Parser};

pub(crate) use crate::args::Spanned;
use crate::{
    args::{Keys, flag},
    ctxt::Ctxt,
};

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
    /// The keys as written, in order, for checks that point at the later of two arguments.
    pub(crate) order: Vec<(String, Span)>,
}

impl ToolArgs {
    /// Parses the argument tokens, recording every mistake in `cx`.
    pub(crate) fn parse(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut args = Self::default();
        let mut keys = Keys::new(cx, "tool", VALID);
        let parser = syn::meta::parser(|meta| args.parse_one(cx, &mut keys, &meta));
        if let Err(e) = parser.parse2(tokens) {
            cx.syn_error(e);
        }
        args.order = keys.into_order();
        args
    }

    fn parse_one(&mut self, cx: &Ctxt, keys: &mut Keys<'_>, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(key) = keys.key(meta)? else { return Ok(()) };
        let span = crate::args::span_of(meta);
        match key.as_str() {
            "name" => keys.set(&mut self.name, meta.value()?.parse()?, meta),
            "description" => keys.set(&mut self.description, meta.value()?.parse()?, meta),
            "parallel_safe" => {
                let value = if meta.input.peek(syn::Token![=]) {
                    ParallelSafe::Predicate(meta.value()?.parse()?)
                } else {
                    ParallelSafe::Always
                };
                keys.set(&mut self.parallel_safe, Spanned { value, span }, meta);
            }
            "idempotency_key" => keys.set(&mut self.idempotency_key, meta.value()?.parse()?, meta),
            "timeout" => {
                let lit: LitStr = meta.value()?.parse()?;
                match parse_duration_ms(&lit.value()) {
                    Ok(ms) => keys.set(&mut self.timeout_ms, Spanned { value: ms, span: lit.span() }, meta),
                    Err(why) => cx.error_spanned_by(&lit, why),
                }
            }
            "interruptible" => keys.set(&mut self.interruptible, flag(meta)?, meta),
            "replay" => keys.set(&mut self.replay, flag(meta)?, meta),
            "needs_approval" => keys.set(&mut self.needs_approval, flag(meta)?, meta),
            "at_most_once" => keys.set(&mut self.at_most_once, flag(meta)?, meta),
            "on_error" => keys.set(&mut self.on_error, meta.value()?.parse()?, meta),
            // `Keys::key` returns only keys listed in `VALID`; a key listed there without an arm
            // here is a bug in this crate, reported rather than panicking.
            other => cx.error_spanned_by(&meta.path, format!("`#[tool]` argument `{other}` is not implemented")),
        }
        Ok(())
    }

    /// The span of whichever of `a` and `b` was written second (both must be present).
    pub(crate) fn later_of(&self, a: &str, b: &str) -> Option<Span> {
        let position = |key: &str| self.order.iter().position(|(k, _)| k == key);
        let (pa, pb) = (position(a)?, position(b)?);
        Some(self.order[pa.max(pb)].1)
    }
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
