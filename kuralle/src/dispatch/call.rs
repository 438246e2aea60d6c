//! One call run to its outcome: under its timeout and the turn's interrupt, panics
//! contained, the result-size cap applied, and the outcome journaled.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{
    TurnCtx,
    effects::Scope,
    journal_failure,
    plan::Ready,
    stragglers::{CallTask, Outcome},
};
use crate::{
    context::ToolContext,
    error::ToolError,
    event::Event,
    json::JsonText,
    store::StepOutcome,
    tool::{PreparedCall, Tool, ToolEvent},
};

/// How long a timed-out or interrupted call may take to notice its token before it is dropped.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_millis(50);

/// Runs a ready call and journals its outcome. A journal failure is recorded as fatal for the
/// turn (the run stops after the batch, resumable) and reported to the call as a failure.
///
/// Not an `async fn`, whose future keeps its arguments twice (see `runtime/turn.rs`, `turn`);
/// the ready call's fields are used where they were passed. A lone call's future is boxed while
/// it runs (`batch.rs`), where at a kilobyte or less glibc usually serves it from its
/// per-thread cache.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(crate) fn execute_journaled<'a>(
    turn: &'a Arc<TurnCtx>,
    ready: Ready,
    site: CallSite<'a>,
) -> impl Future<Output = Result<Value, ToolError>> + Send + 'a {
    async move {
        let result = execute(turn, &ready.tool, ready.call, &ready.key, site).await;
        let outcome = match &result {
            // Serialized once, straight into the text the store keeps (no copy of the tree).
            Ok(v) => Some(StepOutcome::Finished(JsonText::from(v))),
            // A cancellation is not an outcome of the call, only of this attempt: the step
            // stays `running` so a resumed run tries again.
            Err(e) if !e.is_final() => None,
            Err(e) => Some(StepOutcome::Failed(JsonText::serialize_from(e).unwrap_or_default())),
        };
        if let (Some(outcome), Some(ordinal)) = (outcome, ready.ordinal)
            && let Err(e) = turn.journal.finish(&ready.key, ordinal, outcome, ready.reused).await
        {
            return Err(journal_failure(turn, ready.tool.name(), "record the outcome", e));
        }
        result
    }
}

/// Journals and returns the `Indeterminate` outcome of an `at_most_once` call cut off earlier,
/// so every later replay reports the same thing.
pub(crate) async fn indeterminate(turn: &TurnCtx, name: &str, key: String, ordinal: u64) -> Result<Value, ToolError> {
    let error = ToolError::Indeterminate { tool: name.to_owned(), key: key.clone() };
    let outcome = StepOutcome::Failed(JsonText::serialize_from(&error).unwrap_or_default());
    if let Err(e) = turn.journal.finish(&key, ordinal, outcome, false).await {
        return Err(journal_failure(turn, name, "record the outcome", e));
    }
    Err(error)
}

/// Where a call runs: its ids, its parent (for a nested call), and how it is reported.
pub(crate) struct CallSite<'a> {
    pub(crate) call_id: &'a str,
    /// Its callsite; nested effects get `"<callsite>.<n>"`.
    pub(crate) callsite: &'a str,
    /// The parent call's token, for a nested call: cancelling the parent cancels it.
    pub(crate) parent: Option<&'a CancellationToken>,
    /// A call the model issued (its progress is reported), not a nested `ctx.tool()`.
    pub(crate) top_level: bool,
    /// Nothing else of the batch runs beside it (a lone or serial call).
    pub(crate) alone: bool,
}

