//! `ToolContext`: what a running tool call may know and do besides its arguments.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::{ToolError, journal::effects::Scope};

/// Handed to a tool that declares a `&ToolContext` parameter.
///
/// It carries the call's identity (run id, call id, idempotency key), a cancellation token
/// fired by a timeout or by the caller's interrupt, and the durable helpers
/// [`tool`](ToolContext::tool), [`now`](ToolContext::now) and [`uuid`](ToolContext::uuid),
/// whose results are journaled and replayed.
///
/// ```
/// use kuralle::ToolContext;
/// let ctx = ToolContext::detached();
/// assert!(!ctx.cancellation().is_cancelled());
/// assert_eq!(ctx.run_id(), "detached");
/// ```
#[derive(Clone, Debug)]
pub struct ToolContext {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    run_id: String,
    call_id: String,
    idempotency_key: String,
    cancel: CancellationToken,
    scope: Option<Scope>,
}

impl ToolContext {
    /// A context outside any run, for calling a tool directly (tests, scripts). Its durable
    /// helpers work but journal nothing.
    pub fn detached() -> Self {
        Self::new("detached", "detached", "detached", CancellationToken::new())
    }

    /// A context with explicit identity and token, outside any run.
    pub fn new(
        run_id: impl Into<String>,
        call_id: impl Into<String>,
        idempotency_key: impl Into<String>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                run_id: run_id.into(),
                call_id: call_id.into(),
                idempotency_key: idempotency_key.into(),
                cancel,
                scope: None,
            }),
        }
    }

    pub(crate) fn in_run(
        run_id: &str,
        call_id: &str,
        idempotency_key: &str,
        cancel: CancellationToken,
        scope: Scope,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                run_id: run_id.to_owned(),
                call_id: call_id.to_owned(),
                idempotency_key: idempotency_key.to_owned(),
                cancel,
                scope: Some(scope),
            }),
        }
    }

    /// Fired when the call times out or the caller interrupts it. Pass it to anything that
    /// can stop early.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.inner.cancel
    }

    /// Whether [`cancellation`](Self::cancellation) has fired.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// The run this call belongs to.
    pub fn run_id(&self) -> &str {
        &self.inner.run_id
    }

    /// The model's id for this call.
    pub fn call_id(&self) -> &str {
        &self.inner.call_id
    }

    /// A key stable across retries, crashes and replays of this call: pass it to external
    /// APIs (payments, bookings) so they deduplicate a call the runtime re-runs.
    pub fn idempotency_key(&self) -> &str {
        &self.inner.idempotency_key
    }

    /// Calls another tool of the agent, durably: the call is a journal step of its own (keyed
    /// by this call's position, so sibling calls finishing in any order do not matter),
    /// replayed after a crash, and it shares this call's cancellation.
    ///
    /// # Errors
    /// The nested call's [`ToolError`]; [`ToolError::UnknownTool`] outside a run.
    pub async fn tool(&self, name: &str, args: Value) -> Result<Value, ToolError> {
        match &self.inner.scope {
            Some(scope) => scope.tool(name, args).await,
            None => Err(ToolError::UnknownTool { tool: name.to_owned(), available: String::new() }),
        }
    }

    /// The current time, journaled: a replayed call sees the time of its first run.
    ///
    /// # Errors
    /// [`ToolError::Failed`] when the journal cannot record it (the run then stops, resumable).
    pub async fn now(&self) -> Result<SystemTime, ToolError> {
        let ms = match &self.inner.scope {
            Some(scope) => scope.recorded(crate::StepKind::Now, crate::journal::effects::now_value).await?,
            None => crate::journal::effects::now_value(),
        };
        Ok(UNIX_EPOCH + Duration::from_millis(ms.as_u64().unwrap_or(0)))
    }

    /// A random UUID (v4, hyphenated), journaled: a replayed call sees the same one.
    ///
    /// # Errors
    /// [`ToolError::Failed`] when the journal cannot record it (the run then stops, resumable).
    pub async fn uuid(&self) -> Result<String, ToolError> {
        let make = || Value::String(uuid::Uuid::new_v4().to_string());
        let v = match &self.inner.scope {
            Some(scope) => scope.recorded(crate::StepKind::Uuid, make).await?,
            None => make(),
        };
        Ok(v.as_str().unwrap_or_default().to_owned())
    }
}
