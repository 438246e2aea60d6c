//! Everything generated code touches, and nothing else. Not public API.

pub use core::{
    future::Future,
    marker::{Send, Sync},
    option::Option,
    pin::Pin,
    result::Result,
    time::Duration,
};
pub use std::{boxed::Box, string::String, sync::OnceLock, vec::Vec};

pub use futures::{self, Stream};
pub use schemars::{self, JsonSchema};
pub use serde::{self, Deserialize, Serialize};
// `RawValue` is not named by generated code. Without this re-export, the missing-`Deserialize`
// error lists `&RawValue` among the other implementors by a schemars-private path.
pub use serde_json::{self, Value, value::RawValue};
pub use serde_path_to_error;

pub use crate::generator::{Emit, Emitter, Generator, Slot, emitter, forward, outcome_stream, returning, tool_stream};
pub use crate::input::{
    ArgTable, RawArg, arg as parse_arg, match_args, match_raw_args, parse_input, raw_arg as parse_raw_arg,
};
pub use crate::{
    OutputMode,
    agent::{Agent, AgentDef},
    context::ToolContext,
    error::ToolError,
    input::text::RawArgs,
    redact::Redaction,
    tool::{PreparedCall, Tool, ToolEvent, ToolSet, ToolStream, Yielded},
};
pub use schemars::{Schema, SchemaGenerator};

use serde::de::DeserializeOwned;
use std::{
    fmt::Display,
    marker::PhantomData,
    panic::{AssertUnwindSafe, catch_unwind},
};

/// The model-facing name of a `#[tool]`, as a constant, so `#[agent]` can reject two tools with
/// the same name at compile time.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kuralle tool",
    note = "annotate an async fn with `#[kuralle::tool]` and list the generated PascalCase struct"
)]
pub trait ToolName {
    /// The tool's name.
    const NAME: &'static str;
}

/// `a == b`, usable in constants.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Evaluates a `parallel_safe = expr` predicate; a panic means "not parallel-safe".
pub fn parallel_safe<F: Fn(&Value) -> bool>(predicate: &F, raw_args: &Value) -> bool {
    catch_unwind(AssertUnwindSafe(|| predicate(raw_args))).unwrap_or(false)
}

/// Evaluates an `idempotency_key = expr` function on the validated input.
pub fn idempotency_key<I, F: Fn(&I) -> String>(key: &F, input: &I) -> String {
    key(input)
}

/// Checks an `on_error = path` recovery function's type, on the user's path.
pub fn on_error<T, E, I>(recover: fn(E, &I) -> Result<T, E>) -> fn(E, &I) -> Result<T, E> {
    recover
}

/// A `#[tool]` result type: `Serialize`. Its own trait so a missing derive is reported with
/// a message about tools, on the return type (rustc shows the root bound's message).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool's result: it does not implement `serde::Serialize`",
    label = "the tool returns this",
    note = "add `#[derive(serde::Serialize)]` to `{Self}` (and `schemars::JsonSchema` to publish an output schema)"
)]
pub trait ToolOutput: Serialize {}

impl<T: Serialize + ?Sized> ToolOutput for T {}

/// A `#[tool]` error type: `Display` (every `std::error::Error` is).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a tool's error: it does not implement `std::fmt::Display`",
    label = "the tool fails with this",
    note = "the model is shown the error's `Display` text: implement `Display` for `{Self}` (thiserror's `#[error(...)]` does)"
)]
pub trait ToolErrorType: Display {}

impl<E: Display + ?Sized> ToolErrorType for E {}

/// A `#[tool]` parameter type that can be deserialized from the model's arguments.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[tool]` parameter: it does not implement `serde::Deserialize`",
    label = "the model's arguments are deserialized into this",
    note = "add `#[derive(serde::Deserialize)]` to `{Self}`"
)]
pub trait ToolParam: DeserializeOwned {}

impl<T: DeserializeOwned> ToolParam for T {}

/// A `#[tool]` parameter type with a JSON Schema, which the model is shown.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[tool]` parameter: it does not implement `schemars::JsonSchema`",
    label = "the model is shown this parameter's JSON Schema",
    note = "add `#[derive(schemars::JsonSchema)]` to `{Self}` (with `schemars = \"1\"` in your `[dependencies]`)"
)]
pub trait ToolParamSchema: JsonSchema {}

impl<T: JsonSchema> ToolParamSchema for T {}

/// Compile-time check of a param type, emitted spanned on the type (axum's check fns), for
/// tools whose input struct derives `Deserialize`.
pub const fn param_is_deserialize<T: ToolParam>() {}

/// Argument `name` of a tool, from its value in the arguments object (see [`ArgTable`]), or
/// from the text of its value in the raw arguments (see [`match_raw_args`]). Emitted spanned on
/// the param's type, so a type without `Deserialize` is reported there, once for both paths.
///
/// # Errors
/// From a `Value`: [`ToolError::InvalidInput`] naming the field. From text: `None` when the
/// text is not one, and the caller takes the `Value` path.
#[inline]
pub fn arg<T: ToolParam, S: ArgSlot>(tool: &str, name: &'static str, value: S) -> S::Out<T> {
    value.parse::<T>(tool, name)
}