/// The tool's stream driven to its outcome: in a task of its own, or inline.
enum Running {
    Task(CallTask),
    Inline(futures::future::BoxFuture<'static, std::thread::Result<Outcome>>),
}

/// How driving a tool's stream ended.
enum Joined {
    Done(Outcome),
    Panicked(Box<dyn std::any::Any + Send>),
    Aborted,
}

impl std::future::Future for Running {
    type Output = Joined;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Joined> {
        match self.get_mut() {
            Self::Task(task) => std::pin::Pin::new(task.handle()).poll(cx).map(|joined| match joined {
                Ok(out) => Joined::Done(out),
                Err(e) if e.is_panic() => Joined::Panicked(e.into_panic()),
                Err(_) => Joined::Aborted,
            }),
            Self::Inline(future) => future.as_mut().poll(cx).map(|polled| match polled {
                Ok(out) => Joined::Done(out),
                Err(payload) => Joined::Panicked(payload),
            }),
        }
    }
}

impl Running {
    /// Stops a call that ignored its token past the grace period (an inline one stops when
    /// dropped, which follows).
    fn abort(&self) {
        if let Self::Task(task) = self {
            task.abort();
        }
    }
}

/// Runs one call to its outcome under its timeout and the turn's interrupt.
async fn execute(
    turn: &Arc<TurnCtx>,
    tool: &Arc<dyn Tool>,
    call: Box<dyn PreparedCall>,
    key: &str,
    site: CallSite<'_>,
) -> Result<Value, ToolError> {
    let name = tool.name();
    if turn.journal.lease_lost() {
        // Another owner took the run over: nothing more starts here.
        return Err(ToolError::Cancelled { tool: name.to_owned() });
    }
    let CallSite { call_id, callsite, parent, top_level, alone } = site;
    let token = parent.map_or_else(CancellationToken::new, CancellationToken::child_token);
    let scope = Scope::new(Arc::clone(turn), callsite.to_owned(), token.clone());
    let ctx = ToolContext::in_run(turn.journal.run_id(), call_id, key, token.clone(), scope);
    // A progress event's ids are read from the call's context and tool when one is sent:
    // most calls send none, and copies made up front were two allocations per call.
    let ids = (ctx.clone(), Arc::clone(tool));
    let mut events = call.execute(ctx);
    let sink = turn.events.clone();
    let drive = async move {
        while let Some(ev) = events.next().await {
            match ev {
                ToolEvent::Progress(value) if top_level => {
                    // Dropped when the consumer lags: see `EventSender`.
                    sink.progress(Event::ToolProgress {
                        call_id: ids.0.call_id().into(),
                        name: ids.1.name().into(),
                        value,
                    });
                }
                ToolEvent::Progress(_) => {}
                ToolEvent::Outcome(out) => return Some(out),
            }
        }
        None
    };

    let timeout = tool.timeout();
    // Parallel calls, and any call with a timeout, are tasks of their own: parallel calls use
    // every core, and a tool that blocks its thread or burns CPU cannot stall the timer that
    // watches it. A lone call without a timeout has no timer to stall and nothing beside it
    // to share a core with, so it is polled right here: that saves a spawn, a cross-thread
    // wake-up and a join per serial call (about a fifth of a serial turn's instructions in
    // the `runtime` bench). Its interrupt is noticed at its next await, which is all a
    // cancellation token can promise a task anyway.
    let mut task = if alone && timeout.is_none() {
        Running::Inline(AssertUnwindSafe(drive).catch_unwind().boxed())
    } else {
        Running::Task(CallTask::new(tokio::spawn(drive)))
    };

    let interrupt = if tool.interruptible() { Some(turn.interrupt.clone()) } else { None };
    let timer = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let interrupted = async {
        match &interrupt {
            Some(i) => i.cancelled().await,
            None => std::future::pending().await,
        }
    };
    let stop = tokio::select! {
        biased;
        joined = &mut task => return finish_join(name, joined, turn.max_result_bytes),
        () = timer => ToolError::Timeout { tool: name.to_owned(), limit: timeout.unwrap_or_default() },
        () = interrupted => ToolError::Cancelled { tool: name.to_owned() },
        () = cancelled_opt(parent) => ToolError::Cancelled { tool: name.to_owned() },
    };
    // The outcome is decided by the timer or the interrupt, not by whatever the tool returns
    // after noticing its token; a tool that ignores the token is dropped after a grace period.
    token.cancel();
    if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
        task.abort();
        // An abort takes effect when the task next yields; one that blocks its thread keeps
        // running (and holding what it captured) until it does. The model gets its answer now;
        // the turn waits for the call's end before it gives up the lease.
        if let Running::Task(task) = task {
            turn.stragglers.keep(name, stop.to_string(), task);
        }
    }
    Err(stop)
}

async fn cancelled_opt(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

fn finish_join(name: &str, joined: Joined, max_bytes: usize) -> Result<Value, ToolError> {
    match joined {
        Joined::Done(Some(Ok(value))) => {
            let size = crate::json::json_len(&value);
            if size > max_bytes {
                Err(ToolError::InvalidOutput {
                    tool: name.to_owned(),
                    message: format!("the result is {size} bytes; the limit is {max_bytes} bytes"),
                })
            } else {
                Ok(value)
            }
        }
        Joined::Done(Some(Err(e))) => Err(e),
        Joined::Done(None) => {
            Err(ToolError::InvalidOutput { tool: name.to_owned(), message: "the tool ended without a result".into() })
        }
        Joined::Panicked(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".to_owned());
            Err(ToolError::Panicked { tool: name.to_owned(), message })
        }
        Joined::Aborted => Err(ToolError::Cancelled { tool: name.to_owned() }),
    }
}
