//! The `tracing` spans a run emits, on the OpenTelemetry GenAI semantic conventions:
//! `invoke_agent` (one turn), `chat` (one model response; `generate_content` on Gemini) and
//! `execute_tool` (one tool call). Each names itself for OpenTelemetry through `otel.name`
//! (`"invoke_agent support"`, `"chat gpt-4o"`, `"execute_tool weather"`) and `otel.kind`, so
//! `tracing-opentelemetry` exports it as the conventions say, while kuralle stays free of
//! OpenTelemetry dependencies. Fields known only later (usage, response model, `error.type`)
//! are declared empty and recorded when the work ends, so an exporter that reports spans on
//! close sees them all. kuralle's own fields (`run_id`, `replayed`, `outcome`, `duration_ms`)
//! sit beside the conventions'. See `docs/telemetry.md`.

mod chat;
mod content;
mod metrics;

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

pub(crate) use chat::{ChatSpan, replayed};
// The provider clients report what their wire says; a build without any has no caller.
#[cfg_attr(not(any(feature = "openai", feature = "anthropic", feature = "gemini")), allow(unused_imports))]
pub(crate) use chat::{report_endpoint, report_response};
use serde_json::Value;
use tracing::{Span, field::Empty};

use crate::{
    error::{RunError, ToolError},
    model::ModelError,
};

/// The environment variable the GenAI conventions name for opting in to content capture.
pub(crate) const CAPTURE_CONTENT_ENV: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// Whether the environment opts in to content capture (`true`, any case).
pub(crate) fn capture_content_from_env() -> bool {
    std::env::var(CAPTURE_CONTENT_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// `gen_ai.provider.name` for a model's wire ([`Model::provider`](crate::Model::provider)):
/// the conventions' well-known value where one applies, the wire's own name otherwise.
pub(crate) fn provider_name(wire: &str) -> &str {
    match wire {
        "openai" | "openai.responses" => "openai",
        "gemini" => "gcp.gemini",
        other => other,
    }
}

/// `gen_ai.operation.name` of one model request on `wire`: the conventions' predefined
/// `generate_content` for Gemini's Generate Content API, `chat` for every other wire.
pub(crate) fn operation_name(wire: &str) -> &'static str {
    if wire == "gemini" { "generate_content" } else { "chat" }
}

/// Span for one run's turn (`invoke_agent`), opened once the run's agent and model are known.
/// Its name and kind are given at creation: `tracing-opentelemetry` starts the OpenTelemetry
/// span when the `tracing` span is first entered, and a later `otel.name` is not applied.
pub(crate) fn agent_span(run_id: &str, agent: &str, model: &dyn crate::Model) -> Span {
    tracing::info_span!(
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {agent}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.provider.name = provider_name(model.provider()),
        gen_ai.agent.name = %agent,
        gen_ai.request.model = model.name(),
        gen_ai.conversation.id = %run_id,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
        run_id = %run_id,
        status = Empty,
        outcome = Empty,
        duration_ms = Empty,
    )
}

/// Records how a turn ended on its `invoke_agent` span.
pub(crate) fn agent_done(span: &Span, result: &Result<crate::RunOutput, RunError>, started: Instant) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(out) => {
            span.record("status", out.status.as_str());
            span.record("outcome", "ok");
            span.record("gen_ai.usage.input_tokens", int(out.usage.input_tokens));
            span.record("gen_ai.usage.output_tokens", int(out.usage.output_tokens));
        }
        Err(e) => {
            span.record("outcome", tracing::field::display(e));
            span.record("error.type", run_error_type(e));
            span.record("otel.status_code", "error");
        }
    }
    record_duration(span, started);
}

pin_project_lite::pin_project! {
    /// A turn's steps inside its `invoke_agent` span, recording how the turn ended on the span
    /// when they finish ([`agent_done`]). The span is kept once, in `Instrumented` (which also
    /// enters it while the steps are dropped): a clone beside it, to record on afterwards, was
    /// 40 bytes of every run's task through the model's whole latency.
    pub(crate) struct AgentTurn<F> {
        #[pin]
        steps: tracing::instrument::Instrumented<F>,
        started: Instant,
    }
}

impl<F> AgentTurn<F> {
    /// `steps` in `span`, timed from now.
    pub(crate) fn new(steps: F, span: Span) -> Self {
        Self { steps: tracing::Instrument::instrument(steps, span), started: Instant::now() }
    }
}

