//! The validated model of a `#[tool]` function, ready for codegen. It borrows the parsed fn;
//! building it records every mistake in the [`Ctxt`] and never stops early.

use syn::{
    AngleBracketedGenericArguments, Attribute, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType,
    Type, TypeParamBound, ext::IdentExt,
};

use super::{args::ToolArgs, yields};
use crate::{ctxt::Ctxt, docs};

/// A `#[tool]` fn.
pub(crate) struct ToolFn<'a> {
    /// The user's fn as written.
    pub(crate) func: &'a ItemFn,
    /// The user's fn as it is emitted: param attributes removed (they move to the input
    /// struct; rustc rejects doc comments on params) and progress points rewritten.
    pub(crate) emitted: ItemFn,
    /// The `#[tool(...)]` arguments.
    pub(crate) args: &'a ToolArgs,
    /// The model-facing name (`name = "..."` or the fn name).
    pub(crate) name: String,
    /// The description (`description = "..."` or the first doc paragraph).
    pub(crate) description: Option<String>,
    /// The generated unit struct (`GetWeather`).
    pub(crate) struct_ident: Ident,
    /// The generated input struct (`GetWeatherInput`).
    pub(crate) input_ident: Ident,
    /// The params, in order.
    pub(crate) params: Vec<Param<'a>>,
    /// How the fn produces its result.
    pub(crate) kind: Kind<'a>,
    /// What the fn's result (the generator's return value) is.
    pub(crate) output: Output<'a>,
}

/// One fn parameter.
pub(crate) enum Param<'a> {
    /// The `&ToolContext` param: not part of the schema, passed the call's context.
    Context,
    /// A model-facing argument: a field of the input struct.
    Arg {
        /// The binding (the JSON property, unraw'd by serde).
        ident: &'a Ident,
        /// Its type.
        ty: &'a Type,
        /// `#[doc]`, `#[serde]` and `#[schemars]` attributes, moved to the input field.
        field_attrs: Vec<&'a Attribute>,
    },
}

/// How a tool fn produces its result.
pub(crate) enum Kind<'a> {
    /// `async fn ... -> R`.
    Async,
    /// `async fn` whose body `yield`s progress; the return value is the result.
    Generator {
        /// The declared return type (`()` when omitted), output of the rewritten body.
        ret: Option<&'a Type>,
    },
    /// `fn ... -> impl Stream<Item = Yielded<P, R>>`, built by the user.
    ExplicitStream,
}

/// What a tool's result is.
pub(crate) enum Output<'a> {
    /// No return type: `()`.
    Unit,
    /// `T`.
    Value(&'a Type),
    /// `Result<T, E>`, or a one-argument alias such as `std::io::Result<T>` (`err: None`).
    Result {
        ok: &'a Type,
        err: Option<&'a Type>,
        /// The whole return type: where an alias's error type is reported.
        ret: &'a Type,
    },
}

impl Output<'_> {
    /// Where a problem with the error type is reported: the `E` of `Result<T, E>`, else the
    /// alias as a whole.
    pub(crate) fn err_span(&self) -> Option<proc_macro2::Span> {
        match self {
            Output::Result { err: Some(err), .. } => Some(syn::spanned::Spanned::span(err)),
            Output::Result { ret, .. } => Some(syn::spanned::Spanned::span(ret)),
            _ => None,
        }
    }
}

/// Attributes on params that belong to the input field, not the fn.
pub(crate) fn is_field_attr(attr: &Attribute) -> bool {
    docs::is_doc(attr) || attr.path().is_ident("serde") || attr.path().is_ident("schemars")
}

impl<'a> ToolFn<'a> {
    pub(crate) fn from_syn(cx: &Ctxt, args: &'a ToolArgs, func: &'a ItemFn) -> Self {
        let sig = &func.sig;
        let fn_name = sig.ident.unraw().to_string();
        let pascal = pascal_case(&fn_name);
        let struct_ident = Ident::new(&pascal, sig.ident.span());
        let input_ident = Ident::new(&format!("{pascal}Input"), sig.ident.span());

        if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
            cx.error_spanned_by(
                &sig.generics,
                "`#[tool]` functions cannot be generic: the input schema must be known at compile time",
            );
        }
        if let Some(unsafety) = &sig.unsafety {
            cx.error_spanned_by(unsafety, "`#[tool]` functions cannot be `unsafe`");
        }
        if let Some(abi) = &sig.abi {
            cx.error_spanned_by(abi, "`#[tool]` functions cannot have an explicit ABI");
        }
        if let Some(constness) = &sig.constness {
            cx.error_spanned_by(constness, "`#[tool]` functions cannot be `const`");
        }

