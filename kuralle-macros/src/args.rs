//! What `#[tool(...)]` and `#[agent(...)]` argument parsing share: duplicate and unknown keys,
//! bare flags, and the order the keys were written in.

use proc_macro2::{Span, TokenStream};
use syn::{Expr, LitBool, meta::ParseNestedMeta};

use crate::ctxt::Ctxt;

/// A value with the span of the argument that set it.
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) span: Span,
}

/// The state of one attribute's parse: which macro (for messages), which keys it accepts, and
/// the keys seen so far, in order.
pub(crate) struct Keys<'c> {
    cx: &'c Ctxt,
    /// `tool` or `agent`, as the user writes the attribute.
    attr: &'static str,
    /// Every accepted key, in the order the "unknown argument" message lists them.
    valid: &'static [&'static str],
    /// Each accepted key the first time it appeared, with its span.
    seen: Vec<(String, Span)>,
}

impl<'c> Keys<'c> {
    pub(crate) fn new(cx: &'c Ctxt, attr: &'static str, valid: &'static [&'static str]) -> Self {
        Self { cx, attr, valid, seen: Vec::new() }
    }

    /// The key of `meta` when it is one of the accepted keys; otherwise reports it, skips its
    /// value (so the arguments after it are still checked) and returns `None`.
    pub(crate) fn key(&self, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
        if let Some(ident) = meta.path.get_ident() {
            let key = ident.to_string();
            if self.valid.contains(&key.as_str()) {
                return Ok(Some(key));
            }
        }
        let shown = quote::ToTokens::to_token_stream(&meta.path).to_string().replace(' ', "");
        let valid = self.valid.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        self.cx.error_spanned_by(
            &meta.path,
            format!("unknown `#[{}]` argument `{shown}`; expected one of {valid}", self.attr),
        );
        if meta.input.peek(syn::Token![=]) {
            let _: Expr = meta.value()?.parse()?;
        } else if meta.input.peek(syn::token::Paren) {
            meta.parse_nested_meta(|nested| {
                let _: TokenStream = nested.input.parse()?;
                Ok(())
            })?;
        }
        Ok(None)
    }

    /// Stores `value` in `slot`, or reports a duplicate on the key's second occurrence.
    pub(crate) fn set<T>(&mut self, slot: &mut Option<T>, value: T, meta: &ParseNestedMeta<'_>) {
        let key = quote::ToTokens::to_token_stream(&meta.path).to_string();
        let span = span_of(meta);
        if slot.is_some() {
            self.cx.error_at(span, format!("duplicate `#[{}]` argument `{key}`", self.attr));
        } else {
            *slot = Some(value);
            self.seen.push((key, span));
        }
    }

    /// The keys in the order they were written.
    pub(crate) fn into_order(self) -> Vec<(String, Span)> {
        self.seen
    }
}

/// The span of the key of `meta`.
pub(crate) fn span_of(meta: &ParseNestedMeta<'_>) -> Span {
    meta.path.get_ident().map_or_else(Span::call_site, syn::Ident::span)
}

/// `key` alone means `true`; `key = true` / `key = false` are explicit.
pub(crate) fn flag(meta: &ParseNestedMeta<'_>) -> syn::Result<Spanned<bool>> {
    let span = span_of(meta);
    if meta.input.peek(syn::Token![=]) {
        let lit: LitBool = meta.value()?.parse()?;
        Ok(Spanned { value: lit.value, span })
    } else {
        Ok(Spanned { value: true, span })
    }
}
