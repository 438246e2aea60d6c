//! Model → tokens for `#[agent]`. Pure.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;

use super::model::AgentStruct;
use crate::path::{allowed_lints, private, private_at};

pub(crate) fn agent(agent: &AgentStruct<'_>) -> TokenStream {
    let p = private();
    let allowed = allowed_lints();
    let item = agent.item;
    let ident = &item.ident;
    let id = &agent.id;
    let instructions = &agent.instructions;
    let tools = agent.tools.iter().map(|path| {
        // Every token at the entry's span: a non-tool is then one error, on the entry.
        let at = private_at(path.span());
        quote_spanned!(path.span()=> __kuralle_tools.push(#at::assert_tool(#path));)
    });
    let mutable = (!agent.tools.is_empty()).then(|| quote!(mut));
    let args = agent.args;
    let limit = |method: &str, expr: Option<&syn::Expr>| {
        let method = syn::Ident::new(method, proc_macro2::Span::call_site());
        expr.map(|e| quote!(.#method(#e)))
    };
    let max_steps = limit("max_steps", args.max_steps.as_ref());
    let max_tool_concurrency = limit("max_tool_concurrency", args.max_tool_concurrency.as_ref());
    let max_tool_result_tokens = limit("max_tool_result_tokens", args.max_tool_result_tokens.as_ref());
    let model = limit("model", args.model.as_ref());
    let policy = limit("policy", args.policy.as_ref());
    let limits = limit("limits", args.limits.as_ref());

    let mut definition = quote! {
        #p::AgentDef::new(#id, #instructions)
            .tools(__kuralle_tools)
            #max_steps
            #max_tool_concurrency
            #max_tool_result_tokens
            #model
            #policy
            #limits
    };
    if let Some(ty) = &args.output {
        // At the type's span: a type that cannot be an output is one error, on the type.
        let at = private_at(ty.span());
        let typed = quote_spanned!(ty.span()=> #at::typed_output::<#ty>);
        let output_mode = limit("output_mode", args.output_mode.as_ref());
        let output_retries = limit("output_retries", args.output_retries.as_ref());
        definition = quote!(#typed(#definition) #output_mode #output_retries);
    }

    let mut distinct = Vec::new();
    for (i, a) in agent.tools.iter().enumerate() {
        for b in &agent.tools[i + 1..] {
            let message = format!(
                "tools `{}` and `{}` in `#[agent]` have the same name",
                a.to_token_stream().to_string().replace(' ', ""),
                b.to_token_stream().to_string().replace(' ', "")
            );
            distinct.push(quote_spanned! {b.span()=>
                const _: () = ::core::assert!(
                    !#p::str_eq(<#a as #p::ToolName>::NAME, <#b as #p::ToolName>::NAME),
                    #message
                );
            });
        }
    }

    quote! {
        #item
        #[doc(hidden)]
        #allowed
        const _: () = {
            #[automatically_derived]
            impl #p::Agent for #ident {
                fn definition(&self) -> #p::AgentDef {
                    let #mutable __kuralle_tools = #p::ToolSet::new();
                    #(#tools)*
                    #definition
                }
            }
            #(#distinct)*
        };
    }
}

/// On errors: the struct, a stub `Agent` impl so later uses do not cascade, and the errors.
pub(crate) fn fallback(item: &syn::ItemStruct, errors: TokenStream) -> TokenStream {
    let p = private();
    let allowed = allowed_lints();
    let ident = &item.ident;
    let stub = item.generics.params.is_empty().then(|| {
        quote! {
            #[doc(hidden)]
            #allowed
            const _: () = {
                impl #p::Agent for #ident {
                    fn definition(&self) -> #p::AgentDef {
                        ::core::unreachable!()
                    }
                }
            };
        }
    });
    quote! {
        #item
        #stub
        #errors
    }
}
