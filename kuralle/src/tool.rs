//! The `Tool` contract: what `#[tool]` implements and what the runtime dispatches.

use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::Duration,
};

use futures::stream::{self, BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ToolContext, ToolError, schema};

/// What a running tool call emits: progress values, then exactly one outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    /// A progress value (`yield` in a generator tool); shown live, never journaled.
    Progress(Value),
    /// The call's single outcome. Nothing follows it.
    Outcome(Result<Value, ToolError>),
}

/// The stream a tool call produces. See [`ToolEvent`].
pub type ToolStream = BoxStream<'static, ToolEvent>;

/// An item of a streaming tool's stream: a progress value, or the final return value.
///
/// A `#[tool]` fn that uses `yield` is rewritten to return
/// `impl Stream<Item = Yielded<P, R>>`, and a tool may return such a stream explicitly:
///
/// ```
/// use futures::{Stream, StreamExt};
/// use kuralle::Yielded;
///
/// fn count(to: u32) -> impl Stream<Item = Yielded<u32, String>> {
///     async_stream::stream! {
///         for i in 1..=to {
///             yield Yielded::Progress(i);
///         }
///         yield Yielded::Return(format!("counted to {to}"));
///     }
/// }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let items: Vec<_> = count(2).collect().await;
/// assert_eq!(items.last(), Some(&Yielded::Return("counted to 2".to_owned())));
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Yielded<P, R> {
    /// A progress value.
    Progress(P),
    /// The tool's return value; it ends the stream.
    Return(R),
}

/// A call whose arguments have been validated, ready to run.
///
/// Obtained from [`Tool::prepare`]; validation happened exactly once, there.
pub trait PreparedCall: Send {
    /// The idempotency key the tool derives from its validated input, if it overrides the
    /// journal's derived key (`#[tool(idempotency_key = ...)]`).
    fn idempotency_key(&self) -> Option<String> {
        None
    }

    /// Runs the call.
    fn execute(self: Box<Self>, ctx: ToolContext) -> ToolStream;
}

/// A tool the runtime can dispatch. `#[tool]` implements it; it is object-safe, so tools are
/// stored as `Arc<dyn Tool>`.
///
/// ```
/// use kuralle::{Tool, ToolContext, tool};
///
/// /// Echo back the provided text.
/// #[tool(parallel_safe)]
/// async fn echo(text: String) -> String {
///     text
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let tool: &dyn Tool = &Echo;
/// assert_eq!(tool.name(), "echo");
/// let out = tool.call(serde_json::json!({"text": "hi"}), ToolContext::detached()).await;
/// assert_eq!(out, Ok(serde_json::json!("hi")));
/// # });
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kuralle tool",
    note = "annotate an async fn with `#[kuralle::tool]` and list the generated PascalCase struct"
)]
pub trait Tool: Send + Sync + 'static {
    /// The model-facing name.
    fn name(&self) -> &str;

    /// The model-facing description.
    fn description(&self) -> &str;

    /// JSON Schema (2020-12) of the arguments; the root is always `type: object`.
    fn input_schema(&self) -> &Value;

    /// JSON Schema of the result, when the result type implements `JsonSchema`.
    fn output_schema(&self) -> Option<&Value> {
        None
    }

    /// Whether this call may run concurrently with sibling calls, judged on the **raw** model
    /// arguments before validation. The runtime treats a panic as `false`.
    fn parallel_safe(&self, raw_args: &Value) -> bool {
        let _ = raw_args;
        false
    }

    /// [`parallel_safe`](Tool::parallel_safe) from the model's raw argument text. The default
    /// parses the text (once per [`RawArgs`]) and asks `parallel_safe`; a tool whose answer does
    /// not depend on its arguments (`#[tool]` without `parallel_safe = expr`) answers without
    /// parsing. The runtime asks it only of calls whose text is a JSON object.
    fn parallel_safe_raw(&self, args: &RawArgs) -> bool {
        args.value(self.name()).is_ok_and(|v| self.parallel_safe(v))
    }

    /// Upper bound on one call's duration. When it passes, the call's
    /// [`ToolContext::cancellation`](crate::ToolContext::cancellation) token fires, the model
    /// gets [`ToolError::Timeout`], and a call that has not stopped 50 ms later is aborted.
    ///
    /// An abort takes effect at the call's next `.await`. Work that blocks its thread
    /// (`std::thread::sleep`, synchronous I/O, a long computation) belongs in
    /// `tokio::task::spawn_blocking`: a call stuck in it cannot be aborted, keeps its thread
    /// until it returns, and is reported with a `tracing` warning. The run does not wait for it:
    /// its result and the end of its event stream arrive on time either way.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether a caller interrupt cancels this call (a timeout always does).
    fn interruptible(&self) -> bool {
        true
    }

    /// Whether a finished call may be answered from the journal.
    fn replay(&self) -> bool {
        true
    }

    /// Whether a human must approve each call before it runs.
    fn needs_approval(&self) -> bool {
        false
    }

    /// Whether a call cut off by a crash must never be re-run.
    fn at_most_once(&self) -> bool {
        false
    }

    /// The implementing type's name, for error messages that must tell two tools apart (two
    /// tools with one name on an agent). Rarely worth overriding.
    fn type_name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }

    /// Validates raw arguments (exactly once) into a runnable call.
    ///
    /// # Errors
    /// [`ToolError::InvalidInput`] naming the field and the problem.
    fn prepare(&self, args: &Value) -> Result<Box<dyn PreparedCall>, ToolError>;

    /// [`prepare`](Tool::prepare) from the model's raw argument text, which is how the runtime
    /// validates a model's call. The default parses the text with [`parse_args`] (once per
    /// [`RawArgs`]) and calls `prepare`. `#[tool]` reads the text straight into its typed input
    /// when it can, and takes the default path (whose errors name the field) when it cannot.
    ///
    /// # Errors
    /// As [`prepare`](Tool::prepare) and [`parse_args`].
    fn prepare_raw(&self, args: &RawArgs) -> Result<Box<dyn PreparedCall>, ToolError> {
        self.prepare(args.value(self.name())?)
    }

    /// Validates `args` and runs the call: progress values, then one outcome.
    fn execute(&self, args: &Value, ctx: ToolContext) -> ToolStream {
        match self.prepare(args) {
            Ok(call) => call.execute(ctx),
            Err(e) => stream::once(async move { ToolEvent::Outcome(Err(e)) }).boxed(),
        }
    }

    /// Runs the call to its outcome, dropping progress.
    fn call(&self, args: Value, ctx: ToolContext) -> futures::future::BoxFuture<'static, Result<Value, ToolError>> {
        let mut s = self.execute(&args, ctx);
        let name = self.name().to_owned();
        Box::pin(async move {
            while let Some(ev) = s.next().await {
                if let ToolEvent::Outcome(out) = ev {
                    return out;
                }
            }
            Err(ToolError::InvalidOutput { tool: name, message: "the tool ended without a result".into() })
        })
    }
}

