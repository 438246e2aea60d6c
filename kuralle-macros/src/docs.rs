//! Doc comments: `#[doc = "..."]` attributes as text.

use syn::{Attribute, Expr, ExprLit, Lit, Meta};

/// The lines of the literal `#[doc]` attributes, with the one space rustdoc adds removed.
/// Docs built by macros (`#[doc = include_str!(..)]`) are skipped.
pub(crate) fn lines(attrs: &[Attribute]) -> Vec<String> {
    let mut out = Vec::new();
    for attr in attrs {
        let Meta::NameValue(nv) = &attr.meta else { continue };
        if !nv.path.is_ident("doc") {
            continue;
        }
        if let Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) = &nv.value {
            for line in s.value().split('\n') {
                out.push(line.strip_prefix(' ').unwrap_or(line).trim_end().to_owned());
            }
        }
    }
    out
}

/// The first paragraph, soft-wrapped lines joined by a space; `None` when empty.
pub(crate) fn first_paragraph(attrs: &[Attribute]) -> Option<String> {
    let text = lines(attrs)
        .iter()
        .map(|l| l.trim())
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    (!text.is_empty()).then_some(text)
}

/// The whole text, lines joined by newlines and trimmed; `None` when empty.
pub(crate) fn full_text(attrs: &[Attribute]) -> Option<String> {
    let text = lines(attrs).join("\n").trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// Whether an attribute is `#[doc ...]`.
pub(crate) fn is_doc(attr: &Attribute) -> bool {
    attr.path().is_ident("doc")
}

/// The doc comment as schemars' derive reads it, as an expression:
/// `::core::concat!(line, "\n", line, ...)`, one leading space stripped from each literal line
/// (a line built by a macro, `#[doc = include_str!(..)]`, is kept as its expression); `""`
/// when there is none.
pub(crate) fn schemars_text<'a>(attrs: impl IntoIterator<Item = &'a Attribute>) -> proc_macro2::TokenStream {
    let lines: Vec<proc_macro2::TokenStream> = attrs
        .into_iter()
        .filter(|a| is_doc(a))
        .filter_map(|a| a.meta.require_name_value().ok())
        .map(|nv| match &nv.value {
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) if s.value().starts_with(' ') => {
                let line = &s.value()[1..];
                quote::quote!(#line)
            }
            other => quote::quote!(#other),
        })
        .collect();
    match lines.as_slice() {
        [] => quote::quote!(""),
        [line] if syn::parse2::<syn::LitStr>(line.clone()).is_ok() => line.clone(),
        _ => {
            let lines = lines
                .iter()
                .enumerate()
                .map(|(i, line)| if i == 0 { line.clone() } else { quote::quote!("\n", #line) });
            quote::quote!(::core::concat!(#(#lines),*))
        }
    }
}
