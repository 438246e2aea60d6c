//! Nested effects of a running call — `ctx.tool()`, `ctx.now()`, `ctx.uuid()` — each a step
//! journaled under a callsite `"<parent>.<n>"` and replayed from the journal when recorded:
//! dispatch's implementation of the context's [`Effects`].

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    TurnCtx,
    call::{self, CallSite},
    journal_failure,
    plan::{self, Job, Plan, Planned, replayed_error},
};
use crate::{
    context::{Effects, now_value, uuid_value},
    error::ToolError,
    input::text::RawArgs,
    journal::Lookup,
    json::JsonText,
    model::ToolCallRequest,
    store::{StepKind, StepOutcome},
    trace,
};

/// A running call's place in the run, handed to its [`ToolContext`]: nested effects get
/// callsites `"<parent>.<n>"`, deterministic whatever order sibling calls finish in.
pub(crate) struct Scope {
    turn: Arc<TurnCtx>,
    prefix: String,
    /// Shared by every clone of the call's context: it lives in the context's one allocation.
    next: AtomicU64,
    token: CancellationToken,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl Scope {
    /// The scope of the call at `callsite`, whose nested calls are cancelled with `token`.
    pub(crate) fn new(turn: Arc<TurnCtx>, prefix: String, token: CancellationToken) -> Self {
        Self { turn, prefix, next: AtomicU64::new(0), token }
    }

    fn next_callsite(&self) -> String {
        format!("{}.{}", self.prefix, self.next.fetch_add(1, Ordering::SeqCst))
    }

    /// A nested, journaled tool call. It runs directly (no batch, no concurrency gate), so a
    /// serial tool calling another serial tool cannot deadlock.
    pub(crate) async fn tool(&self, name: &str, args: Value) -> Result<Value, ToolError> {
        let callsite = self.next_callsite();
        let capture = self.turn.capture_content;
        let arguments = capture.then(|| {
            let mut shown = args.clone();
            self.turn.redact.args(name, &mut shown);
            shown.to_string()
        });
        let span =
            trace::tool_span(self.turn.journal.run_id(), &format!("nested:{callsite}"), name, arguments.as_deref());
        let started = trace::started(&span);
        let (result, replayed) = self.nested(name, args, callsite).instrument(span.clone()).await;
        trace::tool_done(&span, &result, replayed, started, capture.then_some((name, &self.turn.redact)));
        result
    }

    /// [`tool`](Self::tool) without its span: the value, and whether the journal answered it.
    async fn nested(&self, name: &str, args: Value, callsite: String) -> (Result<Value, ToolError>, bool) {
        let turn = &self.turn;
        let Some(tool) = turn.tools.get(name).cloned() else {
            return (Err(ToolError::UnknownTool { tool: name.to_owned(), available: turn.tools.names() }), false);
        };
        if !args.is_object() {
            let message = format!("the arguments must be a JSON object, not {}", crate::input::text::kind(&args));
            return (Err(ToolError::invalid_input(name, message)), false);
        }
        let req = ToolCallRequest {
            call_id: smol_str::format_smolstr!("nested:{callsite}"),
            name: name.into(),
            arguments: String::new(),
        };
        let Planned { head, check } = Planned::new(req, callsite, RawArgs::from_value(args), Ok(tool));
        match plan::plan(turn, &head, check) {
            Plan::Done(result, replayed) => (result, replayed),
            Plan::Job(Job::Indeterminate { key, ordinal }) => {
                (call::indeterminate(turn, name, key, ordinal).await, false)
            }
            // A nested call cannot suspend its parent mid-execution; the caller decides.
            Plan::Pending(_) => {
                let reason = "a tool that needs approval cannot be called from inside another tool";
                (
                    Err(ToolError::Denied {
                        tool: name.to_owned(),
                        by: "runtime".to_owned(),
                        reason: Some(reason.into()),
                    }),
                    false,
                )
            }
            Plan::Job(Job::Run(mut ready)) => {
                if ready.ordinal.is_none() {
                    match turn.journal.begin(&[(&ready.key, StepKind::Tool, name)]).await {
                        Ok(o) => ready.ordinal = o.first().copied(),
                        Err(e) => return (Err(journal_failure(turn, name, "record the call", e)), false),
                    }
                }
                let call_id = head.req.call_id;
                let site = CallSite {
                    call_id: &call_id,
                    callsite: &head.callsite,
                    parent: Some(&self.token),
                    top_level: false,
                    alone: true,
                };
                // Inline like a lone call: the parent waits for it, nothing runs beside it here.
                (call::execute_journaled(turn, ready, site).await, false)
            }
        }
    }

    /// A journaled value of step kind `kind` (`ctx.now()`, `ctx.uuid()`): replayed if recorded
    /// at this callsite, else produced and recorded. The key's payload is the kind's stored
    /// name, so journals written before keep replaying.
    pub(crate) async fn recorded(&self, kind: StepKind, make: impl FnOnce() -> Value) -> Result<Value, ToolError> {
        let what = kind.as_str();
        let callsite = self.next_callsite();
        let turn = &self.turn;
        let key = turn.journal.string_key(&callsite, what);
        let ordinal = match turn.journal.lookup(&key) {
            Lookup::Finished(v) => return Ok(v),
            Lookup::Failed(e) => return Err(replayed_error(what, e)),
            Lookup::Running(ordinal) => ordinal,
            Lookup::Fresh => match turn.journal.begin(&[(&key, kind, what)]).await {
                Ok(o) => o[0],
                Err(e) => return Err(journal_failure(turn, what, "record the step", e)),
            },
        };
        let value = make();
        if let Err(e) = turn.journal.finish(&key, ordinal, StepOutcome::Finished(JsonText::from(&value)), false).await {
            return Err(journal_failure(turn, what, "record the step", e));
        }
        Ok(value)
    }
}

impl Effects for Scope {
    fn tool<'a>(&'a self, name: &'a str, args: Value) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(Scope::tool(self, name, args))
    }

    fn now(&self) -> BoxFuture<'_, Result<Value, ToolError>> {
        Box::pin(self.recorded(StepKind::Now, now_value))
    }

    fn uuid(&self) -> BoxFuture<'_, Result<Value, ToolError>> {
        Box::pin(self.recorded(StepKind::Uuid, uuid_value))
    }
}
