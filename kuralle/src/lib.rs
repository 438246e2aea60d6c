//! kuralle: annotate ordinary async fns with [`#[tool]`](tool), declare agents with
//! [`#[agent]`](agent), and run the model ↔ tool loop with a durable, append-only journal.
//!
//! ```
//! use kuralle::{ToolSet, tool};
//!
//! /// Echo back the provided text.
//! #[tool(parallel_safe)]
//! async fn echo(
//!     /// The text to echo.
//!     text: String,
//! ) -> String {
//!     text
//! }
//!
//! let specs = ToolSet::new().with(Echo).specs();
//! assert_eq!(specs[0].description, "Echo back the provided text.");
//! assert_eq!(specs[0].input_schema["properties"]["text"]["description"], "The text to echo.");
//! ```

// Lets doc tests and unit tests use the `::kuralle::` paths that the macros generate.
#[allow(unused_extern_crates)]
extern crate self as kuralle;

mod agent;
mod context;
mod dispatch;
mod error;
mod generator;
mod input;
pub mod journal;
#[cfg(feature = "mcp")]
pub mod mcp;
mod model;
pub mod models;
mod runtime;
pub mod schema;
mod store;
pub mod stores;
pub mod testing;
mod tool;
pub mod transcript;
pub mod truncate;

pub use agent::{Agent, AgentDef, DEFAULT_MAX_STEPS, DEFAULT_MAX_TOOL_CONCURRENCY, DEFAULT_MAX_TOOL_RESULT_TOKENS};
pub use context::ToolContext;
pub use error::{RunError, ToolError};
pub use kuralle_macros::{agent, tool};
pub use model::{FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, ToolCallRequest, Usage};
pub use runtime::{
    DEFAULT_LEASE_TTL, DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_STEPS_PER_RUN, Decision, InterruptHandle, RunHandle,
    RunRequest, Runtime, RuntimeBuilder, ServeReport, WorkerOptions,
    event::{BatchCall, Event, PendingApproval, RunOutput},
    record_decision,
};
pub use store::{
    Lease, NewStep, RunFilter, RunRecord, RunStatus, RunStore, RunSummary, StepKind, StepOutcome, StepRecord,
    StepStatus, StoreError, StoreFuture,
};
pub use tool::{
    MAX_TOOL_ARGS_BYTES, PreparedCall, Tool, ToolEvent, ToolSet, ToolSpec, ToolStream, Yielded, parse_args,
};
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
    ($($tokens:tt)*) => {
        ::core::compile_error!(
            "`progress!` only works directly in the body of a `#[tool]` fn (not in a closure or `async` block)"
        )
    };
}

// Not public API. Used by code that `#[tool]` and `#[agent]` generate; may change in any release.
#[doc(hidden)]
pub mod __private;
