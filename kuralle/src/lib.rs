//! kuralle: annotate ordinary async fns with [`#[tool]`](tool), declare agents with
//! [`#[agent]`](agent), and run the model ↔ tool loop with a durable, append-only journal:
//! every effect is recorded once and replayed after a crash, a retry or a pause, so finished
//! work is never redone.
//!
//! This page walks through the library in the order you meet it. The [`tool`] and [`agent`]
//! pages document every attribute argument.
//!
//! # 1. Dependencies
//!
//! ```toml
//! [dependencies]
//! kuralle = "0.1"                                     # default features: sqlite, openai
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! futures = "0.3"                                     # StreamExt, to read a run's events
//! serde = { version = "1", features = ["derive"] }    # your param and result types
//! schemars = "1"                                      # JsonSchema, for your param types
//! serde_json = "1"                                    # tool arguments are JSON values
//! ```
//!
//! Tool params are deserialized from the model's JSON and described to it by a JSON Schema,
//! so your own param types derive `serde::Deserialize` and `schemars::JsonSchema`; results
//! derive `serde::Serialize`.
//!
//! # 2. Write a tool
//!
//! A tool is an async fn. Its doc comment is the description the model reads; each param is
//! a property of the input (param doc comments describe them; `Option` params are optional).
//! The macro adds a unit struct named in PascalCase that implements [`Tool`].
//!
//! ```
//! use kuralle::tool;
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! #[serde(rename_all = "lowercase")]
//! enum Units { Celsius, Fahrenheit }
//!
//! /// Current weather for a city.
//! #[tool(parallel_safe)]
//! async fn get_weather(
//!     /// City name, for example "Paris".
//!     city: String,
//!     units: Option<Units>,
//! ) -> String {
//!     let unit = match units { Some(Units::Fahrenheit) => "°F", _ => "°C" };
//!     format!("21{unit} in {city}")
//! }
//! # let _ = GetWeather;
//! ```
//!
//! # 3. Test it without a model
//!
//! The fn is still a fn. The generated struct runs the whole tool path — argument
//! validation, your fn, result serialization — from raw JSON, as the runtime does:
//!
//! ```
//! use kuralle::{Tool, ToolContext, ToolError, tool};
//!
//! /// Add two numbers.
//! #[tool]
//! async fn add(a: i64, b: i64) -> i64 { a + b }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! assert_eq!(add(2, 3).await, 5);
//! let out = Add.call(serde_json::json!({"a": 2, "b": 3}), ToolContext::detached()).await;
//! assert_eq!(out, Ok(serde_json::json!(5)));
//! // Bad arguments are a typed error for the model, not a panic.
//! let bad = Add.call(serde_json::json!({"a": "two"}), ToolContext::detached()).await;
//! assert!(matches!(bad, Err(ToolError::InvalidInput { .. })));
//! # });
//! ```
//!
//! # 4. Declare an agent
//!
//! An agent is a unit struct: its doc comment is the instructions, its attribute lists the
//! tools and limits.
//!
//! ```
//! # use kuralle::tool;
//! # /// Add two numbers.
//! # #[tool] async fn add(a: i64, b: i64) -> i64 { a + b }
//! use kuralle::agent;
//!
//! /// You do arithmetic. Use the add tool.
//! #[agent(id = "math", tools = [Add], max_steps = 4)]
//! struct Math;
//! ```
//!
//! # 5. Run it
//!
//! A [`Runtime`] holds agents, a default model and a store. `run` returns a [`RunHandle`]:
//! a stream of [`Event`]s, then `.await` it for the [`RunOutput`].
//! [`testing::ScriptedModel`] plays a scripted conversation, for tests and offline demos:
//!
//! ```
//! # use kuralle::{agent, tool};
//! # /// Add two numbers.
//! # #[tool] async fn add(a: i64, b: i64) -> i64 { a + b }
//! # /// You do arithmetic. Use the add tool.
//! # #[agent(id = "math", tools = [Add])] struct Math;
//! use futures::StreamExt;
//! use kuralle::{Event, RunStatus, Runtime, testing::{ScriptedModel, Turn}};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let model = ScriptedModel::new([
//!     Turn::tool_calls([("call_1", "add", r#"{"a":2,"b":3}"#)]),
//!     Turn::text("2 + 3 = 5"),
//! ]);
//! let runtime = Runtime::builder().agent(Math).model(model).build()?;
//! let mut handle = runtime.run("What is 2 + 3?");
//! while let Some(event) = handle.next().await {
//!     if let Event::ToolResult { name, result, .. } = &event {
//!         assert_eq!((name.as_str(), result), ("add", &serde_json::json!(5)));
//!     }
//! }
//! let output = handle.await?;
//! assert_eq!((output.text.as_str(), output.status), ("2 + 3 = 5", RunStatus::Finished));
//! # Ok::<(), kuralle::RunError>(())
//! # }).unwrap();
//! ```
//!
//! # 6. Use a real model
//!
//! [`models::OpenAi`] (feature `openai`, on by default) speaks the OpenAI-compatible
//! chat-completions API: OpenAI, Ollama, vLLM, llama.cpp server, LM Studio.
//!
//! ```no_run
//! # #[cfg(feature = "openai")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = kuralle::models::OpenAi::from_env("gpt-4o-mini")?; // OPENAI_API_KEY, OPENAI_BASE_URL
//! # let _ = model; Ok(())
//! # }
//! # #[cfg(not(feature = "openai"))] fn main() {}
//! ```
//!
//! # 7. Make it durable
//!
//! The default store is in memory. Give the runtime a [`stores::SqliteStore`] (feature
//! `sqlite`, on by default) and every tool call, model response, approval, `ctx.now()` and
//! `ctx.uuid()` is journaled before and after it happens. After a crash,
//! `runtime.resume(run_id)` replays the finished steps from the journal and runs only the
//! rest; a call cut off mid-execution runs again with the same
//! [`idempotency_key`](ToolContext::idempotency_key) (pass it to the APIs you call), unless
//! the tool is [`at_most_once`](tool#at_most_once).
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = kuralle::Runtime::builder()
//!     .store(kuralle::stores::SqliteStore::open("runs.db")?)
//!     .build()?;
//! let handle = runtime.resume("run-1"); // a run an earlier process left unfinished
//! # let _ = handle; Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))] fn main() {}
//! ```
//!
//! # 8. Ask a human first
//!
//! A [`needs_approval`](tool#needs_approval) tool pauses the run durably
//! ([`Event::Paused`], status [`RunStatus::Paused`]) until
//! `runtime.deliver(run_id, Decision::approve("alice"))` or [`Decision::deny`]; a paused run
//! survives a restart.
//!
//! # Where next
//!
//! - [`tool`] and [`agent`]: every argument, with examples and the code they write.
//! - [`progress!`]: stream progress from a long tool.
//! - [`ToolSet`]: export tool schemas (`to_openai()`, `specs()`) without running anything.
//! - [`RunStore`]: the journal contract, to write your own store.
//! - [`Event`]: what a run reports, serializable for your UI.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Lets doc tests and unit tests use the `::kuralle::` paths that the macros generate.
#[allow(unused_extern_crates)]
extern crate self as kuralle;

