//! Tool dispatch: one model response's calls, in batches of consecutive parallel-safe calls
//! with barriers between them, bounded concurrency, timeouts, interrupts, journaling, and
//! results in source order whatever the completion order.
//!
//! One phase per file: [`plan`] decides how each call is answered (validation, keys, policy,
//! approvals, replay) without running anything; [`batch`] runs one batch with bounded
//! concurrency and puts its results back in source order; [`call`] runs one call to its
//! journaled outcome under its timeout and the turn's interrupt. Nested `ctx.tool/now/uuid`
//! effects are journaled in [`effects`], dispatch's implementation of the context's `Effects`.

mod batch;
mod call;
mod effects;
mod plan;
mod stragglers;

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use smol_str::SmolStr;
use tokio_util::sync::CancellationToken;

pub(crate) use stragglers::Stragglers;

use crate::{
    approval::Pending,
    error::{RunError, ToolError},
    event::{Event, EventSender},
    journal::Journal,
    limits::Budget,
    model::ToolCallRequest,
    policy::Policy,
    tool::ToolSet,
};

/// Everything dispatch needs from the turn it runs in.
pub(crate) struct TurnCtx {
    pub(crate) journal: Journal,
    /// The agent's tools, shared by its turns (a copy was a vector and an increment of every
    /// tool's count, each turn).
    pub(crate) tools: Arc<ToolSet>,
    pub(crate) events: EventSender,
    pub(crate) interrupt: CancellationToken,
    pub(crate) max_concurrency: usize,
    pub(crate) max_result_bytes: usize,
    /// The agent's approval policy, checked in [`plan`] before anything else can answer a call;
    /// shared by its turns, as the tools are.
    pub(crate) policy: Arc<Policy>,
    /// A store failure inside a nested effect: it ends the run after the current batch.
    /// Boxed: a run error is about a hundred bytes, and a turn's context lives as long as it.
    pub(crate) fatal: Mutex<Option<Box<RunError>>>,
    /// Calls cut off (timed out or interrupted) that have not ended yet: the lease is given
    /// up only once they have.
    pub(crate) stragglers: Arc<Stragglers>,
    /// Whether tool arguments and results go on the `execute_tool` spans.
    pub(crate) capture_content: bool,
    /// The tools' secrets, hidden from captured content (empty when capture is off: nothing
    /// is captured, and the hot path computes nothing).
    pub(crate) redact: crate::Redactions,
    /// The run's limits: a batch that would pass one runs none of its calls.
    pub(crate) budget: Budget,
}

impl TurnCtx {
    pub(crate) async fn emit(&self, event: Event) {
        self.events.send(event).await;
    }

    pub(crate) fn set_fatal(&self, e: RunError) {
        self.fatal.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(|| Box::new(e));
    }

    pub(crate) fn take_fatal(&self) -> Option<RunError> {
        self.fatal.lock().unwrap_or_else(PoisonError::into_inner).take().map(|e| *e)
    }
}

/// A tool call's outcome as dispatch reports it.
#[derive(Debug, Clone)]
pub(crate) struct CallOutcome {
    pub(crate) call_id: SmolStr,
    pub(crate) name: SmolStr,
    /// The call's raw argument text, given back (not copied) so the run can put the call in
    /// the transcript without having cloned every request before dispatch.
    pub(crate) arguments: String,
    pub(crate) result: Result<Value, ToolError>,
    pub(crate) replayed: bool,
}

impl CallOutcome {
    /// The value the model receives: the result, or an error object.
    pub(crate) fn model_value(&self) -> Value {
        match &self.result {
            Ok(v) => v.clone(),
            Err(e) => error_value(e),
        }
    }
}

/// The value the model receives for `result`: the value, or an error object.
pub(crate) fn into_model_value(result: Result<Value, ToolError>) -> Value {
    match result {
        Ok(v) => v,
        Err(e) => error_value(&e),
    }
}

/// Deniers that are not people (a policy, the runtime itself): the model is told which.
const MACHINE_DECIDERS: [&str; 3] = ["policy", "runtime", "kuralle"];

/// What the model is told denied a call when a person did.
const HUMAN_DECIDER: &str = "human";

/// What the model receives for a failed call.
pub(crate) fn error_value(e: &ToolError) -> Value {
    match e {
        ToolError::Denied { tool, by, reason } => {
            // The model learns that a person declined, never who: a name is for the audit
            // trail, and in front of the model it is one more thing to argue with or leak.
            let by = if MACHINE_DECIDERS.contains(&by.as_str()) { by.as_str() } else { HUMAN_DECIDER };
            let who = if by == HUMAN_DECIDER { "a human reviewer" } else { by };
            json!({
                "__denied": true,
                "toolName": tool,
                "deniedBy": by,
                "message": format!(
                    "The \"{tool}\" action was not approved by {who}.{} Tell the user it was declined; do not retry it.",
                    reason.as_deref().map(|r| format!(" Reason: {r}.")).unwrap_or_default()
                ),
            })
        }
        other => {
            let kind = serde_json::to_value(other).ok().and_then(|v| v.get("kind").cloned()).unwrap_or(Value::Null);
            json!({"error": true, "kind": kind, "message": other.to_string()})
        }
    }
}

