//! The `chat` span of one model response, and what only the provider client learns while it
//! streams (the model that answered, the response id, the server it reached).
//!
//! A provider client runs inside its own span, so it cannot record on the runtime's `chat`
//! span directly: it reports to a task-local scope that [`ChatSpan::run`] opens around the
//! step, read back when the step ends. Outside a runtime (a client used on its own) there is
//! no scope and the reports go nowhere.

use std::{
    cell::RefCell,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

use tracing::{Span, field::Empty};

use super::{content, metrics, model_error_type, operation_name, provider_name, run_error_type};
use crate::{
    error::RunError,
    model::{FinishReason, Model, ModelRequest, Part, Usage},
};

tokio::task_local! {
    static REPORTED: RefCell<Reported>;
}

/// What the step learned beside its response.
#[derive(Debug, Default)]
pub(crate) struct Reported {
    replayed: bool,
    /// Boxed, and made at the first report: the scope holds this through the model's whole
    /// latency in every run's task (88 bytes inline, 8 boxed), and only a provider client
    /// that reaches a server reports anything.
    wire: Option<Box<WireReport>>,
}

/// What a provider client reported of the response and the server.
#[derive(Debug, Default)]
struct WireReport {
    response_model: Option<String>,
    response_id: Option<String>,
    server: Option<(String, u16)>,
}

impl Reported {
    fn wire(&mut self) -> &mut WireReport {
        self.wire.get_or_insert_with(Box::default)
    }
}

/// Whether the journal answered the step: marks the current span and the step's scope.
pub(crate) fn replayed(replayed: bool) {
    Span::current().record("replayed", replayed);
    let _ = REPORTED.try_with(|r| r.borrow_mut().replayed = replayed);
}

/// The model that answered and the response's id, as the wire reported them. The first
/// report of a response counts (Gemini repeats them on every chunk).
pub(crate) fn report_response(model: Option<&str>, id: Option<&str>) {
    let (model, id) = (model.filter(|m| !m.is_empty()), id.filter(|i| !i.is_empty()));
    if model.is_none() && id.is_none() {
        return;
    }
    let _ = REPORTED.try_with(|r| {
        let mut r = r.borrow_mut();
        let r = r.wire();
        if r.response_model.is_none() {
            r.response_model = model.map(str::to_owned);
        }
        if r.response_id.is_none() {
            r.response_id = id.map(str::to_owned);
        }
    });
}

/// The URL a provider client sends its request to: its host and port become
/// `server.address` and `server.port`.
pub(crate) fn report_endpoint(url: &str) {
    let Some(server) = host_and_port(url) else { return };
    let _ = REPORTED.try_with(|r| r.borrow_mut().wire().server = Some(server));
}

/// `https://api.openai.com/v1` → `("api.openai.com", 443)`; `http://[::1]:8080/x` →
/// `("::1", 8080)`.
fn host_and_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            (host, rest.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(port) => port.parse().ok()?,
        None if scheme.eq_ignore_ascii_case("https") => 443,
        None => 80,
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

/// A step's response as [`ChatSpan::done`] reads it: its parts, why it stopped, what it spent.
pub(crate) type Answered<'a> = (&'a [Part], &'a FinishReason, Usage);

/// The `chat` span of one model step, with what its metrics need.
pub(crate) struct ChatSpan<'m> {
    span: Span,
    started: Instant,
    /// Borrowed for the step, its wire and name read from it when the step ends: every step
    /// of every run in flight holds its span, and owned copies of the two were two
    /// allocations per step (the two borrowed strings, 16 bytes more of each run's task).
    model: &'m dyn Model,
    /// With content capture on, the tools' secrets to hide from it. Boxed: capture is rare,
    /// and its 32 bytes were in every run's task.
    capture: Option<Box<crate::Redactions>>,
}

impl<'m> ChatSpan<'m> {
    /// Opens the span of the step at `step` asking `model` for `request`. With `capture`,
    /// the request's messages and system instructions go on the span.
    pub(crate) fn start(
        run_id: &str,
        step: u64,
        model: &'m dyn Model,
        request: &ModelRequest,
        capture: Option<&crate::Redactions>,
    ) -> Self {
        let wire = model.provider();
        let operation = operation_name(wire);
        let span = tracing::info_span!(
            "chat",
            otel.name = %format_args!("{operation} {}", model.name()),
            otel.kind = "client",
            otel.status_code = Empty,
            gen_ai.operation.name = operation,
            gen_ai.provider.name = provider_name(wire),
            gen_ai.request.model = model.name(),
            gen_ai.conversation.id = %run_id,
            gen_ai.response.model = Empty,
            gen_ai.response.id = Empty,
            gen_ai.response.finish_reasons = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
            gen_ai.usage.cache_read.input_tokens = Empty,
            gen_ai.usage.cache_creation.input_tokens = Empty,
            gen_ai.usage.reasoning.output_tokens = Empty,
            server.address = Empty,
            server.port = Empty,
            error.type = Empty,
            gen_ai.system_instructions = Empty,
            gen_ai.input.messages = Empty,
            gen_ai.output.messages = Empty,
            run_id = %run_id,
            step,
            replayed = Empty,
            outcome = Empty,
            duration_ms = Empty,
        );
        if let Some(redact) = capture.filter(|_| !span.is_disabled()) {
            if !request.system.is_empty() {
                span.record("gen_ai.system_instructions", tracing::field::display(content::system(&request.system)));
            }
            span.record("gen_ai.input.messages", tracing::field::display(content::input(&request.messages, redact)));
        }
        Self { span, started: Instant::now(), model, capture: capture.cloned().map(Box::new) }
    }

    /// Runs the step inside the span; returns its output and what the provider client
    /// reported, for [`done`](Self::done). The report is handed back rather than kept in the
    /// span: every run in flight holds its span through the model's whole latency, while the
    /// report is still empty.
    pub(crate) async fn run<F: Future + ?Sized>(&self, step: Pin<Box<F>>) -> (F::Output, Reported) {
        REPORTED
            .scope(RefCell::default(), async move {
                let out = InSpan { span: &self.span, step: Some(step) }.await;
                (out, REPORTED.with(RefCell::take))
            })
            .await
    }
}

/// A boxed step polled, and dropped, inside a span it borrows. `Instrumented` owns its span,
/// and the clone of the chat span it took was 40 bytes of every run's task through the
/// model's whole latency.
struct InSpan<'s, F: ?Sized> {
    span: &'s Span,
    /// `None` once it finished (it is dropped then, in the span).
    step: Option<Pin<Box<F>>>,
}

