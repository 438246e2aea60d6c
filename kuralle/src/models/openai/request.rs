//! Sending a request: the chat-completions body, retries with jittered backoff, and reading the
//! response within [`OpenAiBuilder::max_response_bytes`](super::OpenAiBuilder::max_response_bytes)
//! while it arrives.

use std::time::Duration;

use reqwest::header::{ACCEPT, HeaderMap};
use serde_json::{Map, Value, json};

use super::{Inner, assemble::Assembler, describe_error, excerpt};
use crate::{
    model::{Message, ModelError, ModelEvent, ModelRequest},
    schema,
};

/// How much of an error response body is read for its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

impl Inner {
    /// The chat-completions request body for `request`.
    pub(super) fn body(&self, request: &ModelRequest) -> Result<Value, ModelError> {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if !request.system.is_empty() {
            messages.push(json!({"role": "system", "content": request.system}));
        }
        messages.extend(request.messages.iter().map(encode_message));

        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert("messages".into(), Value::Array(messages));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(|spec| schema::openai_function(spec, self.strict_tools))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ModelError::InvalidRequest(e.to_string()))?;
            body.insert("tools".into(), Value::Array(tools));
        }
        if let Some(t) = self.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(m) = self.max_tokens {
            body.insert("max_tokens".into(), json!(m));
        }
        Ok(Value::Object(body))
    }

    /// Sends the request, retrying 429s, 5xx answers and failed connections within the budget.
    /// The span's `attempts` is recorded once, with the final count.
    pub(super) async fn send(&self, body: &Value) -> Result<reqwest::Response, ModelError> {
        let mut attempt = 0u32;
        let result = self.send_attempts(body, &mut attempt).await;
        tracing::Span::current().record("attempts", attempt);
        result
    }

    async fn send_attempts(&self, body: &Value, attempt: &mut u32) -> Result<reqwest::Response, ModelError> {
        loop {
            *attempt += 1;
            let attempt = *attempt;
            let request = self.client.post(&self.endpoint).header(ACCEPT, "text/event-stream").json(body).send();
            let (error, hint) = match tokio::time::timeout(self.timeout, request).await {
                Err(_) => {
                    return Err(ModelError::Transport(format!(
                        "no response from {} within {:?}",
                        self.endpoint, self.timeout
                    )));
                }
                Ok(Err(e)) if e.is_connect() => (ModelError::Transport(error_chain(&e)), None),
                Ok(Err(e)) => return Err(ModelError::Transport(error_chain(&e))),
                Ok(Ok(response)) => {
                    let status = response.status();
                    if status.is_success() {
                        tracing::debug!(attempt, status = status.as_u16(), "streaming the response");
                        return Ok(response);
                    }
                    let status = status.as_u16();
                    let hint = retry_after(response.headers());
                    let message = self.error_message(response).await;
                    match status {
                        401 | 403 => return Err(ModelError::Auth { status, message }),
                        429 => (ModelError::RateLimited { attempts: attempt, message }, hint),
                        500..=599 => (ModelError::Http { status, attempts: attempt, message }, hint),
                        _ => return Err(ModelError::Http { status, attempts: attempt, message }),
                    }
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

    /// The provider's message from an error response: `error.message` of a JSON body, else
    /// the (bounded) body text, else the status text.
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
            _ if text.trim().is_empty() => fallback,
            _ => excerpt(text.trim(), 2000),
        }
    }
}

pub(super) fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// Reads a whole (non-streamed) body, refusing it as soon as it passes `limit` bytes.
pub(super) async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ModelError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| ModelError::Transport(error_chain(&e)))? {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(ModelError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The events of a non-streamed `chat.completion` object: its message is treated as one delta.
/// Parsed straight into the assembler's types, so the body is held once more at most.
pub(super) fn completion_events(body: &[u8]) -> Result<Vec<ModelEvent>, ModelError> {
    let mut assembler = Assembler::default();
    assembler.done = true;
    let mut events = assembler.on_completion(body)?;
    events.extend(assembler.end()?);
    Ok(events)
}

/// One transcript message in chat-completions form.
fn encode_message(message: &Message) -> Value {
    match message {
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant { content, tool_calls } => {
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            m.insert("content".into(), if content.is_empty() { Value::Null } else { json!(content) });
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.call_id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        })
                    })
                    .collect();
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(m)
        }
        Message::Tool { call_id, content, .. } => {
            let text = match content {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            json!({"role": "tool", "tool_call_id": call_id, "content": text})
        }
    }
}

