//! The OpenAI-compatible chat-completions client, one idea per file: [`config`] (the builder
//! and the environment), [`request`] (the request body, retries and bounded reading of the
//! response), [`sse`] (a provider-neutral server-sent-events parser) and [`assemble`] (chunks
//! into [`ModelEvent`]s).

mod assemble;
mod config;
mod request;
pub mod sse;

use std::{
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use assemble::Assembler;
use config::Retry;
pub use config::{ConfigError, OpenAiBuilder};
use futures::{Stream, StreamExt, stream::BoxStream};
use serde_json::Value;
use sse::SseParser;

use crate::{
    Model,
    model::{ModelError, ModelEvent, ModelRequest},
};

/// The base URL used when none is configured: OpenAI's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The model id [`OpenAi::from_env_if_configured`] suggests when `OPENAI_MODEL` is unset.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

/// The default [`OpenAiBuilder::max_response_bytes`]: 16 MiB, the size of the largest value a
/// store journals ([`DEFAULT_MAX_VALUE_BYTES`](crate::stores::DEFAULT_MAX_VALUE_BYTES)), so a
/// response the client accepts can also be journaled.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 << 20;

/// A [`Model`] speaking the OpenAI-compatible chat-completions API with streaming (SSE) and
/// parallel tool calls. Besides OpenAI this covers Ollama, vLLM, llama.cpp server and LM Studio.
///
/// Each [`Model::stream`] call POSTs `{base_url}/chat/completions` with `stream: true`, retries
/// 429 and 5xx answers with bounded exponential backoff (honouring `Retry-After`), and turns the
/// event stream into [`ModelEvent`]s: text deltas as they arrive, each tool call once its
/// argument fragments are complete (raw text, unchanged), then one [`ModelEvent::Finish`] with
/// the token usage. Dropping the stream cancels the request. Cloning is cheap and shares the
/// connection pool.
///
/// ```no_run
/// use std::time::Duration;
/// use kuralle::models::OpenAi;
///
/// # fn main() -> Result<(), kuralle::models::ConfigError> {
/// // OPENAI_API_KEY (and optionally OPENAI_BASE_URL) from the environment:
/// let model = OpenAi::from_env("gpt-4o-mini")?;
///
/// // Or explicitly, here a local Ollama server that needs no key:
/// let local = OpenAi::builder()
///     .base_url("http://localhost:11434/v1")
///     .model("llama3.2")
///     .temperature(0.2)
///     .timeout(Duration::from_secs(300))
///     .strict_tools(false)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OpenAi {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    base_url: String,
    endpoint: String,
    model: String,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    strict_tools: bool,
    timeout: Duration,
    retry: Retry,
    max_response_bytes: usize,
}

impl fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAi")
            .field("model", &self.inner.model)
            .field("base_url", &self.inner.base_url)
            .field("strict_tools", &self.inner.strict_tools)
            .finish_non_exhaustive()
    }
}

impl Model for OpenAi {
    fn name(&self) -> &str {
        &self.inner.model
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::info_span!(
            "openai.chat_completions",
            model = %inner.model,
            url = %inner.endpoint,
            attempts = tracing::field::Empty,
            finish_reason = tracing::field::Empty,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
        );
        let body = inner.body(&request);
        let limit = inner.max_response_bytes;
        let events = async_stream::try_stream! {
            let body = body?;
            let response = inner.send(&body).await?;
            if response.content_length().is_some_and(|len| len > limit as u64) {
                Err(ModelError::TooLarge { limit })?;
            }
            if request::is_json(&response) {
                // A server (or proxy) that ignored `stream: true` and sent one whole completion.
                let body = request::read_bounded(response, limit).await?;
                for model_event in request::completion_events(&body)? {
                    yield model_event;
                }
                return;
            }
            let mut bytes = response.bytes_stream();
            // Every event is part of the body, so the body's bound also bounds one event.
            let mut sse = SseParser::with_max_event_bytes(limit);
            let mut assembler = Assembler::default();
            let mut read = 0usize;
            'read: while let Some(chunk) = bytes.next().await {
                let chunk = chunk.map_err(|e| ModelError::Transport(request::error_chain(&e)))?;
                // Counted before parsing: the body is refused as soon as it passes the limit,
                // and what is held (parser buffer, gathered arguments) never exceeds it.
                read = read.saturating_add(chunk.len());
                if read > limit {
                    Err(ModelError::TooLarge { limit })?;
                }
                for event in sse.push(&chunk)? {
                    for model_event in assembler.on_event(&event)? {
                        yield model_event;
                    }
                    if assembler.done {
                        break 'read;
                    }
                }
            }
            if !assembler.done {
                for event in sse.finish()? {
                    for model_event in assembler.on_event(&event)? {
                        yield model_event;
                    }
                }
            }
            for model_event in assembler.end()? {
                if let ModelEvent::Finish { reason, usage } = &model_event {
                    let span = tracing::Span::current();
                    span.record("finish_reason", tracing::field::debug(reason));
                    span.record("input_tokens", usage.input_tokens);
                    span.record("output_tokens", usage.output_tokens);
                }
                yield model_event;
            }
        };
        Box::pin(Instrumented { inner: events, span })
    }
}

pin_project_lite::pin_project! {
    /// Enters `span` around every poll, so the request's logs and fields land in it.
    struct Instrumented<S> {
        #[pin]
        inner: S,
        span: tracing::Span,
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

/// `{"message", "type", "code"}` (or a bare string) as one line.
fn describe_error(error: &Value) -> String {
    match error {
        Value::String(s) => s.clone(),
        Value::Object(map) => {
            let mut text = map.get("message").and_then(Value::as_str).unwrap_or("unspecified error").to_owned();
            for key in ["type", "code"] {
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

fn excerpt(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(max_chars).collect();
        format!("{cut}…")
    }
}

/// Runs the OpenAI chunk assembler over `data` payloads of server-sent events, as the client
/// does after parsing the stream. For fuzzing and property tests; not public API.
#[doc(hidden)]
pub fn assemble_events<'a>(data: impl IntoIterator<Item = &'a str>) -> Result<Vec<ModelEvent>, ModelError> {
    let mut assembler = assemble::Assembler::default();
    let mut out = Vec::new();
    for data in data {
        out.extend(assembler.on_event(&sse::SseEvent { event: None, data: data.to_owned() })?);
        if assembler.done {
            break;
        }
    }
    out.extend(assembler.end()?);
    Ok(out)
}
