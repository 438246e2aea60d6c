//! Collects errors with spans, so one compile reports every mistake (serde's `Ctxt`).

use std::cell::RefCell;

use proc_macro2::TokenStream;
use quote::ToTokens;

/// An error accumulator. Every error-producing step records here and carries on.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: RefCell<Option<syn::Error>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records an error spanning `tokens` (first to last token).
    pub(crate) fn error_spanned_by<T: ToTokens, M: std::fmt::Display>(&self, tokens: T, message: M) {
        self.syn_error(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    /// Records an error at `span`.
    pub(crate) fn error_at<M: std::fmt::Display>(&self, span: proc_macro2::Span, message: M) {
        self.syn_error(syn::Error::new(span, message));
    }

    /// Records a `syn` parse error.
    pub(crate) fn syn_error(&self, error: syn::Error) {
        let mut errors = self.errors.borrow_mut();
        match errors.as_mut() {
            Some(all) => all.combine(error),
            None => *errors = Some(error),
        }
    }

    /// Whether any error was recorded.
    pub(crate) fn has_errors(&self) -> bool {
        self.errors.borrow().is_some()
    }

    /// All recorded errors as `compile_error!` invocations (empty when there are none).
    pub(crate) fn into_compile_errors(self) -> TokenStream {
        self.errors.into_inner().map(|e| e.to_compile_error()).unwrap_or_default()
    }
}