/// The model-facing description of one tool: schema only, never an executor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// What the tool does.
    pub description: String,
    /// JSON Schema 2020-12 of the arguments.
    pub input_schema: Value,
    /// JSON Schema of the result, when known.
    pub output_schema: Option<Value>,
}

impl ToolSpec {
    /// The spec of `tool`.
    pub fn of(tool: &dyn Tool) -> Self {
        Self {
            name: tool.name().to_owned(),
            description: tool.description().to_owned(),
            input_schema: tool.input_schema().clone(),
            output_schema: tool.output_schema().cloned(),
        }
    }
}

/// An ordered set of tools, and its model-facing export.
///
/// ```
/// use kuralle::{ToolSet, tool};
///
/// /// Echo back the provided text.
/// #[tool]
/// async fn echo(text: String) -> String { text }
///
/// let set = ToolSet::new().with(Echo);
/// assert_eq!(set.specs()[0].name, "echo");
/// let openai = set.to_openai().unwrap();
/// assert_eq!(openai[0]["function"]["strict"], true);
/// ```
#[derive(Clone, Default)]
pub struct ToolSet {
    tools: Vec<Arc<dyn Tool>>,
    /// Names added twice, with the type names of the replaced and the replacing tool.
    replaced: Vec<Replaced>,
}

/// A tool that replaced another of the same name in a [`ToolSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Replaced {
    pub(crate) name: String,
    pub(crate) first: &'static str,
    pub(crate) second: &'static str,
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.tools.iter().map(|t| t.name())).finish()
    }
}