impl<F: Future + ?Sized> Future for InSpan<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let _entered = this.span.enter();
        let Some(step) = this.step.as_mut() else {
            // Polled again after it finished: an executor's bug, answered as Tokio's own
            // futures answer it.
            panic!("a model step was polled after it finished");
        };
        let out = std::task::ready!(step.as_mut().poll(cx));
        this.step = None;
        Poll::Ready(out)
    }
}

impl<F: ?Sized> Drop for InSpan<'_, F> {
    fn drop(&mut self) {
        // A step cut off (an interrupt, a timeout) is dropped inside its span, as
        // `Instrumented` drops what it wraps.
        if let Some(step) = self.step.take() {
            let _entered = self.span.enter();
            drop(step);
        }
    }
}

impl ChatSpan<'_> {
    /// Records how the step ended: its response (`Ok(Some(..))`), an interrupt (`Ok(None)`)
    /// or an error. A replayed step is marked, with its finish reason, and carries no fresh
    /// timing, usage or metrics: nothing was asked of the model.
    pub(crate) fn done(&self, reported: &Reported, result: Result<Option<Answered<'_>>, &RunError>) {
        let span = &self.span;
        let replayed = reported.replayed;
        let fresh = !replayed;
        let wire = self.model.provider();
        let provider = provider_name(wire);
        let operation = operation_name(wire);
        let report = reported.wire.as_deref();
        let server = report.and_then(|w| w.server.as_ref());
        // Built only for a request actually sent: a replayed step records no metric.
        let labels = fresh.then(|| metrics::Labels::new(operation, provider, self.model.name(), server));
        match &result {
            Ok(Some((parts, finish, usage))) => {
                span.record("outcome", "ok");
                span.record(
                    "gen_ai.response.finish_reasons",
                    tracing::field::display(format_args!("[\"{}\"]", content::finish_reason(finish))),
                );
                if let Some(redact) = &self.capture {
                    span.record(
                        "gen_ai.output.messages",
                        tracing::field::display(content::output(parts, finish, redact)),
                    );
                }
                if let Some(labels) = &labels {
                    record_usage(span, usage);
                    metrics::tokens(labels, usage);
                }
            }
            Ok(None) => {
                span.record("outcome", "interrupted");
            }
            Err(e) => {
                let error_type = match e {
                    RunError::Model(e) => model_error_type(e),
                    e => run_error_type(e),
                };
                span.record("outcome", "error");
                span.record("otel.status_code", "error");
                span.record("error.type", error_type.as_str());
            }
        }
        if let Some(model) = report.and_then(|w| w.response_model.as_ref()) {
            span.record("gen_ai.response.model", model.as_str());
        }
        if let Some(id) = report.and_then(|w| w.response_id.as_ref()) {
            span.record("gen_ai.response.id", id.as_str());
        }
        if let Some((host, port)) = server {
            span.record("server.address", host.as_str());
            span.record("server.port", i64::from(*port));
        }
        if let Some(labels) = labels.filter(|_| !matches!(result, Ok(None))) {
            let error_type = match &result {
                Err(RunError::Model(e)) => Some(model_error_type(e)),
                Err(e) => Some(run_error_type(e)),
                Ok(_) => None,
            };
            metrics::duration(labels, error_type, self.started.elapsed());
            super::record_duration(span, self.started);
        }
    }
}

