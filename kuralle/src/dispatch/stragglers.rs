//! Calls that outlived their answer: a call that timed out or was interrupted, ignored its
//! token and was aborted, but had not ended when the run moved on (its task blocks its thread,
//! so the abort takes effect only when it next yields).
//!
//! The model already has the call's answer (a timeout or a cancellation) and the run goes on;
//! what is left is the call's effect, which must not overlap another owner's attempt at the
//! same call. So the turn keeps them here, and its lease is given up only once they have ended
//! (`runtime::lease::Held::release`): nothing of a turn outlives its lease.

use std::sync::{Mutex, PoisonError};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};

use serde_json::Value;
use tokio::task::JoinHandle;

use super::call::CANCEL_GRACE;
use crate::error::ToolError;

/// What a call task ends with: the tool's outcome, or `None` if its stream ended without one.
pub(crate) type Outcome = Option<Result<Value, ToolError>>;

/// A call task: aborted when dropped, so a turn that is itself dropped (its caller went away)
/// leaves no call running behind it.
pub(crate) struct CallTask(JoinHandle<Outcome>);

impl CallTask {
    pub(crate) fn new(handle: JoinHandle<Outcome>) -> Self {
        Self(handle)
    }

    pub(crate) fn handle(&mut self) -> &mut JoinHandle<Outcome> {
        &mut self.0
    }

    /// Aborts the task; it stops at its next await.
    pub(crate) fn abort(&self) {
        self.0.abort();
    }
}

impl Drop for CallTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One straggling call: what it was, why it was cut off, and its (aborted) task.
struct Straggler {
    tool: String,
    why: String,
    task: CallTask,
}

/// The turn's straggling calls.
#[derive(Default)]
pub(crate) struct Stragglers(Mutex<Vec<Straggler>>);

impl Stragglers {
    /// Keeps an aborted call task that has not ended yet.
    pub(crate) fn keep(&self, tool: &str, why: String, task: CallTask) {
        let straggler = Straggler { tool: tool.to_owned(), why, task };
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(straggler);
    }

    /// Whether no call is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).is_empty()
    }

    /// The kept calls' ends, to wait for: `None` when none is kept. Those that end within
    /// the cancellation grace are waited for at once; for the others (each blocks its thread)
    /// a warning names them.
    pub(crate) async fn take(&self) -> Option<Ending> {
        let kept = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        if kept.is_empty() {
            return None;
        }
        let mut tools = Vec::new();
        let ending = FuturesUnordered::new();
        for Straggler { tool, why, mut task } in kept {
            tools.push(format!("`{tool}` ({why})"));
            ending.push(Box::pin(async move {
                let _ = task.handle().await;
            }) as BoxFuture<'static, ()>);
        }
        let mut ending = Ending(ending);
        if tokio::time::timeout(CANCEL_GRACE, ending.ended()).await.is_ok() {
            return None;
        }
        tracing::warn!(
            calls = %tools.join(", "),
            "calls that were cut off are still running: each blocks its thread, so it cannot be cancelled; the \
             run's lease is kept until they end; move blocking work into `tokio::task::spawn_blocking`"
        );
        Some(ending)
    }
}

/// The ends of straggling calls, waited for together.
pub(crate) struct Ending(FuturesUnordered<BoxFuture<'static, ()>>);

impl Ending {
    /// Waits until every call has ended; progress survives the future being dropped.
    pub(crate) async fn ended(&mut self) {
        while self.0.next().await.is_some() {}
    }
}
