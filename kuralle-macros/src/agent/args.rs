//! `#[agent(...)]` arguments → [`AgentArgs`], parsed with `syn::meta::parser`.

use proc_macro2::TokenStream;
use syn::{Expr, ExprArray, ExprPath, LitStr, meta::ParseNestedMeta, parse::Parser};

use crate::ctxt::Ctxt;

/// Every argument `#[agent]` accepts, in the order the error message lists them.
const VALID: &[&str] =
    &["id", "tools", "max_steps", "max_tool_concurrency", "max_tool_result_tokens", "model", "policy"];

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
}

impl AgentArgs {
    pub(crate) fn parse(cx: &Ctxt, tokens: TokenStream) -> Self {
        let mut args = Self::default();
        let parser = syn::meta::parser(|meta| args.parse_one(cx, &meta));
        if let Err(e) = parser.parse2(tokens) {
            cx.syn_error(e);
        }
        args
    }

    fn parse_one(&mut self, cx: &Ctxt, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let key = meta.path.get_ident().map(ToString::to_string).unwrap_or_default();
        match key.as_str() {
            "id" => set(cx, meta, &mut self.id, meta.value()?.parse()?),
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
                set(cx, meta, &mut self.tools, tools);
            }
            "max_steps" => set(cx, meta, &mut self.max_steps, meta.value()?.parse()?),
            "max_tool_concurrency" => set(cx, meta, &mut self.max_tool_concurrency, meta.value()?.parse()?),
            "max_tool_result_tokens" => set(cx, meta, &mut self.max_tool_result_tokens, meta.value()?.parse()?),
            "model" => set(cx, meta, &mut self.model, meta.value()?.parse()?),
            "policy" => set(cx, meta, &mut self.policy, meta.value()?.parse()?),
            _ => {
                let valid = VALID.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
                let shown = quote::ToTokens::to_token_stream(&meta.path).to_string().replace(' ', "");
                cx.error_spanned_by(
                    &meta.path,
                    format!("unknown `#[agent]` argument `{shown}`; expected one of {valid}"),
                );
                if meta.input.peek(syn::Token![=]) {
                    let _: Expr = meta.value()?.parse()?;
                }
            }
        }
        Ok(())
    }
}

fn set<T>(cx: &Ctxt, meta: &ParseNestedMeta<'_>, slot: &mut Option<T>, value: T) {
    if slot.is_some() {
        let key = quote::ToTokens::to_token_stream(&meta.path).to_string();
        cx.error_spanned_by(&meta.path, format!("duplicate `#[agent]` argument `{key}`"));
    } else {
        *slot = Some(value);
    }
}