        let params = params(cx, func);

        let mut emitted = strip_param_attrs(func);
        let has_yield = yields::rewrite(&mut emitted.block, yields::Mode::Emit);
        let explicit = explicit_stream_item(cx, &sig.output);
        let (kind, output) = match (&sig.asyncness, explicit, has_yield) {
            (Some(_), _, true) => {
                let ret = match &sig.output {
                    ReturnType::Default => None,
                    ReturnType::Type(_, ty) => Some(&**ty),
                };
                (Kind::Generator { ret }, output_of(ret))
            }
            (Some(_), _, false) => {
                let ret = match &sig.output {
                    ReturnType::Default => None,
                    ReturnType::Type(_, ty) => Some(&**ty),
                };
                (Kind::Async, output_of(ret))
            }
            (None, Some(ret), false) => (Kind::ExplicitStream, output_of(Some(ret))),
            (None, _, _) => {
                cx.error_spanned_by(
                    sig.fn_token,
                    "`#[tool]` requires an `async fn` (or a `fn` returning `impl Stream<Item = Yielded<P, R>>`)",
                );
                (Kind::Async, Output::Unit)
            }
        };

        let name = args.name.as_ref().map_or(fn_name, syn::LitStr::value);
        let description = match &args.description {
            Some(d) => Some(d.value()),
            None => docs::first_paragraph(&func.attrs),
        };

        ToolFn { func, emitted, args, name, description, struct_ident, input_ident, params, kind, output }
    }

    /// Whether the input struct derives `Deserialize` and `JsonSchema`: when a param carries
    /// `#[serde(...)]` or `#[schemars(...)]`, whose meaning only the derives know. Otherwise
    /// the expansion writes its own, much cheaper to compile, argument table.
    pub(crate) fn derives_input(&self) -> bool {
        self.args().any(|(_, _, attrs)| attrs.iter().any(|a| !docs::is_doc(a)))
    }

    /// The model-facing args (params other than the context).
    pub(crate) fn args(&self) -> impl Iterator<Item = (&'a Ident, &'a Type, &[&'a Attribute])> + '_ {
        self.params.iter().filter_map(|p| match p {
            Param::Context => None,
            Param::Arg { ident, ty, field_attrs } => Some((*ident, *ty, field_attrs.as_slice())),
        })
    }
}

/// The fn with the param attributes that belong to the input struct removed.
pub(crate) fn strip_param_attrs(func: &ItemFn) -> ItemFn {
    let mut func = func.clone();
    for input in &mut func.sig.inputs {
        if let FnArg::Typed(pat_ty) = input {
            pat_ty.attrs.retain(|a| !is_field_attr(a));
        }
    }
    func
}

fn params<'a>(cx: &Ctxt, func: &'a ItemFn) -> Vec<Param<'a>> {
    let mut out = Vec::new();
    let mut context_seen = false;
    for input in &func.sig.inputs {
        let pat_ty = match input {
            FnArg::Receiver(receiver) => {
                cx.error_spanned_by(receiver, "`#[tool]` functions cannot take `self`: a tool is a free function");
                continue;
            }
            FnArg::Typed(pat_ty) => pat_ty,
        };
        if is_context(&pat_ty.ty) {
            if context_seen {
                cx.error_spanned_by(&pat_ty.ty, "a tool takes at most one `&ToolContext` parameter");
            }
            context_seen = true;
            out.push(Param::Context);
            continue;
        }
        if let Some(how) = misused_context(&pat_ty.ty) {
            cx.error_spanned_by(&pat_ty.ty, format!("{how}: take `&ToolContext`"));
            continue;
        }
        let ident = match &*pat_ty.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => &p.ident,
            other => {
                cx.error_spanned_by(
                    other,
                    "`#[tool]` parameters must be plain names (each one is a JSON property); destructure inside the body",
                );
                continue;
            }
        };
        match &*pat_ty.ty {
            Type::Reference(r) => cx.error_spanned_by(
                r,
                "`#[tool]` parameters must be owned types (for example `String`, not `&str`), because the arguments are deserialized into an owned input struct",
            ),
            Type::ImplTrait(t) => {
                cx.error_spanned_by(t, "`#[tool]` parameters cannot be `impl Trait`: name a concrete type");
            }
            _ => {}
        }
        let field_attrs = pat_ty.attrs.iter().filter(|a| is_field_attr(a)).collect();
        out.push(Param::Arg { ident, ty: &pat_ty.ty, field_attrs });
    }
    out
}

