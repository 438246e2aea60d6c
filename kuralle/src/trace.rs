//! The `tracing` spans a run emits: `run`, `model_step` and `tool_call`, with the fields an
//! operator filters on. Outcome fields start empty and are recorded when the work ends, so a
//! subscriber that reports spans on close (or an OpenTelemetry exporter) sees them all.

use std::time::Instant;

use serde_json::Value;
use tracing::{Span, field::Empty};

use crate::error::ToolError;

/// Span for one run's turn: `run_id`; `agent`, `status`, `outcome` and `duration_ms` on close.
pub(crate) fn run_span(run_id: &str) -> Span {
    tracing::info_span!("run", run_id = %run_id, agent = Empty, status = Empty, outcome = Empty, duration_ms = Empty)
}

/// Span for one model response, `step` being its callsite in the turn.
pub(crate) fn model_span(run_id: &str, step: u64) -> Span {
    tracing::info_span!("model_step", run_id = %run_id, step, replayed = Empty, outcome = Empty, duration_ms = Empty)
}

/// Span for one tool call (model-issued, or nested `ctx.tool()` with a `nested:` call id).
pub(crate) fn tool_span(run_id: &str, call_id: &str, tool: &str) -> Span {
    tracing::info_span!(
        "tool_call",
        run_id = %run_id,
        call_id = %call_id,
        tool = %tool,
        replayed = Empty,
        outcome = Empty,
        duration_ms = Empty,
    )
}

/// When a call recorded in `span` started; `None` when no subscriber wants the span, so a
/// replayed call (10,000 of them in a long run's resume) reads no clock.
pub(crate) fn started(span: &Span) -> Option<Instant> {
    (!span.is_disabled()).then(Instant::now)
}

/// Records how a tool call ended: `"ok"`, the error kind (`"denied"`, `"timeout"`, ...), and
/// whether the journal answered it. Nothing when the span is disabled (`started` is `None`).
pub(crate) fn tool_done(span: &Span, result: &Result<Value, ToolError>, replayed: bool, started: Option<Instant>) {
    let Some(started) = started else { return };
    span.record("replayed", replayed);
    span.record("outcome", outcome_of(result));
    record_duration(span, started);
}

/// Records a call that waits for a human decision.
pub(crate) fn tool_pending(span: &Span, started: Option<Instant>) {
    let Some(started) = started else { return };
    span.record("replayed", false);
    span.record("outcome", "pending_approval");
    record_duration(span, started);
}

pub(crate) fn record_duration(span: &Span, started: Instant) {
    span.record("duration_ms", u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
}

/// `"ok"` or the [`ToolError`] kind as serialized (`"invalid_input"`, `"denied"`, ...).
pub(crate) fn outcome_of(result: &Result<Value, ToolError>) -> String {
    match result {
        Ok(_) => "ok".to_owned(),
        Err(e) => serde_json::to_value(e)
            .ok()
            .and_then(|v| v.get("kind").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| "error".to_owned()),
    }
}
