//! Sending a request: retries with jittered backoff (honouring `Retry-After`) for 429s, 5xx,
//! overloaded answers and connections cut before an answer, and the same budget for an answer
//! that fails before its first event. Errors are typed the same way on every wire.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use reqwest::header::{ACCEPT, HeaderMap};
use serde_json::Value;

use super::{Retry, describe_error, error_chain, excerpt};
use crate::model::{ModelError, ModelEvent};

/// How much of an error response body is read for its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A configured HTTP client for one endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Http {
    pub(crate) client: reqwest::Client,
    pub(crate) endpoint: String,
    pub(crate) timeout: Duration,
    pub(crate) retry: Retry,
    pub(crate) max_response_bytes: usize,
}

impl Http {
    /// POSTs `body` to the endpoint (`accept` as the `Accept` header), retrying within the
    /// budget. The current span's `attempts` is recorded once, with the final count.
    pub(crate) async fn send(&self, body: &Value, accept: &str) -> Result<reqwest::Response, ModelError> {
        let mut attempt = 0u32;
        crate::trace::report_endpoint(&self.endpoint);
        let result = self.send_attempts(body, accept, &mut attempt).await;
        tracing::Span::current().record("attempts", attempt);
        result
    }

    async fn send_attempts(
        &self,
        body: &Value,
        accept: &str,
        attempt: &mut u32,
    ) -> Result<reqwest::Response, ModelError> {
        loop {
            *attempt += 1;
            let attempt = *attempt;
            let request = self.client.post(&self.endpoint).header(ACCEPT, accept).json(body).send();
            let (error, hint) = match tokio::time::timeout(self.timeout, request).await {
                Err(_) => {
                    return Err(ModelError::Transport(format!(
                        "no response from {} within {:?}",
                        self.endpoint, self.timeout
                    )));
                }
                Ok(Err(e)) if e.is_timeout() => return Err(ModelError::Transport(error_chain(&e))),
                // Refused, reset, or closed before an answer (a pooled connection the server
                // had just closed, say): nothing was answered, so asking again is safe.
                Ok(Err(e)) => (ModelError::Transport(error_chain(&e)), None),
                Ok(Ok(response)) => {
                    let status = response.status();
                    if status.is_success() {
                        tracing::debug!(attempt, status = status.as_u16(), "streaming the response");
                        return Ok(response);
                    }
                    let status = status.as_u16();
                    let hint = retry_after(response.headers());
                    let message = self.error_message(response).await;
                    let error = classify(status, attempt, message);
                    if !retryable(&error) {
                        return Err(error);
                    }
                    (error, hint)
                }
            };
            if attempt > self.retry.max_retries {
                return Err(error);
            }
            let delay = self.retry.delay(attempt, hint);
            tracing::warn!(attempt, ?delay, %error, "model request failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// The provider's message from an error response: `error.message` of a JSON body (also
    /// Gemini's `[{"error": ..}]`), else the (bounded) body text, else the status text.
    async fn error_message(&self, mut response: reqwest::Response) -> String {
        let fallback = response.status().canonical_reason().unwrap_or("no message").to_owned();
        let mut body = Vec::new();
        let read = async {
            while let Ok(Some(chunk)) = response.chunk().await {
                body.extend_from_slice(&chunk);
                if body.len() >= MAX_ERROR_BODY {
                    body.truncate(MAX_ERROR_BODY);
                    break;
                }
            }
        };
        // A body that stalls must not stall the error; whatever arrived in time is used.
        let _ = tokio::time::timeout(self.timeout, read).await;
        let text = String::from_utf8_lossy(&body);
        match serde_json::from_str::<Value>(&text) {
            Ok(value) if value.get("error").is_some() => describe_error(&value["error"]),
            Ok(Value::Array(items)) if items.first().and_then(|v| v.get("error")).is_some() => {
                describe_error(&items[0]["error"])
            }
            _ if text.trim().is_empty() => fallback,
            _ => excerpt(text.trim(), 2000),
        }
    }
}

/// The typed error for an HTTP error status and the provider's message.
pub(crate) fn classify(status: u16, attempts: u32, message: String) -> ModelError {
    match status {
        401 | 403 => ModelError::Auth { status, message },
        429 => ModelError::RateLimited { attempts, message },
        529 => ModelError::Overloaded(message),
        400 | 413 if is_context_overflow(&message) => ModelError::ContextWindowExceeded(message),
        _ => ModelError::Http { status, attempts, message },
    }
}

/// Whether an error is worth asking again for (before anything was emitted).
pub(crate) fn retryable(error: &ModelError) -> bool {
    match error {
        ModelError::RateLimited { .. } | ModelError::Overloaded(_) | ModelError::Transport(_) => true,
        ModelError::Http { status, .. } => *status >= 500,
        _ => false,
    }
}

/// Whether a provider's message says the prompt does not fit the context window (each wire
/// words it its own way).
pub(crate) fn is_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "context length",
        "context window",
        "prompt is too long",
        "maximum context",
        "input token count",
        "too many tokens",
        "request_too_large",
    ]
    .iter()
    .any(|needle| m.contains(needle))
}

/// The wait a 429/5xx response asks for: `retry-after-ms` (OpenAI) or `Retry-After` seconds.
/// The HTTP-date form is ignored (the computed backoff applies).
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let valid = |n: f64| n.is_finite() && n >= 0.0;
    if let Some(ms) = number("retry-after-ms").filter(|n| valid(*n)) {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
    }
    number("retry-after").filter(|n| valid(*n)).map(|s| Duration::from_secs_f64(s.min(86_400.0)))
}