/// `&ToolContext` (any path ending in `ToolContext`), detected syntactically.
fn is_context(ty: &Type) -> bool {
    let Type::Reference(r) = ty else { return false };
    if r.mutability.is_some() {
        return false;
    }
    matches!(&*r.elem, Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "ToolContext"))
}

/// `ToolContext` by value or `&mut ToolContext`: what is wrong with it, for the message.
/// (Without this, a by-value context is taken for a model-facing argument and reported as
/// "`ToolContext: Deserialize` is not satisfied" from inside serde.)
fn misused_context(ty: &Type) -> Option<&'static str> {
    let names_context = |ty: &Type| matches!(ty, Type::Path(p) if p.qself.is_none() && p.path.segments.last().is_some_and(|s| s.ident == "ToolContext"));
    match ty {
        Type::Path(_) if names_context(ty) => {
            Some("a tool borrows its context; `ToolContext` is not an argument the model sends")
        }
        Type::Reference(r) if r.mutability.is_some() && names_context(&r.elem) => {
            Some("a tool's context is shared, not exclusive")
        }
        _ => None,
    }
}

/// `Result<T, E>` or a one-argument `Result<T>` alias (by the last path segment), or `T`.
fn output_of(ret: Option<&Type>) -> Output<'_> {
    let Some(ty) = ret else { return Output::Unit };
    match last_segment_args(ty, "Result").as_deref() {
        Some([ok, err]) => return Output::Result { ok, err: Some(err), ret: ty },
        Some([ok]) => return Output::Result { ok, err: None, ret: ty },
        _ => {}
    }
    if matches!(ty, Type::Tuple(t) if t.elems.is_empty()) {
        return Output::Unit;
    }
    Output::Value(ty)
}

/// The type arguments of `ty` when its last path segment is `name`.
fn last_segment_args<'t>(ty: &'t Type, name: &str) -> Option<Vec<&'t Type>> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(AngleBracketedGenericArguments { args, .. }) = &last.arguments else {
        return None;
    };
    Some(
        args.iter()
            .filter_map(|a| match a {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
    )
}

/// For `-> impl Stream<Item = Yielded<P, R>> (+ ...)`, the `R`. Reports a `Stream` whose item is
/// not `Yielded<P, R>`.
fn explicit_stream_item<'t>(cx: &Ctxt, output: &'t ReturnType) -> Option<&'t Type> {
    let ReturnType::Type(_, ty) = output else { return None };
    let Type::ImplTrait(imp) = &**ty else { return None };
    for bound in &imp.bounds {
        let TypeParamBound::Trait(t) = bound else { continue };
        let Some(last) = t.path.segments.last() else { continue };
        if last.ident != "Stream" {
            continue;
        }
        let PathArguments::AngleBracketed(a) = &last.arguments else { continue };
        for arg in &a.args {
            if let GenericArgument::AssocType(assoc) = arg
                && assoc.ident == "Item"
            {
                if let Some([_, ret]) = last_segment_args(&assoc.ty, "Yielded").as_deref() {
                    return Some(ret);
                }
                cx.error_spanned_by(&assoc.ty, "a streaming tool's items must be `kuralle::Yielded<P, R>`");
                return None;
            }
        }
    }
    None
}

