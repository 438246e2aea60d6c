//! `#[agent(...)]` arguments → [`AgentArgs`], parsed with `syn::meta::parser`.
//!
//! To add a key: list it in [`VALID`], add a field, and add an arm to `parse_one`.

use proc_macro2::TokenStream;
use syn::{Expr, ExprArray, ExprPath, LitStr, Type, meta::ParseNestedMeta, parse::Parser};

use crate::{args::Keys, ctxt::Ctxt};

/// Every argument `#[agent]` accepts, in the order the error message lists them.
const VALID: &[&str] = &[
    "id",
    "tools",
    "max_steps",
    "max_tool_concurrency",
    "max_tool_result_tokens",
    "model",
    "policy",
    "output",
    "output_mode",
    "output_retries",
    "limits",
];

/// The parsed `#[agent(...)]` arguments.
#[derive(Default)]
pub(crate) struct AgentArgs {
    pub(crate) id: Option<LitStr>,
    /// The tool entries: paths of unit structs that implement `Tool`.
    pub(crate) tools: Option<Vec<ExprPath>>,
    pub(crate) max_steps: Option<Expr>,
    pub(crate) max_tool_concurrency: Option<Expr>,
    pub(crate) max_tool_result_tokens: Option<Expr>,
    pub(crate) model: Option<Expr>,
    /// An expression convertible into `kuralle::Policy`.
    pub(crate) policy: Option<Expr>,
    /// The typed final output: a type that is `DeserializeOwned + JsonSchema`.
    pub(crate) output: Option<Type>,
    /// An `OutputMode` expression (a string naming a mode is turned into one).
    pub(crate) output_mode: Option<Expr>,
    /// A `u32` expression: the repair budget.
    pub(crate) output_retries: Option<Expr>,
    /// An expression of type `kuralle::RunLimits`.
    pub(crate) limits: Option<Expr>,
}

impl AgentArgs {
    pub(crate) fn parse(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut args = Self::default();
        let mut keys = Keys::new(cx, "agent", VALID);
        let parser = syn::meta::parser(|meta| args.parse_one(cx, &mut keys, &meta));
        if let Err(e) = parser.parse2(tokens) {
            cx.syn_error(e);
        }
        args
    }

    fn parse_one(&mut self, cx: &Ctxt, keys: &mut Keys<'_>, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(key) = keys.key(meta)? else { return Ok(()) };
        match key.as_str() {
            "id" => keys.set(&mut self.id, meta.value()?.parse()?, meta),
            "tools" => {
                let list: ExprArray = meta.value()?.parse()?;
                let mut tools = Vec::new();
                for elem in list.elems {
                    match elem {
                        Expr::Path(path) => tools.push(path),
                        other => cx.error_spanned_by(
                            other,
                            "`#[agent(tools = [...])]` entries are tool structs, for example `GetWeather`",
                        ),
                    }
                }
                keys.set(&mut self.tools, tools, meta);
            }
            "max_steps" => keys.set(&mut self.max_steps, meta.value()?.parse()?, meta),
            "max_tool_concurrency" => keys.set(&mut self.max_tool_concurrency, meta.value()?.parse()?, meta),
            "max_tool_result_tokens" => keys.set(&mut self.max_tool_result_tokens, meta.value()?.parse()?, meta),
            "model" => keys.set(&mut self.model, meta.value()?.parse()?, meta),
            "policy" => keys.set(&mut self.policy, meta.value()?.parse()?, meta),
            "output" => {
                let value = meta.value()?;
                // A literal is the likely mistake (`output = "Invoice"`): say what goes there.
                if value.peek(syn::Lit) {
                    let lit: syn::Lit = value.parse()?;
                    cx.error_spanned_by(lit, "`#[agent(output = ...)]` takes a type, for example `output = Invoice`");
                } else {
                    keys.set(&mut self.output, value.parse()?, meta);
                }
            }
            "output_mode" => {
                let expr: Expr = meta.value()?.parse()?;
                if let Some(mode) = output_mode(cx, &expr) {
                    keys.set(&mut self.output_mode, mode, meta);
                }
            }
            "output_retries" => {
                let expr: Expr = meta.value()?.parse()?;
                // A literal other than a whole number is the likely mistake (`"2"`, `2.0`): say
                // so on it, rather than as a type mismatch inside the generated code.
                if let Expr::Lit(syn::ExprLit { lit, .. }) = &expr
                    && !matches!(lit, syn::Lit::Int(_))
                {
                    cx.error_spanned_by(
                        lit,
                        "`output_retries` takes a whole number of repairs, for example `output_retries = 2`",
                    );
                } else {
                    keys.set(&mut self.output_retries, expr, meta);
                }
            }
            "limits" => keys.set(&mut self.limits, meta.value()?.parse()?, meta),
            // `Keys::key` returns only keys listed in `VALID`; a key listed there without an arm
            // here is a bug in this crate, reported rather than panicking.
            other => cx.error_spanned_by(&meta.path, format!("`#[agent]` argument `{other}` is not implemented")),
        }
        Ok(())
    }
}

/// The modes `output_mode = "..."` names, as `OutputMode`'s variants.
const OUTPUT_MODES: &[(&str, &str)] = &[("tool", "Tool"), ("native", "Native"), ("prompted", "Prompted")];

/// `output_mode`'s expression: a string naming a mode becomes the `OutputMode` variant (an
/// unknown one is an error on the string, listing the modes); any other expression is kept.
fn output_mode(cx: &Ctxt, expr: &Expr) -> Option<Expr> {
    let Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(lit), .. }) = expr else { return Some(expr.clone()) };
    let name = lit.value();
    let Some((_, variant)) = OUTPUT_MODES.iter().find(|(n, _)| *n == name) else {
        let list: Vec<String> = OUTPUT_MODES.iter().map(|(n, _)| format!("`{n:?}`")).collect();
        cx.error_spanned_by(lit, format!("unknown `output_mode` {name:?}; expected one of {}", list.join(", ")));
        return None;
    };
    let variant = syn::Ident::new(variant, lit.span());
    Some(syn::parse_quote_spanned!(lit.span()=> ::kuralle::__private::OutputMode::#variant))
}
