//! The `Tool` contract: what `#[tool]` implements and what the runtime dispatches.

use std::{fmt, sync::Arc, time::Duration};

use futures::stream::{self, BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{context::ToolContext, error::ToolError, input::text::RawArgs, schema};

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
    /// journal's derived key (`#[tool(idempotency_key = ...)]`). Calls with one key are one
    /// effect: a later call replays the first one's result, and calls of one parallel batch
    /// that share it run once (after one approval) and each get its result.
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

    /// Which arguments and whether the result are sensitive: hidden in events, the CLI, the
    /// console and exports (the journal keeps them). `#[tool]` answers from the parameter and
    /// result types ([`Secret<T>`](crate::Secret)); see [`Redaction`](crate::Redaction).
    fn redaction(&self) -> crate::Redaction {
        crate::Redaction::default()
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
    /// validates a model's call. The default parses the text with [`parse_args`](crate::parse_args) (once per
    /// [`RawArgs`]) and calls `prepare`. `#[tool]` reads the text straight into its typed input
    /// when it can, and takes the default path (whose errors name the field) when it cannot.
    ///
    /// # Errors
    /// As [`prepare`](Tool::prepare) and [`parse_args`](crate::parse_args).
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