/// `get_weather` → `GetWeather`.
pub(crate) fn pascal_case(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    for part in snake.split('_').filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    if out.is_empty() { "Tool".to_owned() } else { out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    #[test]
    fn pascal() {
        assert_eq!(pascal_case("get_weather"), "GetWeather");
        assert_eq!(pascal_case("_private__tool"), "PrivateTool");
        assert_eq!(pascal_case("type"), "Type");
    }

    #[test]
    fn models_params_context_and_result() {
        let func: ItemFn = parse_quote! {
            /// Current weather.
            ///
            /// More.
            async fn get_weather(
                /// City.
                city: String,
                ctx: &kuralle::ToolContext,
                units: Option<Units>,
            ) -> Result<Weather, WeatherError> { todo!() }
        };
        let cx = Ctxt::new();
        let args = ToolArgs::default();
        let tool = ToolFn::from_syn(&cx, &args, &func);
        assert!(!cx.has_errors());
        assert_eq!(tool.name, "get_weather");
        assert_eq!(tool.struct_ident, "GetWeather");
        assert_eq!(tool.input_ident, "GetWeatherInput");
        assert_eq!(tool.description.as_deref(), Some("Current weather."));
        let names: Vec<_> = tool.args().map(|(i, _, _)| i.to_string()).collect();
        assert_eq!(names, ["city", "units"]);
        assert!(matches!(tool.params[1], Param::Context));
        assert!(matches!(tool.output, Output::Result { .. }));
        assert!(matches!(tool.kind, Kind::Async));
    }

    #[test]
    fn generator_and_explicit_stream() {
        let func: ItemFn = parse_quote! { async fn count(n: u32) -> u32 { yield 1u32; n } };
        let (cx, args) = (Ctxt::new(), ToolArgs::default());
        assert!(matches!(ToolFn::from_syn(&cx, &args, &func).kind, Kind::Generator { .. }));
        let func: ItemFn = parse_quote! {
            fn count(n: u32) -> impl futures::Stream<Item = kuralle::Yielded<u32, String>> + Send { todo!() }
        };
        let tool = ToolFn::from_syn(&cx, &args, &func);
        assert!(matches!(tool.kind, Kind::ExplicitStream));
        assert!(matches!(tool.output, Output::Value(_)));
        assert!(!cx.has_errors());
    }

    #[test]
    fn two_contexts_self_and_patterns_are_errors() {
        let func: ItemFn =
            parse_quote! { async fn f(&self, a: &ToolContext, b: &ToolContext, (x, y): (u8, u8)) -> u8 { x } };
        let (cx, args) = (Ctxt::new(), ToolArgs::default());
        let _ = ToolFn::from_syn(&cx, &args, &func);
        let errors = cx.into_compile_errors().to_string();
        assert!(errors.contains("cannot take `self`"));
        assert!(errors.contains("at most one `&ToolContext`"));
        assert!(errors.contains("plain names"));
    }

    #[test]
    fn one_argument_result_aliases_are_fallible() {
        let (cx, args) = (Ctxt::new(), ToolArgs::default());
        for func in [
            parse_quote! { async fn f() -> std::io::Result<String> { todo!() } },
            parse_quote! { async fn f() -> anyhow::Result<String> { todo!() } },
        ] {
            let func: ItemFn = func;
            let tool = ToolFn::from_syn(&cx, &args, &func);
            assert!(matches!(tool.output, Output::Result { err: None, .. }));
        }
        let func: ItemFn = parse_quote! { async fn f() -> Result<u8, E> { todo!() } };
        assert!(matches!(ToolFn::from_syn(&cx, &args, &func).output, Output::Result { err: Some(_), .. }));
        assert!(!cx.has_errors());
    }

    #[test]
    fn a_context_by_value_or_mut_says_take_a_reference() {
        let func: ItemFn = parse_quote! { async fn f(a: ToolContext, b: &mut kuralle::ToolContext) -> u8 { 1 } };
        let (cx, args) = (Ctxt::new(), ToolArgs::default());
        let tool = ToolFn::from_syn(&cx, &args, &func);
        assert_eq!(tool.args().count(), 0, "neither becomes a model-facing argument");
        let errors = cx.into_compile_errors().to_string();
        assert_eq!(errors.matches("take `&ToolContext`").count(), 2, "{errors}");
    }
}