/// The wait a 429/5xx response asks for: `retry-after-ms` (OpenAI) or `Retry-After` seconds.
/// The HTTP-date form is ignored (the computed backoff applies).
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let valid = |n: f64| n.is_finite() && n >= 0.0;
    if let Some(ms) = number("retry-after-ms").filter(|n| valid(*n)) {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
    }
    number("retry-after").filter(|n| valid(*n)).map(|s| Duration::from_secs_f64(s.min(86_400.0)))
}

/// An error and its sources, joined: reqwest's top-level message alone rarely says what failed.
pub(super) fn error_chain(error: &dyn std::error::Error) -> String {
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::StreamExt;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };
    use tracing::{
        Metadata,
        field::{Field, Visit},
        span::{Attributes, Id, Record},
    };

    use tracing_core::span::Current;

    use crate::{Message, Model, ModelRequest, models::OpenAi};

    /// A subscriber with one span at a time that keeps every value recorded for `attempts`.
    #[derive(Default)]
    struct Attempts {
        values: Arc<Mutex<Vec<u64>>>,
        span: Mutex<Option<&'static Metadata<'static>>>,
        depth: Mutex<usize>,
    }

    struct U64s<'a>(&'a Mutex<Vec<u64>>);

    impl Visit for U64s<'_> {
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "attempts" {
                self.0.lock().unwrap().push(value);
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl tracing::Subscriber for Attempts {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            attrs.record(&mut U64s(&self.values));
            *self.span.lock().unwrap() = Some(attrs.metadata());
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, values: &Record<'_>) {
            values.record(&mut U64s(&self.values));
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &Id) {
            *self.depth.lock().unwrap() += 1;
        }
        fn exit(&self, _: &Id) {
            *self.depth.lock().unwrap() -= 1;
        }
        fn current_span(&self) -> Current {
            match *self.span.lock().unwrap() {
                Some(meta) if *self.depth.lock().unwrap() > 0 => Current::new(Id::from_u64(1), meta),
                _ => Current::none(),
            }
        }
    }

    /// Answers two requests with 503, the third with a short event stream.
    async fn flaky_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move {
            for n in 0..3 {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, then the body by its length.
                loop {
                    let read = socket.read(&mut buf).await.unwrap();
                    request.extend_from_slice(&buf[..read]);
                    let text = String::from_utf8_lossy(&request).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                    if read == 0 {
                        break;
                    }
                }
                let reply = if n < 2 {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
                } else {
                    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
                    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}")
                };
                socket.write_all(reply.as_bytes()).await.unwrap();
                socket.shutdown().await.ok();
            }
        });
        url
    }

    #[tokio::test]
    async fn the_span_records_attempts_once_with_the_final_count() {
        let subscriber = Attempts::default();
        let values = Arc::clone(&subscriber.values);
        let _guard = tracing::subscriber::set_default(subscriber);
        let model = OpenAi::builder()
            .base_url(flaky_server().await)
            .model("m")
            .retry_backoff(std::time::Duration::from_millis(1), std::time::Duration::from_millis(2))
            .build()
            .unwrap();
        let request = ModelRequest {
            system: String::new(),
            messages: vec![Message::User { content: "x".into() }].into(),
            tools: Vec::new().into(),
        };
        let events: Vec<_> = model.stream(request).collect().await;
        assert!(events.iter().all(Result::is_ok), "{events:?}");
        assert_eq!(*values.lock().unwrap(), [3]);
    }
}