impl<F: Future<Output = Result<crate::RunOutput, RunError>>> Future for AgentTurn<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let result = std::task::ready!(this.steps.as_mut().poll(cx));
        agent_done(this.steps.span(), &result, *this.started);
        Poll::Ready(result)
    }
}

/// Span for one tool call (`execute_tool`): model-issued, or nested `ctx.tool()` with a
/// `nested:` call id. `arguments` is the call's argument text, given only when content
/// capture is on.
pub(crate) fn tool_span(run_id: &str, call_id: &str, tool: &str, arguments: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("execute_tool {tool}"),
        otel.kind = "internal",
        otel.status_code = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        gen_ai.tool.call.id = %call_id,
        gen_ai.tool.type = "function",
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        error.type = Empty,
        run_id = %run_id,
        replayed = Empty,
        outcome = Empty,
        duration_ms = Empty,
    );
    if let Some(arguments) = arguments {
        span.record("gen_ai.tool.call.arguments", arguments);
    }
    span
}

/// When a call recorded in `span` started; `None` when no subscriber wants the span, so a
/// replayed call (10,000 of them in a long run's resume) reads no clock.
pub(crate) fn started(span: &Span) -> Option<Instant> {
    (!span.is_disabled()).then(Instant::now)
}

/// Records how a tool call ended: `"ok"`, the error kind (`"denied"`, `"timeout"`, ...) as
/// `outcome` and `error.type`, whether the journal answered it, and (with `capture`: the
/// tool's name and its secrets) the result. A replayed call carries no duration: nothing ran. Nothing when the span is
/// disabled (`started` is `None`).
pub(crate) fn tool_done(
    span: &Span,
    result: &Result<Value, ToolError>,
    replayed: bool,
    started: Option<Instant>,
    capture: Option<(&str, &crate::Redactions)>,
) {
    let Some(started) = started else { return };
    span.record("replayed", replayed);
    let outcome = outcome_of(result);
    if result.is_err() {
        span.record("error.type", outcome.as_str());
        span.record("otel.status_code", "error");
    }
    span.record("outcome", outcome);
    if let Some((tool, redact)) = capture {
        span.record("gen_ai.tool.call.result", tracing::field::display(content::tool_result(tool, result, redact)));
    }
    if !replayed {
        record_duration(span, started);
    }
}

/// Records a call that waits for a human decision.
pub(crate) fn tool_pending(span: &Span, started: Option<Instant>) {
    let Some(started) = started else { return };
    span.record("replayed", false);
    span.record("outcome", "pending_approval");
    record_duration(span, started);
}

pub(crate) fn record_duration(span: &Span, started: Instant) {
    span.record("duration_ms", i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX));
}

/// A count as the `i64` the conventions type it as: `tracing-opentelemetry` exports a `u64`
/// field as a string (it has no unsigned attribute), which backends would not sum or chart.
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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

/// `error.type` of a failed model request: the HTTP status where the provider answered with
/// one, else a low-cardinality name of the failure.
pub(crate) fn model_error_type(e: &ModelError) -> String {
    match e {
        ModelError::Auth { status, .. } | ModelError::Http { status, .. } => status.to_string(),
        ModelError::RateLimited { .. } => "429".to_owned(),
        ModelError::Transport(_) => "transport".to_owned(),
        ModelError::Protocol(_) => "protocol".to_owned(),
        ModelError::Provider(_) => "provider_error".to_owned(),
        ModelError::InvalidRequest(_) => "invalid_request".to_owned(),
        ModelError::TooLarge { .. } => "response_too_large".to_owned(),
        ModelError::Overloaded(_) => "overloaded".to_owned(),
        ModelError::ContextWindowExceeded(_) => "context_window_exceeded".to_owned(),
        ModelError::ScriptExhausted(_) => "script_exhausted".to_owned(),
    }
}

/// `error.type` of a failed turn.
pub(crate) fn run_error_type(e: &RunError) -> String {
    match e {
        RunError::Model(e) => model_error_type(e),
        RunError::Store(_) => "store".to_owned(),
        RunError::StepLimit { .. } => "step_limit".to_owned(),
        RunError::ResponseTooLarge { .. } => "response_too_large".to_owned(),
        RunError::Config(_) => "config".to_owned(),
        _ => "_OTHER".to_owned(),
    }
}