/// Where an argument's value comes from: a `Value` in the arguments object, or its text.
pub trait ArgSlot {
    /// What parsing yields: a result with the error, or an option.
    type Out<T>;
    /// Argument `T` from this value.
    fn parse<T: DeserializeOwned>(self, tool: &str, name: &'static str) -> Self::Out<T>;
}

impl ArgSlot for Option<&Value> {
    type Out<T> = Result<T, ToolError>;

    fn parse<T: DeserializeOwned>(self, tool: &str, name: &'static str) -> Result<T, ToolError> {
        parse_arg(tool, name, self)
    }
}

impl ArgSlot for Option<RawArg<'_>> {
    type Out<T> = Option<T>;

    fn parse<T: DeserializeOwned>(self, _: &str, _: &'static str) -> Option<T> {
        parse_raw_arg(self)
    }
}

/// An argument's schema and whether it may be left out (an `Option`), for an [`ArgTable`].
/// Emitted spanned on the param's type, so a type without `JsonSchema` is reported there.
pub fn arg_schema<T: ToolParamSchema>(generator: &mut SchemaGenerator) -> (Schema, bool) {
    // What schemars' derive asks of a field type under the deserialize contract.
    (generator.subschema_for::<T>(), T::_schemars_private_is_option())
}

/// The input schema of a tool described by `table`, computed once into `cell`.
pub fn args_schema(cell: &'static OnceLock<Value>, table: &'static ArgTable) -> &'static Value {
    cell.get_or_init(|| crate::schema::args_schema(table))
}

/// The outcome of a call that returned `value`.
pub fn ok_outcome<T: ToolOutput + ?Sized>(tool: &str, value: &T) -> ToolEvent {
    ToolEvent::Outcome(serde_json::to_value(value).map_err(|e| ToolError::InvalidOutput {
        tool: tool.to_owned(),
        message: format!("the result could not be serialized: {e}"),
    }))
}

/// The outcome of a call that returned `Err(error)`.
pub fn err_outcome<E: ToolErrorType + ?Sized>(tool: &str, error: &E) -> ToolEvent {
    ToolEvent::Outcome(Err(ToolError::failed(tool, error.to_string())))
}

/// The outcome of a call that failed before producing a value.
pub fn error_event(error: ToolError) -> ToolEvent {
    ToolEvent::Outcome(Err(error))
}

/// Whether the call was cancelled (timeout or interrupt); `on_error` is skipped then.
pub fn is_cancelled(ctx: &ToolContext) -> bool {
    ctx.is_cancelled()
}

/// Compile-time check that an `#[agent]` tools entry is a tool (spanned on its path). Returns
/// a concrete `Arc<dyn Tool>`, so a non-tool is reported once, here, and nothing after it
/// (an opaque `impl Tool` was checked again where it was used).
pub fn assert_tool<T: Tool>(tool: T) -> std::sync::Arc<dyn Tool> {
    std::sync::Arc::new(tool)
}

/// A type an `#[agent(output = T)]` can name: `DeserializeOwned + JsonSchema`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an agent's typed output",
    note = "derive `serde::Deserialize` and `schemars::JsonSchema` for it"
)]
pub trait OutputType {
    /// The output as an agent carries it.
    fn agent_output() -> crate::AgentOutput;
}

impl<T: serde::de::DeserializeOwned + JsonSchema + 'static> OutputType for T {
    fn agent_output() -> crate::AgentOutput {
        crate::AgentOutput::of::<T>()
    }
}

/// `#[agent(output = T)]`: the agent answers with a `T` (spanned on `T`).
pub fn typed_output<T: OutputType>(mut agent: AgentDef) -> AgentDef {
    agent.output = Some(T::agent_output());
    agent
}

/// A `Box<dyn PreparedCall>` from a generated call.
pub fn boxed_call<C: PreparedCall + 'static>(call: C) -> Box<dyn PreparedCall> {
    Box::new(call)
}

/// The input struct of a tool, as a probe: autoref-based method resolution picks
/// [`ValidInput`] (on `&InputOf<T>`) when the input struct's derives hold, and falls back to
/// [`InvalidInput`] (on `InputOf<T>`) when a param type lacks `Deserialize` or `JsonSchema`.
/// The fallback never runs: the crate does not compile then, and the error is the spanned
/// param check, not a second one here.
pub struct InputOf<T>(PhantomData<fn() -> T>);

impl<T> InputOf<T> {
    /// The probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for InputOf<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The input probe's preferred arm.
pub trait ValidInput<T> {
    /// [`parse_input`] for `T`.
    ///
    /// # Errors
    /// [`ToolError::InvalidInput`].
    fn parse(&self, tool: &str, args: &Value) -> Result<T, ToolError>;
    /// The input schema of `T`, computed once into `cell`.
    fn schema(&self, cell: &'static OnceLock<Value>) -> &'static Value;
}

impl<T: DeserializeOwned + JsonSchema> ValidInput<T> for &InputOf<T> {
    fn parse(&self, tool: &str, args: &Value) -> Result<T, ToolError> {
        parse_input::<T>(tool, args)
    }