mod agent;
mod approval;
mod clock;
mod context;
mod dispatch;
mod error;
mod event;
pub mod export;
mod generator;
mod input;
pub mod inspect;
pub mod journal;
mod json;
mod keymap;
mod limits;
#[cfg(feature = "mcp")]
pub mod mcp;
mod model;
pub mod models;
mod output;
mod policy;
mod redact;
mod runtime;
pub mod schema;
mod store;
pub mod stores;
#[cfg(test)]
mod strategies;
pub mod testing;
mod tool;
mod trace;
pub mod transcript;
// Fuzz and bench hooks: not part of the documented API.
#[doc(hidden)]
pub mod truncate;

pub use agent::{Agent, AgentDef, DEFAULT_MAX_STEPS, DEFAULT_MAX_TOOL_CONCURRENCY, DEFAULT_MAX_TOOL_RESULT_TOKENS};
pub use approval::PendingApproval;
pub use context::ToolContext;
pub use error::{RunError, ToolError};
pub use event::{BatchCall, Event, RunOutput};
pub use input::text::{MAX_TOOL_ARGS_BYTES, RawArgs, parse_args};
pub use json::JsonText;
#[doc = include_str!("../docs/agent.md")]
pub use kuralle_macros::agent;
#[doc = include_str!("../docs/tool.md")]
pub use kuralle_macros::tool;
pub use limits::{Amount, Limit, Pricing, RunLimits};
pub use model::{
    FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, Origin, OutputMode, OutputSpec, Part,
    ToolCallRequest, ToolChoice, Usage,
};
// Inline, so that its page says what kuralle uses it for (smol_str's own docs follow).
#[doc(inline)]
pub use model::SmolStr;
pub use output::{AgentOutput, DEFAULT_OUTPUT_RETRIES, OUTPUT_TOOL_NAME, OutputError, check_schema};
pub use policy::{Policy, Verdict};
pub use redact::{REDACTED, Redaction, Redactions, Secret};
pub use runtime::{
    DEFAULT_EVENT_BUFFER, DEFAULT_LEASE_TTL, DEFAULT_MAX_JOURNAL_ENTRIES, DEFAULT_RECOVER_CONCURRENCY, Decision,
    ForkOptions, InterruptHandle, Recovered, RecoveredRun, ResumeRequest, RunHandle, RunRequest, Runtime,
    RuntimeBuilder, ServeReport, WorkerOptions, fork_run, record_decision, record_retry,
};
#[allow(deprecated)]
pub use runtime::{DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_STEPS_PER_RUN};
pub use store::{
    FinishedStep, FinishedWithIntents, InstanceLock, Lease, NewStep, RunFilter, RunRecord, RunStatus, RunStore,
    RunSummary, StepKind, StepOutcome, StepRecord, StepStatus, StoreError, StoreErrorMessage, StoreFuture,
};
pub use tool::{PreparedCall, Tool, ToolEvent, ToolSet, ToolSpec, ToolStream, Yielded};
pub use transcript::Transcript;