/// Runs one model response's calls; returns their outcomes in source order. Callsites
/// `first_callsite..first_callsite + calls.len()` belong to these calls, in source order.
///
/// Not an `async fn`: the calls are planned when it is called (the caller awaits it at once),
/// so its future keeps only the planned calls, and not its arguments twice as an async fn's
/// does. Every run of a wave of answers holds it while its intents commit, inside the turn's
/// boxed answer, which this keeps within glibc's per-thread cache.
pub(crate) fn dispatch<'a>(
    turn: &'a Arc<TurnCtx>,
    calls: Vec<ToolCallRequest>,
    first_callsite: u64,
) -> impl Future<Output = Result<Dispatched, RunError>> + Send + 'a {
    let mut rest = plan::parse(turn, calls, first_callsite).into_iter();
    async move {
        let total = rest.len();
        let mut done = Dispatched::default();
        while rest.len() > 0 {
            // A planned call is a few hundred bytes, so a batch is cut with its size known instead
            // of grown call by call; the last one (every call, when they share one batch) is
            // collected from the whole remaining iterator, which keeps the planned calls' buffer.
            let size = batch_len(rest.as_slice());
            let calls: Vec<plan::Planned> = if size == rest.len() {
                std::mem::take(&mut rest).collect()
            } else {
                rest.by_ref().take(size).collect()
            };
            let (outcomes, pending) = batch::run(turn, calls).await?;
            // Outcomes are moved once: the first batch's are the answer (all of it, for a lone
            // batch), later ones join them in a buffer sized once for every call.
            if done.outcomes.capacity() == 0 {
                done.outcomes = outcomes;
            } else {
                done.outcomes.reserve(total - done.outcomes.len());
                done.outcomes.extend(outcomes);
            }
            if let Some(e) = turn.take_fatal() {
                return Err(e);
            }
            if !pending.is_empty() {
                // Later calls may depend on the pending one: nothing after it runs until the
                // decision arrives and the turn resumes.
                done.pending = pending;
                break;
            }
        }
        Ok(done)
    }
}

/// How many calls the next batch takes: a parallel-safe call joins the parallel-safe calls
/// right after it; any other call is a batch of its own.
fn batch_len(planned: &[plan::Planned]) -> usize {
    match planned.first() {
        Some(first) if first.head.parallel => planned.iter().take_while(|p| p.head.parallel).count(),
        _ => 1,
    }
}

/// What one model response's calls came to.
#[derive(Default)]
pub(crate) struct Dispatched {
    /// Outcomes of the calls that were answered, in source order.
    pub(crate) outcomes: Vec<CallOutcome>,
    /// Calls waiting for a human decision; non-empty means the run pauses.
    pub(crate) pending: Vec<Pending>,
}

/// Records a journal failure as fatal for the turn and describes it to the call.
pub(crate) fn journal_failure(turn: &TurnCtx, name: &str, doing: &str, e: RunError) -> ToolError {
    let message = format!("the journal could not {doing}: {e}");
    turn.set_fatal(e);
    ToolError::failed(name, message)
}

/// Runs one call outside any agent run (an MCP `tools/call`) through the same path as a
/// model's call: argument parsing and validation before execute, the tool's timeout,
/// `interrupt` (honoured unless the tool is not interruptible), panic containment, the
/// result-size cap, approval guards, and journaled nested effects (`ctx.tool/now/uuid`) on a
/// throwaway in-memory journal of its own. Progress values arrive on `events` as
/// [`Event::ToolProgress`]. `run_id` names the throwaway run (the call's `ctx.run_id()`).
#[cfg(feature = "mcp")]
pub(crate) async fn call_standalone(
    tools: &ToolSet,
    policy: &Policy,
    run_id: &str,
    call: ToolCallRequest,
    interrupt: CancellationToken,
    events: EventSender,
) -> Result<Value, ToolError> {
    let name = call.name.clone();
    let journal = Journal::standalone(run_id)
        .await
        .map_err(|e| ToolError::failed(name.as_str(), format!("the call journal could not open: {e}")))?;
    let turn = Arc::new(TurnCtx {
        journal,
        tools: Arc::new(tools.clone()),
        events,
        interrupt,
        max_concurrency: 1,
        max_result_bytes: crate::stores::DEFAULT_MAX_VALUE_BYTES,
        // The same policy as the agent's model calls: no path to a tool skips it.
        policy: Arc::new(policy.clone()),
        fatal: Mutex::new(None),
        // No lease to outlive: a call cut off here is answered at once, as in a run.
        stragglers: Arc::default(),
        capture_content: crate::trace::capture_content_from_env(),
        redact: crate::Redactions::default(),
        budget: Budget::none(),
    });
    let done = dispatch(&turn, vec![call], 0)
        .await
        .map_err(|e| ToolError::failed(name.as_str(), format!("the call journal failed: {e}")))?;
    if let Some(outcome) = done.outcomes.into_iter().next() {
        return outcome.result;
    }
    Err(ToolError::Denied {
        tool: name.into(),
        by: "kuralle".to_owned(),
        reason: Some("this tool needs a human's approval, which a standalone call cannot collect".to_owned()),
    })
}
