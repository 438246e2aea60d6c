//! Expansion snapshots: each `tests/expand/NAME.rs` with its `#[tool]` / `#[agent]` items
//! expanded and pretty-printed, compared with `tests/expand/NAME.expanded.snap` (insta).
//! What macrotest does, without `cargo expand` and nightly: the expansion functions run
//! here directly on the file's items. Review a changed snapshot like code; accept it with
//! `INSTA_UPDATE=always cargo test -p kuralle-macros` (or `cargo insta review`).

use std::path::Path;

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{Attribute, Item, Meta};

/// The tokens of `attrs`' `#[tool(...)]` or `#[agent(...)]`, removed from `attrs`.
fn take_attr(attrs: &mut Vec<Attribute>, name: &str) -> Option<TokenStream> {
    let at = attrs.iter().position(|a| a.path().segments.last().is_some_and(|s| s.ident == name))?;
    let attr = attrs.remove(at);
    Some(match attr.meta {
        Meta::List(list) => list.tokens,
        _ => TokenStream::new(),
    })
}

/// The file with every `#[tool]` fn and `#[agent]` struct replaced by its expansion.
fn expand_file(source: &str) -> String {
    let file: syn::File = syn::parse_str(source).expect("the input file parses");
    let mut out = TokenStream::new();
    for attr in &file.attrs {
        attr.to_tokens(&mut out);
    }
    for mut item in file.items {
        let expanded = match &mut item {
            Item::Fn(f) => take_attr(&mut f.attrs, "tool").map(|args| crate::tool::expand(args, f.to_token_stream())),
            Item::Struct(s) => {
                take_attr(&mut s.attrs, "agent").map(|args| crate::agent::expand(args, s.to_token_stream()))
            }
            _ => None,
        };
        out.extend(expanded.unwrap_or_else(|| item.into_token_stream()));
    }
    let expanded: syn::File = syn::parse2(out).expect("the expansion parses as a file");
    prettyplease::unparse(&expanded)
}

#[test]
fn expansions_match_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/expand");
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/expand exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 4, "expected the tool and agent inputs in {}", dir.display());
    for input in inputs {
        let name = input.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 file name").to_owned();
        let source = std::fs::read_to_string(&input).expect("the input is readable");
        let expanded = expand_file(&source);
        insta::with_settings!({
            snapshot_path => dir.clone(),
            prepend_module_to_snapshot => false,
            omit_expression => true,
            input_file => input.clone(),
        }, {
            insta::assert_snapshot!(format!("{name}.expanded"), expanded);
        });
    }
}