    fn schema(&self, cell: &'static OnceLock<Value>) -> &'static Value {
        // Only the fn pointer is per tool: `OnceLock::get_or_init` instantiated for each tool's
        // fn item cost as much build time as the schema code itself.
        schema_once(cell, crate::schema::input_schema::<T>)
    }
}

/// The input probe's fallback arm (see [`InputOf`]).
pub trait InvalidInput<T> {
    /// Never called in a crate that compiles.
    ///
    /// # Errors
    /// Always.
    fn parse(&self, tool: &str, args: &Value) -> Result<T, ToolError>;
    /// Never called in a crate that compiles.
    fn schema(&self, cell: &'static OnceLock<Value>) -> &'static Value;
}

impl<T> InvalidInput<T> for InputOf<T> {
    fn parse(&self, tool: &str, _: &Value) -> Result<T, ToolError> {
        Err(ToolError::invalid_input(tool, "the input type does not implement `Deserialize` and `JsonSchema`"))
    }

    fn schema(&self, _: &'static OnceLock<Value>) -> &'static Value {
        fallback_schema()
    }
}

fn schema_once(cell: &'static OnceLock<Value>, make: fn() -> Value) -> &'static Value {
    cell.get_or_init(make)
}

/// `Some(schema)` when `T: JsonSchema`, else `None`, without specialization: autoref-based
/// method resolution picks [`HasOutputSchema`] (implemented on `&MaybeSchema<T>`) when the
/// bound holds, and falls back to [`NoOutputSchema`] (on `MaybeSchema<T>`) otherwise. Works
/// because the expansion names the concrete result type.
pub struct MaybeSchema<T: ?Sized>(PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> MaybeSchema<T> {
    /// The probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T: ?Sized> Default for MaybeSchema<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The output-schema probe's preferred arm: `T: JsonSchema`.
pub trait HasOutputSchema {
    /// The output schema.
    fn output_schema(&self) -> Option<Value>;
}

impl<T: JsonSchema> HasOutputSchema for &MaybeSchema<T> {
    fn output_schema(&self) -> Option<Value> {
        Some(crate::schema::output_schema::<T>())
    }
}

/// The output-schema probe's fallback arm: no schema.
pub trait NoOutputSchema {
    /// No output schema.
    fn output_schema(&self) -> Option<Value>;
}

impl<T: ?Sized> NoOutputSchema for MaybeSchema<T> {
    fn output_schema(&self) -> Option<Value> {
        None
    }
}

/// Whether `T` is [`Secret<_>`](crate::Secret) or `Option<Secret<_>>`, by the same autoref
/// probe as [`MaybeSchema`]: [`IsSecret`] is implemented on `&SecretProbe<Secret<T>>`, and
/// [`NotSecret`] on every `SecretProbe<T>` as the fallback.
pub struct SecretProbe<T: ?Sized>(PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> SecretProbe<T> {
    /// The probe for `T`.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T: ?Sized> Default for SecretProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The secret probe's preferred arm.
pub trait IsSecret {
    /// `true`.
    fn is_secret(&self) -> bool;
}

impl<T> IsSecret for &SecretProbe<crate::Secret<T>> {
    fn is_secret(&self) -> bool {
        true
    }
}

impl<T> IsSecret for &SecretProbe<Option<crate::Secret<T>>> {
    fn is_secret(&self) -> bool {
        true
    }
}

/// The secret probe's fallback arm.
pub trait NotSecret {
    /// `false`.
    fn is_secret(&self) -> bool;
}

impl<T: ?Sized> NotSecret for SecretProbe<T> {
    fn is_secret(&self) -> bool {
        false
    }
}

/// A tool's [`Redaction`](crate::Redaction) from its arguments' secrecy, in table order.
pub fn redaction(names: &[&str], secret: &[bool], result: bool) -> crate::Redaction {
    let args = names.iter().zip(secret).filter(|(_, s)| **s).map(|(n, _)| *n);
    crate::Redaction::new(args, result)
}

/// The output schema of a tool, computed once into `cell`.
pub fn output_schema(cell: &'static OnceLock<Option<Value>>, make: fn() -> Option<Value>) -> Option<&'static Value> {
    cell.get_or_init(make).as_ref()
}

/// A schema for tools whose expansion failed; never reached at run time (the crate does not
/// compile), it only keeps later uses of the tool from cascading into more errors.
pub fn fallback_schema() -> &'static Value {
    static NULL: Value = Value::Null;
    &NULL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn str_eq_compares_bytes() {
        const { assert!(str_eq("echo", "echo")) };
        assert!(!str_eq("echo", "echo2"));
        assert!(!str_eq("echo", "ech0"));
    }

    #[test]
    #[allow(clippy::needless_borrow)] // the double borrow is the probe
    fn output_schema_probe_picks_the_right_arm() {
        struct Opaque;
        assert!((&&MaybeSchema::<String>::new()).output_schema().is_some());
        assert!((&&MaybeSchema::<Opaque>::new()).output_schema().is_none());
    }
}