/// Where an attempt leaves a failure of [`Http::send`]: `send` has spent the retry budget
/// already, so [`retry_before_first_event`] ends with it instead of asking again.
#[derive(Clone, Default)]
pub(crate) struct SendFailure(Arc<Mutex<Option<ModelError>>>);

impl SendFailure {
    /// Ends the attempt with `error`, not to be retried.
    pub(crate) fn keep(&self, error: ModelError) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
    }

    fn take(&self) -> Option<ModelError> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Runs `attempt` again, within the retry budget, while it fails with an overloaded or
/// rate-limit error before emitting any event (Anthropic sends `overloaded_error` as an event
/// after HTTP 200). Once an event was emitted, an error is final: the caller has seen part of
/// the answer, and a second answer would not continue it. A failure the attempt hands to its
/// [`SendFailure`] (the request itself failed, its retries spent) is final too.
pub(crate) fn retry_before_first_event<F, S>(
    retry: Retry,
    attempt: F,
) -> BoxStream<'static, Result<ModelEvent, ModelError>>
where
    F: Fn(SendFailure) -> S + Send + 'static,
    S: Stream<Item = Result<ModelEvent, ModelError>> + Send + 'static,
{
    Box::pin(async_stream::stream! {
        let mut attempts = 0u32;
        'attempt: loop {
            attempts += 1;
            let failed = SendFailure::default();
            let mut events = std::pin::pin!(attempt(failed.clone()));
            let mut emitted = false;
            while let Some(item) = events.next().await {
                match item {
                    Err(e @ (ModelError::Overloaded(_) | ModelError::RateLimited { .. }))
                        if !emitted && attempts <= retry.max_retries =>
                    {
                        let delay = retry.delay(attempts, None);
                        tracing::warn!(attempt = attempts, ?delay, error = %e, "model stream failed before its first event; retrying");
                        tokio::time::sleep(delay).await;
                        continue 'attempt;
                    }
                    Err(e) => {
                        yield Err(e);
                        return;
                    }
                    Ok(event) => {
                        emitted = true;
                        yield Ok(event);
                    }
                }
            }
            if let Some(error) = failed.take() {
                yield Err(error);
            }
            return;
        }
    })
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn retry_after_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
    }

    #[test]
    fn statuses_are_typed() {
        assert!(matches!(classify(401, 1, "no".into()), ModelError::Auth { status: 401, .. }));
        assert!(matches!(classify(529, 1, "busy".into()), ModelError::Overloaded(_)));
        assert!(matches!(
            classify(400, 1, "prompt is too long: 210000 tokens > 200000 maximum".into()),
            ModelError::ContextWindowExceeded(_)
        ));
        assert!(matches!(classify(400, 1, "bad field".into()), ModelError::Http { status: 400, .. }));
        assert!(retryable(&classify(503, 1, String::new())));
        assert!(!retryable(&classify(400, 1, String::new())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_fails_before_its_first_event_is_asked_again() {
        let tries = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = tries.clone();
        let retry = Retry { max_retries: 3, base: Duration::from_millis(10), max: Duration::from_millis(20) };
        let events: Vec<_> = retry_before_first_event(retry, move |_| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            futures::stream::iter(if n < 2 {
                vec![Err(ModelError::Overloaded("busy".into()))]
            } else {
                vec![Ok(ModelEvent::TextDelta { delta: "hi".into() }), Err(ModelError::Overloaded("late".into()))]
            })
        })
        .collect()
        .await;
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 3);
        // After an event, the error is final and not retried.
        assert_eq!(
            events,
            vec![Ok(ModelEvent::TextDelta { delta: "hi".into() }), Err(ModelError::Overloaded("late".into()))]
        );
    }
}
