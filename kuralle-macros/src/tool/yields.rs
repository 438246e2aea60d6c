//! Finding and rewriting progress points in a generator tool's body.
//!
//! DESIGN §3 spells a progress point `yield expr;`, but rustc feature-gates `yield` while
//! *parsing* (before any attribute macro runs; even `#[cfg(FALSE)]` code is rejected: see
//! rust-lang/rust `tests/ui/feature-gates/feature-gate-coroutines.rs`), so on stable a tool
//! writes `progress!(expr);` instead. Both forms are rewritten here: `yield e` (for toolchains
//! that accept it) and `progress!(e)` (any path ending in `progress`).
//!
//! The visitors stop at closures, `async` blocks and nested items: a progress point there
//! belongs to them, not to the tool (and `progress!` then reports its own error).

use proc_macro2::TokenStream;
use quote::quote_spanned;
use syn::{
    Block, Expr, Item, Macro, Stmt,
    spanned::Spanned,
    visit_mut::{self, VisitMut},
};

/// Whether `block` contains a progress point of its own.
pub(crate) fn contains_yield(block: &Block) -> bool {
    let mut finder = Finder { found: false };
    finder.visit_block_mut(&mut block.clone());
    finder.found
}

/// Rewrites each `yield e` / `progress!(e)` to emit through `__kuralle_emit`.
pub(crate) fn rewrite(block: &mut Block) {
    Rewriter.visit_block_mut(block);
}

/// Rewrites each `yield e` to `{ let _ = e; }`: used when the tool has errors, so the
/// re-emitted fn does not add more errors to the real ones.
pub(crate) fn neutralize(block: &mut Block) {
    Neutralizer.visit_block_mut(block);
}

fn is_progress(mac: &Macro) -> bool {
    mac.path.segments.last().is_some_and(|s| s.ident == "progress")
}

/// `progress!(e)` → `progress!(__kuralle_emit, e).await`: keeps the user's macro path, so
/// their `use kuralle::progress;` stays used and resolution stays theirs.
fn rewrite_progress(mac: &Macro) -> Expr {
    let path = &mac.path;
    let tokens: &TokenStream = &mac.tokens;
    let span = mac.span();
    syn::parse_quote_spanned!(span=> #path!(__kuralle_emit, #tokens).await)
}

struct Finder {
    found: bool,
}

impl VisitMut for Finder {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Yield(_) => self.found = true,
            Expr::Macro(m) if is_progress(&m.mac) => self.found = true,
            Expr::Closure(_) | Expr::Async(_) => {}
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_stmt_mut(&mut self, stmt: &mut Stmt) {
        match stmt {
            Stmt::Macro(m) if is_progress(&m.mac) => self.found = true,
            _ => visit_mut::visit_stmt_mut(self, stmt),
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}
}

struct Rewriter;

impl VisitMut for Rewriter {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Yield(y) => {
                if let Some(inner) = &mut y.expr {
                    self.visit_expr_mut(inner);
                }
                let span = y.span();
                let value = match &y.expr {
                    Some(e) => quote_spanned!(span=> #e),
                    None => quote_spanned!(span=> ()),
                };
                *expr = syn::parse_quote_spanned!(span=> __kuralle_emit.emit(#value).await);
            }
            Expr::Macro(m) if is_progress(&m.mac) => *expr = rewrite_progress(&m.mac),
            Expr::Closure(_) | Expr::Async(_) => {}
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_stmt_mut(&mut self, stmt: &mut Stmt) {
        match stmt {
            Stmt::Macro(m) if is_progress(&m.mac) => {
                let semi = m.semi_token.unwrap_or_default();
                *stmt = Stmt::Expr(rewrite_progress(&m.mac), Some(semi));
            }
            _ => visit_mut::visit_stmt_mut(self, stmt),
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}
}

struct Neutralizer;

impl VisitMut for Neutralizer {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Yield(y) => {
                *expr = match y.expr.take() {
                    Some(value) => syn::parse_quote!({ let _ = #value; }),
                    None => syn::parse_quote!({}),
                };
            }
            Expr::Closure(_) | Expr::Async(_) => {}
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::ToTokens;
    use syn::parse_quote;

    #[test]
    fn finds_only_own_progress_points() {
        assert!(contains_yield(&parse_quote!({
            if x {
                yield 1;
            }
        })));
        assert!(contains_yield(&parse_quote!({
            if x {
                progress!(1);
            }
        })));
        assert!(contains_yield(&parse_quote!({
            let _ = kuralle::progress!(1);
        })));
        assert!(!contains_yield(&parse_quote!({
            let f = || {
                progress!(1);
            };
        })));
        assert!(!contains_yield(&parse_quote!({
            let f = async {
                yield 1;
            };
        })));
        assert!(!contains_yield(&parse_quote!({
            fn inner() {
                progress!(1);
            }
        })));
        assert!(!contains_yield(&parse_quote!({
            println!("progress");
        })));
    }

    #[test]
    fn rewrites_to_emit() {
        let mut block: Block = parse_quote!({
            yield step(1)?;
            progress!(2);
        });
        rewrite(&mut block);
        let text = block.to_token_stream().to_string();
        assert!(text.contains("__kuralle_emit . emit (step (1) ?) . await"), "{text}");
        assert!(text.contains("progress ! (__kuralle_emit , 2) . await ;"), "{text}");
    }
}