impl ToolSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool. A later tool with the same name replaces the earlier one; an agent whose
    /// tools had such a replacement is refused by
    /// [`RuntimeBuilder::build`](crate::RuntimeBuilder::build) with
    /// [`RunError::DuplicateTool`](crate::RunError::DuplicateTool).
    #[must_use]
    pub fn with(mut self, tool: impl Tool) -> Self {
        self.push(Arc::new(tool));
        self
    }

    /// Adds a shared tool. A later tool with the same name replaces the earlier one (see
    /// [`ToolSet::with`]).
    pub fn push(&mut self, tool: Arc<dyn Tool>) {
        if let Some(slot) = self.tools.iter_mut().find(|t| t.name() == tool.name()) {
            self.replaced.push(Replaced {
                name: tool.name().to_owned(),
                first: slot.type_name(),
                second: tool.type_name(),
            });
            *slot = tool;
        } else {
            self.tools.push(tool);
        }
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// The tools, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.iter()
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The first name that was added twice, if any.
    pub(crate) fn first_replaced(&self) -> Option<&Replaced> {
        self.replaced.first()
    }

    /// Comma-separated names, for error messages.
    pub(crate) fn names(&self) -> String {
        self.tools.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    }

    /// The specs of every tool, in insertion order.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| ToolSpec::of(t.as_ref())).collect()
    }

    /// OpenAI `tools` entries, with the strict-mode transform.
    ///
    /// # Errors
    /// [`schema::StrictSchemaError`] naming the JSON path of what strict mode cannot express.
    pub fn to_openai(&self) -> Result<Vec<Value>, schema::StrictSchemaError> {
        self.to_openai_with(true)
    }

    /// OpenAI `tools` entries; `strict = false` sends the schemas as they are.
    ///
    /// # Errors
    /// See [`ToolSet::to_openai`].
    pub fn to_openai_with(&self, strict: bool) -> Result<Vec<Value>, schema::StrictSchemaError> {
        self.specs().iter().map(|s| schema::openai_function(s, strict)).collect()
    }
}

impl<T: Tool> From<T> for ToolSet {
    fn from(tool: T) -> Self {
        Self::new().with(tool)
    }
}

/// A model's raw argument text, parsed into a `Value` (by [`parse_args`]) only when something
/// asks for it, and then once.
///
/// ```
/// use kuralle::{RawArgs, Tool, ToolContext, tool};
///
/// /// Echo back the provided text.
/// #[tool]
/// async fn echo(text: String) -> String {
///     text
/// }
///
/// let args = RawArgs::new(r#"{"text": "hi"}"#);
/// assert!(Echo.prepare_raw(&args).is_ok());
/// assert_eq!(args.value("echo").unwrap()["text"], "hi");
/// assert!(Echo.prepare_raw(&RawArgs::new(r#"{"text": 1}"#)).is_err());
/// ```
#[derive(Debug, Default)]
pub struct RawArgs {
    source: Source,
}

/// Where a call's arguments came from.
#[derive(Debug)]
enum Source {
    /// A model's text, parsed into a `Value` the first time something asks for one.
    Text { text: String, parsed: OnceLock<Result<Value, ToolError>> },
    /// A `Value`, without text (a nested `ctx.tool` call's).
    Given(Value),
}

impl Default for Source {
    fn default() -> Self {
        Self::Text { text: String::new(), parsed: OnceLock::new() }
    }
}

impl RawArgs {
    /// Arguments from their raw text.
    pub fn new(text: impl Into<String>) -> Self {
        Self { source: Source::Text { text: text.into(), parsed: OnceLock::new() } }
    }

    /// Arguments already parsed (a nested call's), which have no text.
    pub(crate) fn from_value(value: Value) -> Self {
        Self { source: Source::Given(value) }
    }

    /// The arguments, when they were given as a `Value` rather than as text.
    pub(crate) fn given(&self) -> Option<&Value> {
        match &self.source {
            Source::Given(value) => Some(value),
            Source::Text { .. } => None,
        }
    }

    /// The raw text (empty for arguments given as a `Value`).
    pub fn text(&self) -> &str {
        match &self.source {
            Source::Text { text, .. } => text,
            Source::Given(_) => "",
        }
    }

    /// The raw text, taken back (empty for arguments given as a `Value`).
    pub(crate) fn into_text(self) -> String {
        match self.source {
            Source::Text { text, .. } => text,
            Source::Given(_) => String::new(),
        }
    }

    /// The arguments parsed by [`parse_args`] (errors name `tool`), parsed on the first call.
    ///
    /// # Errors
    /// As [`parse_args`].
    pub fn value(&self, tool: &str) -> Result<&Value, ToolError> {
        match &self.source {
            Source::Text { text, parsed } => {
                parsed.get_or_init(|| parse_args(tool, text)).as_ref().map_err(Clone::clone)
            }
            Source::Given(value) => Ok(value),
        }
    }
}

/// The largest raw argument text [`parse_args`] accepts: 1 MiB. Larger arguments are refused
/// with [`ToolError::InvalidInput`] before parsing, so a runaway model cannot make the runtime
/// parse (and journal) megabytes of arguments.
pub const MAX_TOOL_ARGS_BYTES: usize = 1 << 20;

