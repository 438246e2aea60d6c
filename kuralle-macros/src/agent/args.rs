//! `#[agent(...)]` arguments → [`AgentArgs`], parsed with `syn::meta::parser`.
//!
//! To add a key: list it in [`VALID`], add a field, and add an arm to `parse_one`.

use proc_macro2::TokenStream;
use syn::{Expr, ExprArray, ExprPath, LitStr, meta::ParseNestedMeta, parse::Parser};

use crate::{args::Keys, ctxt::Ctxt};

/// Every argument `#[agent]` accepts, in the order the error message lists them.
const VALID: &[&str] =
    &["id", "tools", "max_steps", "max_tool_concurrency", "max_tool_result_tokens", "model", "policy", "limits"];

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
            "limits" => keys.set(&mut self.limits, meta.value()?.parse()?, meta),
            // `Keys::key` returns only keys listed in `VALID`; a key listed there without an arm
            // here is a bug in this crate, reported rather than panicking.
            other => cx.error_spanned_by(&meta.path, format!("`#[agent]` argument `{other}` is not implemented")),
        }
        Ok(())
    }
}
