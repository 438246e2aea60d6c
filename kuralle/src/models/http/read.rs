//! Reading an answer within a byte limit: a whole JSON body, or a server-sent-events stream
//! counted as it arrives, so a misbehaving server costs bounded memory on every wire.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt};
use serde_json::Value;

use crate::{
    model::ModelError,
    models::sse::{SseEvent, SseParser},
};

/// Whether the answer is one JSON document rather than an event stream.
pub(crate) fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// Reads a whole (non-streamed) body, refusing it as soon as it passes `limit` bytes.
pub(crate) async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ModelError> {
    if response.content_length().is_some_and(|len| len > limit as u64) {
        return Err(ModelError::TooLarge { limit });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| ModelError::Transport(error_chain(&e)))? {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(ModelError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The server-sent events of `response`, refused as soon as the body passes `limit` bytes.
/// Every event is part of the body, so the body's bound also bounds one event; what is held
/// (the parser's buffer) never exceeds it.
pub(crate) fn sse_events(
    response: reqwest::Response,
    limit: usize,
) -> impl Stream<Item = Result<SseEvent, ModelError>> + Send + 'static {
    async_stream::try_stream! {
        if response.content_length().is_some_and(|len| len > limit as u64) {
            Err(ModelError::TooLarge { limit })?;
        }
        let mut bytes = response.bytes_stream();
        let mut sse = SseParser::with_max_event_bytes(limit);
        let mut read = 0usize;
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(|e| ModelError::Transport(error_chain(&e)))?;
            read = read.saturating_add(chunk.len());
            if read > limit {
                Err(ModelError::TooLarge { limit })?;
            }
            for event in sse.push(&chunk)? {
                yield event;
            }
        }
        for event in sse.finish()? {
            yield event;
        }
    }
}

/// An error and its sources, joined: reqwest's top-level message alone rarely says what failed.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        source = e.source();
    }
    text
}

/// `{"message", "type", "code", "status"}` (or a bare string) as one line.
pub(crate) fn describe_error(error: &Value) -> String {
    match error {
        Value::String(s) => s.clone(),
        Value::Object(map) => {
            let mut text = map.get("message").and_then(Value::as_str).unwrap_or("unspecified error").to_owned();
            for key in ["type", "code", "status"] {
                match map.get(key) {
                    Some(Value::String(s)) => text.push_str(&format!(" ({key}: {s})")),
                    Some(Value::Number(n)) => text.push_str(&format!(" ({key}: {n})")),
                    _ => {}
                }
            }
            text
        }
        other => other.to_string(),
    }
}

/// At most `max_chars` of `text`, marked when cut.
pub(crate) fn excerpt(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max_chars).collect();
        format!("{cut}…")
    }
}

pin_project_lite::pin_project! {
    /// Enters `span` around every poll, so the request's logs and fields land in it.
    pub(crate) struct Instrumented<S> {
        #[pin]
        pub(crate) inner: S,
        pub(crate) span: tracing::Span,
    }
}

impl<S: Stream> Stream for Instrumented<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        let _entered = this.span.enter();
        this.inner.poll_next(cx)
    }
}
