//! `#[agent]`: parse → model → expand (its checks are in the model and in rustc, through the
//! spanned assertions the expansion emits).

mod args;
mod expand;
mod model;

use proc_macro2::TokenStream;
use syn::ItemStruct;

use crate::ctxt::Ctxt;

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let args = args::AgentArgs::parse(&cx, args);
    let item_struct = match syn::parse2::<ItemStruct>(item.clone()) {
        Ok(s) => s,
        Err(e) => {
            cx.syn_error(syn::Error::new(
                e.span(),
                "`#[agent]` applies to a unit struct, for example `struct Support;`",
            ));
            let mut out = item;
            out.extend(cx.into_compile_errors());
            return out;
        }
    };
    let agent = model::AgentStruct::from_syn(&cx, &args, &item_struct);
    if cx.has_errors() {
        return expand::fallback(&item_struct, cx.into_compile_errors());
    }
    expand::agent(&agent)
}
