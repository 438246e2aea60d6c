//! The validated model of an `#[agent]` struct.

use syn::{ExprPath, Fields, ItemStruct};

use super::args::AgentArgs;
use crate::{ctxt::Ctxt, docs};

pub(crate) struct AgentStruct<'a> {
    pub(crate) item: &'a ItemStruct,
    pub(crate) args: &'a AgentArgs,
    pub(crate) id: String,
    pub(crate) instructions: String,
    pub(crate) tools: &'a [ExprPath],
}

impl<'a> AgentStruct<'a> {
    pub(crate) fn from_syn(cx: &Ctxt, args: &'a AgentArgs, item: &'a ItemStruct) -> Self {
        if !matches!(item.fields, Fields::Unit) {
            cx.error_spanned_by(&item.fields, "`#[agent]` applies to a unit struct, for example `struct Support;`");
        }
        if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
            cx.error_spanned_by(&item.generics, "`#[agent]` structs cannot be generic");
        }
        let id = match &args.id {
            Some(lit) => {
                let id = lit.value();
                let valid = !id.is_empty()
                    && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
                if !valid {
                    cx.error_spanned_by(lit, format!("invalid agent id {id:?}: use one or more of `a-z 0-9 _ -`"));
                }
                id
            }
            None => {
                cx.error_spanned_by(&item.ident, "an agent needs an id: add `#[agent(id = \"...\")]`");
                String::new()
            }
        };
        let instructions = docs::full_text(&item.attrs).unwrap_or_else(|| {
            cx.error_spanned_by(
                &item.ident,
                "an agent needs instructions: add a doc comment to the struct (it becomes the system text)",
            );
            String::new()
        });
        if args.output.is_none() {
            for (key, expr) in [("output_mode", &args.output_mode), ("output_retries", &args.output_retries)] {
                if let Some(expr) = expr {
                    cx.error_spanned_by(expr, format!("`{key}` needs a typed output: add `output = YourType`"));
                }
            }
        }
        AgentStruct { item, args, id, instructions, tools: args.tools.as_deref().unwrap_or_default() }
    }
}
