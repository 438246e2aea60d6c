//! Finding and rewriting progress points in a generator tool's body.
//!
//! DESIGN §3 spells a progress point `yield expr;`, but rustc feature-gates `yield` while
//! *parsing* (before any attribute macro runs; even `#[cfg(FALSE)]` code is rejected: see
//! rust-lang/rust `tests/ui/feature-gates/feature-gate-coroutines.rs`), so on stable a tool
//! writes `progress!(expr);` instead. Both forms are rewritten here: `yield e` (for toolchains
//! that accept it) and `progress!(e)` (any path ending in `progress`).
//!
//! The traversal stops at closures, `async` blocks and nested items: a progress point there
//! belongs to them, not to the tool (and `progress!` then reports its own error).

use proc_macro2::TokenStream;
use quote::quote_spanned;
use syn::{
    Block, Expr, Item, Macro, Stmt,
    spanned::Spanned,
    visit_mut::{self, VisitMut},
};

/// What to do with each progress point found.
#[derive(Clone, Copy)]
pub(crate) enum Mode {
    /// Rewrite `yield e` / `progress!(e)` to emit through `__kuralle_emit`.
    Emit,
    /// Replace each point with one that emits nothing (`progress!(@discard e)`, or
    /// `{ let _ = e; }` for `yield e`): used when the tool has errors, so the re-emitted fn
    /// adds no errors of its own (`progress!` outside a generator is one).
    Neutralize,
}

/// Rewrites the progress points of `block` per `mode`; returns whether it had any. This is
/// the one traversal of a tool body: the model asks it whether the fn is a generator, on the
/// copy of the body that is emitted.
pub(crate) fn rewrite(block: &mut Block, mode: Mode) -> bool {
    let mut points = ProgressPoints { mode, found: false };
    points.visit_block_mut(block);
    points.found
}

fn is_progress(mac: &Macro) -> bool {
    mac.path.segments.last().is_some_and(|s| s.ident == "progress")
}

struct ProgressPoints {
    mode: Mode,
    found: bool,
}

impl ProgressPoints {
    /// The replacement for a point whose value is `value` (`None`: `yield;`). `mac` is the
    /// user's `progress!` when the point is one.
    fn replace(&mut self, value: Option<TokenStream>, mac: Option<&Macro>, span: proc_macro2::Span) -> Expr {
        self.found = true;
        match (self.mode, value) {
            // Keeps the user's macro path, so their `use kuralle::progress;` stays used and
            // resolution stays theirs.
            (Mode::Emit, value) => match mac {
                Some(mac) => {
                    let path = &mac.path;
                    syn::parse_quote_spanned!(span=> #path!(__kuralle_emit, #value).await)
                }
                None => {
                    let value = value.unwrap_or_else(|| quote_spanned!(span=> ()));
                    syn::parse_quote_spanned!(span=> __kuralle_emit.emit(#value).await)
                }
            },
            (Mode::Neutralize, value) if mac.is_some() => {
                let path = mac.map(|m| &m.path);
                syn::parse_quote_spanned!(span=> #path!(@discard #value))
            }
            (Mode::Neutralize, Some(value)) => syn::parse_quote_spanned!(span=> { let _ = #value; }),
            (Mode::Neutralize, None) => syn::parse_quote_spanned!(span=> {}),
        }
    }
}

impl VisitMut for ProgressPoints {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Yield(y) => {
                if let Some(inner) = &mut y.expr {
                    self.visit_expr_mut(inner);
                }
                let value = y.expr.as_ref().map(quote::ToTokens::to_token_stream);
                *expr = self.replace(value, None, y.span());
            }
            Expr::Macro(m) if is_progress(&m.mac) => {
                *expr = self.replace(Some(m.mac.tokens.clone()), Some(&m.mac), m.mac.span());
            }
            // A progress point in a closure or `async` block belongs to it, not to the tool.
            Expr::Closure(_) | Expr::Async(_) => {}
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_stmt_mut(&mut self, stmt: &mut Stmt) {
        match stmt {
            Stmt::Macro(m) if is_progress(&m.mac) => {
                let semi = m.semi_token.unwrap_or_default();
                let replaced = self.replace(Some(m.mac.tokens.clone()), Some(&m.mac), m.mac.span());
                *stmt = Stmt::Expr(replaced, Some(semi));
            }
            _ => visit_mut::visit_stmt_mut(self, stmt),
        }
    }

    /// Nested items have bodies of their own.
    fn visit_item_mut(&mut self, _: &mut Item) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::ToTokens;
    use syn::parse_quote;

    fn contains(mut block: Block) -> bool {
        rewrite(&mut block, Mode::Emit)
    }

    #[test]
    fn finds_only_own_progress_points() {
        assert!(contains(parse_quote!({
            if x {
                yield 1;
            }
        })));
        assert!(contains(parse_quote!({
            if x {
                progress!(1);
            }
        })));
        assert!(contains(parse_quote!({
            let _ = kuralle::progress!(1);
        })));
        assert!(!contains(parse_quote!({
            let f = || {
                progress!(1);
            };
        })));
        assert!(!contains(parse_quote!({
            let f = async {
                yield 1;
            };
        })));
        assert!(!contains(parse_quote!({
            fn inner() {
                progress!(1);
            }
        })));
        assert!(!contains(parse_quote!({
            println!("progress");
        })));
    }

    #[test]
    fn rewrites_to_emit() {
        let mut block: Block = parse_quote!({
            yield step(1)?;
            progress!(2);
        });
        assert!(rewrite(&mut block, Mode::Emit));
        let text = block.to_token_stream().to_string();
        assert!(text.contains("__kuralle_emit . emit (step (1) ?) . await"), "{text}");
        assert!(text.contains("progress ! (__kuralle_emit , 2) . await ;"), "{text}");
    }

    #[test]
    fn neutralizes_both_forms() {
        let mut block: Block = parse_quote!({
            yield 1;
            progress!(2);
            let _ = kuralle::progress!(3);
        });
        assert!(rewrite(&mut block, Mode::Neutralize));
        let text = block.to_token_stream().to_string();
        assert!(text.contains("let _ = 1 ;"), "{text}");
        assert!(text.contains("progress ! (@ discard 2)"), "{text}");
        assert!(text.contains("kuralle :: progress ! (@ discard 3)"), "{text}");
    }
}