/// Emits a progress value from a streaming `#[tool]` fn: the value is sent at once as a
/// [`ToolEvent::Progress`] (never journaled), and the fn's return value stays the call's result.
///
/// This is DESIGN's `yield expr;`: rustc rejects `yield` on stable before any macro can rewrite
/// it, so a generator tool writes `progress!(expr);`. The progress type is inferred from the
/// values (all `progress!` points of one tool share it) and must be `Serialize + Send`.
///
/// ```
/// use futures::StreamExt;
/// use kuralle::{Tool, ToolContext, ToolEvent, progress, tool};
///
/// /// Count to `to`, reporting each step.
/// #[tool]
/// async fn count(to: u32) -> String {
///     for i in 1..=to {
///         progress!(i);
///     }
///     format!("counted to {to}")
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let events: Vec<_> = Count.execute(&serde_json::json!({"to": 2}), ToolContext::detached()).collect().await;
/// assert_eq!(events[0], ToolEvent::Progress(serde_json::json!(1)));
/// assert_eq!(events[2], ToolEvent::Outcome(Ok(serde_json::json!("counted to 2"))));
/// # });
/// ```
///
/// Outside the body of a `#[tool]` fn (or inside a closure or `async` block there) it is a
/// compile error.
#[macro_export]
macro_rules! progress {
    ($emit:ident, $value:expr) => {
        $emit.emit($value)
    };
    // What a progress point becomes when its tool has other errors: the value is still
    // type-checked, nothing is emitted, and the user's import stays used.
    (@discard $value:expr) => {{
        let _ = $value;
    }};
    ($($tokens:tt)*) => {
        ::core::compile_error!(
            "`progress!` only works directly in the body of a `#[tool]` fn (not in a closure or `async` block)"
        )
    };
}

// The README's examples, compiled and run as doc tests (not part of the docs).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

// docs/typed-output.md's example, run the same way.
#[cfg(doctest)]
#[doc = include_str!("../../docs/typed-output.md")]
struct TypedOutputDoctests;

// Not public API. Used by code that `#[tool]` and `#[agent]` generate; may change in any release.
#[doc(hidden)]
pub mod __private;
