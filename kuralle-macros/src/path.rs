//! The one place that spells the runtime's paths: generated code reaches `kuralle` only
//! through `::kuralle::__private` (and the public trait paths), never through a dependency the
//! user's crate may lack.

use proc_macro2::TokenStream;
use quote::quote;

/// `::kuralle::__private`.
pub(crate) fn private() -> TokenStream {
    quote!(::kuralle::__private)
}

/// The lints generated items allow, in one place (pin-project's `allowed_lints`).
pub(crate) fn allowed_lints() -> TokenStream {
    quote! {
        #[allow(
            dead_code,
            missing_docs,
            unreachable_pub,
            unused_qualifications,
            non_camel_case_types,
            clippy::all,
            clippy::pedantic,
            clippy::nursery
        )]
    }
}
