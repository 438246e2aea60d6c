//! `#[tool]`: parse → model → check → expand.

mod args;
mod check;
mod expand;
mod model;
mod yields;

use proc_macro2::TokenStream;
use syn::ItemFn;

use crate::ctxt::Ctxt;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let args = args::ToolArgs::parse(&cx, args);
    let func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(e) => {
            // Not a fn at all: keep the item, add the error.
            cx.syn_error(syn::Error::new(e.span(), "`#[tool]` applies to an `async fn`"));
            let mut out = item;
            out.extend(cx.into_compile_errors());
            return out;
        }
    };
    let tool = model::ToolFn::from_syn(&cx, &args, &func);
    check::tool(&cx, &tool);
    if cx.has_errors() {
        return expand::fallback(&func, cx.into_compile_errors());
    }
    expand::tool(tool)
}
