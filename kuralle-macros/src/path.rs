//! The one place that spells the runtime's paths: generated code reaches `kuralle` only
//! through `::kuralle::__private`, never through a dependency the user's crate may lack.

use proc_macro2::TokenStream;
use quote::quote;

/// `::kuralle::__private`.
pub(crate) fn private() -> TokenStream {
    quote!(::kuralle::__private)
}

/// The path serde's derive is told to use (`#[serde(crate = "...")]`), as a string.
pub(crate) const SERDE: &str = "::kuralle::__private::serde";

/// The path schemars' derive is told to use (`#[schemars(crate = "...")]`), as a string.
pub(crate) const SCHEMARS: &str = "::kuralle::__private::schemars";

/// The lints generated code allows, in one place (pin-project's `allowed_lints`). Put once on
/// the `const _` block that holds the generated impls; the generated structs carry only
/// [`allowed_on_structs`].
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

/// What the generated (public, user-named) structs allow: an unused tool is not dead code the
/// user wrote, and an undocumented param is not a missing doc the user can add on the field.
pub(crate) fn allowed_on_structs() -> TokenStream {
    quote!(#[allow(dead_code, missing_docs)])
}

/// `::kuralle::__private` with every token at `span`, for checks whose error must point at
/// the user's token (an interpolated call-site path would pull the span to the attribute).
pub(crate) fn private_at(span: proc_macro2::Span) -> TokenStream {
    quote::quote_spanned!(span=> ::kuralle::__private)
}
