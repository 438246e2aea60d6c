//! `ToolContext`: what a running tool call may know and do besides its arguments.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::ToolError;

/// The durable effects of a call inside a run — `ctx.tool()`, `ctx.now()`, `ctx.uuid()` —
/// each journaled and replayed by the engine. Declared here, beside the context that holds
/// it, and implemented by dispatch, so the tool contract does not depend on the engine.
pub(crate) trait Effects: Send + Sync + fmt::Debug {
    /// A nested, journaled tool call.
    fn tool<'a>(&'a self, name: &'a str, args: Value) -> BoxFuture<'a, Result<Value, ToolError>>;
    /// The current time, journaled: milliseconds since the Unix epoch.
    fn now(&self) -> BoxFuture<'_, Result<Value, ToolError>>;
    /// A random UUID, journaled.
    fn uuid(&self) -> BoxFuture<'_, Result<Value, ToolError>>;
}

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
    inner: Arc<Inner<dyn Effects>>,
}

/// The context's fields, with its effects last so that one allocation holds both (an
/// `Arc<Inner<Scope>>` coerces to `Arc<Inner<dyn Effects>>`).
#[derive(Debug)]
struct Inner<E: ?Sized> {
    ids: Ids,
    cancel: CancellationToken,
    effects: E,
}

/// The run id, call id and idempotency key, one after another in one string: every call
/// the runtime makes gets a context, and three strings of their own were two allocations more
/// per call.
struct Ids {
    text: Box<str>,
    /// Where the call id starts, and where the key starts.
    call_at: usize,
    key_at: usize,
}

impl Ids {
    fn new(run_id: &str, call_id: &str, idempotency_key: &str) -> Self {
        let mut text = String::with_capacity(run_id.len() + call_id.len() + idempotency_key.len());
        text.push_str(run_id);
        text.push_str(call_id);
        text.push_str(idempotency_key);
        let call_at = run_id.len();
        Self { text: text.into_boxed_str(), call_at, key_at: call_at + call_id.len() }
    }

    fn run_id(&self) -> &str {
        &self.text[..self.call_at]
    }

    fn call_id(&self) -> &str {
        &self.text[self.call_at..self.key_at]
    }

    fn idempotency_key(&self) -> &str {
        &self.text[self.key_at..]
    }
}

/// As the three ids were shown when they were fields of their own.
impl fmt::Debug for Ids {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ids")
            .field("run_id", &self.run_id())
            .field("call_id", &self.call_id())
            .field("idempotency_key", &self.idempotency_key())
            .finish()
    }
}

/// The effects of a context outside any run: nothing is journaled, and there are no tools.
#[derive(Debug)]
struct Detached;

impl Effects for Detached {
    fn tool<'a>(&'a self, name: &'a str, _args: Value) -> BoxFuture<'a, Result<Value, ToolError>> {
        let error = ToolError::UnknownTool { tool: name.to_owned(), available: String::new() };
        Box::pin(std::future::ready(Err(error)))
    }

    fn now(&self) -> BoxFuture<'_, Result<Value, ToolError>> {
        Box::pin(std::future::ready(Ok(now_value())))
    }

    fn uuid(&self) -> BoxFuture<'_, Result<Value, ToolError>> {
        Box::pin(std::future::ready(Ok(uuid_value())))
    }
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
        let (run_id, call_id, idempotency_key) = (run_id.into(), call_id.into(), idempotency_key.into());
        Self {
            inner: Arc::new(Inner { ids: Ids::new(&run_id, &call_id, &idempotency_key), cancel, effects: Detached }),
        }
    }

    pub(crate) fn in_run(
        run_id: &str,
        call_id: &str,
        idempotency_key: &str,
        cancel: CancellationToken,
        effects: impl Effects + 'static,
    ) -> Self {
        Self { inner: Arc::new(Inner { ids: Ids::new(run_id, call_id, idempotency_key), cancel, effects }) }
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
        self.inner.ids.run_id()
    }

    /// The model's id for this call.
    pub fn call_id(&self) -> &str {
        self.inner.ids.call_id()
    }

    /// A key stable across retries, crashes and replays of this call: pass it to external
    /// APIs (payments, bookings) so they deduplicate a call the runtime re-runs.
    pub fn idempotency_key(&self) -> &str {
        self.inner.ids.idempotency_key()
    }

    /// Calls another tool of the agent, durably: the call is a journal step of its own (keyed
    /// by this call's position, so sibling calls finishing in any order do not matter),
    /// replayed after a crash, and it shares this call's cancellation.
    ///
    /// # Errors
    /// The nested call's [`ToolError`]; [`ToolError::UnknownTool`] outside a run.
    pub async fn tool(&self, name: &str, args: Value) -> Result<Value, ToolError> {
        self.inner.effects.tool(name, args).await
    }

    /// The current time, journaled: a replayed call sees the time of its first run.
    ///
    /// # Errors
    /// [`ToolError::Failed`] when the journal cannot record it (the run then stops, resumable).
    pub async fn now(&self) -> Result<SystemTime, ToolError> {
        let ms = self.inner.effects.now().await?;
        Ok(UNIX_EPOCH + Duration::from_millis(ms.as_u64().unwrap_or(0)))
    }

    /// A random UUID (v4, hyphenated), journaled: a replayed call sees the same one.
    ///
    /// # Errors
    /// [`ToolError::Failed`] when the journal cannot record it (the run then stops, resumable).
    pub async fn uuid(&self) -> Result<String, ToolError> {
        let v = self.inner.effects.uuid().await?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }
}

/// `ctx.now()` as stored: milliseconds since the Unix epoch, by the one clock.
pub(crate) fn now_value() -> Value {
    Value::from(u64::try_from(crate::clock::now_ms()).unwrap_or(0))
}

/// `ctx.uuid()` as stored: a v4 UUID, hyphenated.
pub(crate) fn uuid_value() -> Value {
    Value::String(uuid::Uuid::new_v4().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three ids share one string and each reads back whole, empty and non-ASCII ones too.
    #[test]
    fn the_ids_read_back_from_their_one_string() {
        let ctx = ToolContext::new("run-é", "", "këy", CancellationToken::new());
        assert_eq!((ctx.run_id(), ctx.call_id(), ctx.idempotency_key()), ("run-é", "", "këy"));
        let ids = Ids::new("", "call_1", "");
        assert_eq!((ids.run_id(), ids.call_id(), ids.idempotency_key()), ("", "call_1", ""));
        assert_eq!(ids.text.len(), "call_1".len());
    }

    /// A context shows each id on its own, not the string that holds them.
    #[test]
    fn a_context_shows_its_ids_apart() {
        let shown = format!("{:?}", ToolContext::new("run-1", "call_1", "key", CancellationToken::new()));
        for field in [r#"run_id: "run-1""#, r#"call_id: "call_1""#, r#"idempotency_key: "key""#] {
            assert!(shown.contains(field), "{field} not in {shown}");
        }
    }
}