/// Parses a model's raw argument text: empty text is `{}`, anything else must be a JSON object
/// of at most [`MAX_TOOL_ARGS_BYTES`], nested at most 128 deep.
///
/// # Errors
/// [`ToolError::InvalidInput`] saying what is wrong, in words a model can act on.
///
/// ```
/// use kuralle::{ToolError, parse_args};
/// assert_eq!(parse_args("echo", r#"{"text":"hi"}"#).unwrap()["text"], "hi");
/// assert!(matches!(parse_args("echo", "[1]"), Err(ToolError::InvalidInput { .. })));
/// assert!(matches!(parse_args("echo", "{\"text\":"), Err(ToolError::InvalidInput { .. })));
/// ```
pub fn parse_args(tool: &str, raw: &str) -> Result<Value, ToolError> {
    if raw.len() > MAX_TOOL_ARGS_BYTES {
        return Err(oversized(tool, raw.len(), MAX_TOOL_ARGS_BYTES));
    }
    if let Some((bytes, limit)) = oversized_marker_parts(raw) {
        return Err(oversized(tool, bytes, limit));
    }
    if raw.trim().is_empty() {
        return Ok(Value::Object(serde_json::Map::new()));
    }
    let value: Value = serde_json::from_str(raw)
        .map_err(|e| ToolError::invalid_input(tool, format!("the arguments are not valid JSON ({e})")))?;
    if !value.is_object() {
        return Err(ToolError::invalid_input(
            tool,
            format!("the arguments must be a JSON object, not {}", kind(&value)),
        ));
    }
    Ok(value)
}

fn oversized(tool: &str, bytes: usize, limit: usize) -> ToolError {
    ToolError::invalid_input(
        tool,
        format!(
            "the arguments are {bytes} bytes; the limit is {limit} bytes. Send smaller arguments (for example a reference instead of the content)"
        ),
    )
}

/// The key of the marker that stands in for arguments too large to keep.
const OVERSIZED_KEY: &str = "__kuralle_oversized_arguments";

/// What the runtime journals and sends back in place of arguments too large to keep: a small
/// JSON object that [`parse_args`] answers with the same [`ToolError::InvalidInput`] the
/// original arguments got, so a replayed run gives the model the same answer.
pub(crate) fn oversized_marker(bytes: usize, limit: usize) -> String {
    format!("{{\"{OVERSIZED_KEY}\":{{\"bytes\":{bytes},\"limit\":{limit}}}}}")
}

/// `(bytes, limit)` of an [`oversized_marker`].
pub(crate) fn oversized_marker_parts(raw: &str) -> Option<(usize, usize)> {
    if !raw.starts_with("{\"__kuralle_oversized") || raw.len() > 128 {
        return None;
    }
    let value: Value = serde_json::from_str(raw).ok()?;
    let marker = value.get(OVERSIZED_KEY)?;
    let number = |k: &str| marker.get(k)?.as_u64().and_then(|n| usize::try_from(n).ok());
    Some((number("bytes")?, number("limit")?))
}

/// "a string", "an array", ... for error messages.
pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::*;
    use crate::strategies::json_value;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Any text: a value exactly when it is blank or a JSON object, else a clear
        /// `InvalidInput` naming the tool; never a panic.
        #[test]
        fn any_text_parses_or_gets_a_clear_error(raw in "(?s).{0,64}") {
            match parse_args("t", &raw) {
                Ok(v) => {
                    prop_assert!(v.is_object());
                    prop_assert!(raw.trim().is_empty() || serde_json::from_str::<Value>(&raw).is_ok_and(|p| p == v));
                }
                Err(ToolError::InvalidInput { tool, message }) => {
                    prop_assert_eq!(tool, "t");
                    prop_assert!(!message.is_empty());
                    prop_assert!(!serde_json::from_str::<Value>(&raw).is_ok_and(|v| v.is_object()));
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }

        /// Every JSON object round-trips through its text (compact and pretty).
        #[test]
        fn json_objects_round_trip(entries in proptest::collection::vec(("(?s).{0,6}", json_value()), 0..6)) {
            let object = Value::Object(entries.into_iter().collect::<Map<_, _>>());
            prop_assert_eq!(parse_args("t", &object.to_string()).unwrap(), object.clone());
            prop_assert_eq!(parse_args("t", &serde_json::to_string_pretty(&object).unwrap()).unwrap(), object);
        }

        /// Hostile shapes: deep nesting, truncation at any point, a marker look-alike.
        #[test]
        fn hostile_shapes_never_panic(depth in 0usize..2000, cut in any::<prop::sample::Index>(), open in "[\\[{\"]") {
            let nested = format!("{{\"a\":{}{}", open.repeat(depth), "]".repeat(depth / 2));
            let _ = parse_args("t", &nested);
            let text = format!("{{\"__kuralle_oversized_arguments\":{{\"bytes\":{depth},\"limit\":1}}}}");
            let _ = parse_args("t", &text[..cut.index(text.len() + 1)]);
            prop_assert!(parse_args("t", &text).is_err());
        }
    }
}