fn record_usage(span: &Span, usage: &Usage) {
    span.record("gen_ai.usage.input_tokens", super::int(usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", super::int(usage.output_tokens));
    // Zero is what a wire without the counter reports too: only a count it gave goes on.
    if usage.cache_read_tokens > 0 {
        span.record("gen_ai.usage.cache_read.input_tokens", super::int(usage.cache_read_tokens));
    }
    if usage.cache_write_tokens > 0 {
        span.record("gen_ai.usage.cache_creation.input_tokens", super::int(usage.cache_write_tokens));
    }
    if usage.reasoning_tokens > 0 {
        span.record("gen_ai.usage.reasoning.output_tokens", super::int(usage.reasoning_tokens));
    }
}

#[cfg(test)]
mod tests {
    use std::{
        future::Future,
        pin::Pin,
        sync::{Arc, Mutex},
        task::{Context, Poll},
    };

    use tracing::Span;
    use tracing_subscriber::prelude::*;

    use super::{InSpan, host_and_port};

    /// The span current now, by name.
    fn current() -> String {
        Span::current().metadata().map_or("none", |m| m.name()).to_owned()
    }

    /// Pending once, then ready; notes the current span each time it is polled and when it
    /// is dropped.
    struct Noting {
        seen: Arc<Mutex<Vec<String>>>,
        polled: bool,
    }

    impl Future for Noting {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.seen.lock().unwrap().push(format!("poll in {}", current()));
            if std::mem::replace(&mut self.polled, true) { Poll::Ready(()) } else { Poll::Pending }
        }
    }

    impl Drop for Noting {
        fn drop(&mut self) {
            self.seen.lock().unwrap().push(format!("drop in {}", current()));
        }
    }

    /// What `Instrumented` did for a step, `InSpan` does with the span it borrows: the step is
    /// polled inside it, and dropped inside it whether it finished or was cut off.
    #[test]
    fn a_step_is_polled_and_dropped_inside_its_span() {
        let _default = tracing_subscriber::registry().set_default();
        let span = tracing::info_span!("chat");
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        for finishes in [false, true] {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let mut step =
                InSpan { span: &span, step: Some(Box::pin(Noting { seen: Arc::clone(&seen), polled: false })) };
            assert!(Pin::new(&mut step).poll(&mut cx).is_pending());
            if finishes {
                assert!(Pin::new(&mut step).poll(&mut cx).is_ready());
                assert_eq!(*seen.lock().unwrap(), ["poll in chat", "poll in chat", "drop in chat"]);
            }
            drop(step);
            let want: &[&str] = if finishes {
                &["poll in chat", "poll in chat", "drop in chat"]
            } else {
                &["poll in chat", "drop in chat"]
            };
            assert_eq!(*seen.lock().unwrap(), want);
            assert_eq!(current(), "none", "the span is left after each poll and the drop");
        }
    }

    #[test]
    fn server_address_and_port_come_from_the_url() {
        assert_eq!(host_and_port("https://api.openai.com/v1/responses"), Some(("api.openai.com".into(), 443)));
        assert_eq!(host_and_port("http://127.0.0.1:4318/v1"), Some(("127.0.0.1".into(), 4318)));
        assert_eq!(host_and_port("http://[::1]:8080"), Some(("::1".into(), 8080)));
        assert_eq!(host_and_port("http://user:pw@proxy.local/x?y"), Some(("proxy.local".into(), 80)));
        assert_eq!(host_and_port("not a url"), None);
        assert_eq!(host_and_port("http://host:notaport/"), None);
    }
}
