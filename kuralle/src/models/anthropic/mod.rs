//! The Anthropic Messages API client, one idea per file: [`config`] (the builder and the
//! environment), [`request`] (the request body) and [`assemble`] (stream events into
//! [`ModelEvent`]s). Sending, retries and bounded reading are shared
//! ([`http`](crate::models::http)).

mod assemble;
mod config;
mod request;

use std::{borrow::Cow, fmt, sync::Arc};

use assemble::Assembler;
pub use config::AnthropicBuilder;
use futures::{Stream, StreamExt, stream::BoxStream};
use serde_json::Value;

use crate::{
    Model,
    model::{ModelError, ModelEvent, ModelRequest, Usage},
    models::http::{
        Http, Instrumented, read,
        send::{SendFailure, retry_before_first_event},
    },
};

/// What [`Model::provider`] says for this wire.
pub(crate) const PROVIDER: &str = "anthropic";

/// The base URL used when none is configured: Anthropic's API (the client appends
/// `/v1/messages`).
///
/// ```
/// use kuralle::models::{Anthropic, DEFAULT_ANTHROPIC_BASE_URL};
/// let model = Anthropic::builder().api_key("k").model("claude-sonnet-4-5").build()?;
/// assert_eq!(model.base_url(), DEFAULT_ANTHROPIC_BASE_URL);
/// # Ok::<(), kuralle::models::ConfigError>(())
/// ```
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";

/// The model id [`Anthropic::from_env_if_configured`] suggests when `ANTHROPIC_MODEL` is
/// unset.
///
/// ```
/// use kuralle::{Model, models::{Anthropic, DEFAULT_ANTHROPIC_MODEL}};
/// let model = Anthropic::builder().api_key("k").model(DEFAULT_ANTHROPIC_MODEL).build()?;
/// assert_eq!((model.name(), model.provider()), ("claude-sonnet-4-5", "anthropic"));
/// # Ok::<(), kuralle::models::ConfigError>(())
/// ```
pub const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-4-5";

/// How many times one response that the API paused (`stop_reason: pause_turn`) is continued
/// before the turn ends as it is, with [`FinishReason::Other`](crate::FinishReason::Other)`("pause_turn")`.
const MAX_CONTINUATIONS: u32 = 8;

/// A [`Model`] speaking the Anthropic Messages API (`POST {base_url}/v1/messages`, streamed).
///
/// Each [`Model::stream`] call sends the transcript (`x-api-key`, `anthropic-version:
/// 2023-06-01`) and turns the event stream into [`ModelEvent`]s: text deltas as they arrive
/// and each text block whole at its end, thinking as reasoning deltas and then one
/// [`Part::Reasoning`](crate::Part::Reasoning) with its signature, redacted thinking as a
/// [`Part::RedactedReasoning`](crate::Part::RedactedReasoning), each tool call once its input
/// fragments are complete, then one [`ModelEvent::Finish`] whose usage counts cache reads
/// and writes in `input_tokens`. The next request sends thinking and redacted thinking back
/// unmodified, in their places, and all results of a turn's calls in one user message.
///
/// The API's answers are handled as it documents them:
/// - 429, 5xx, 529 and connections cut before an answer are retried with backoff
///   (honouring `Retry-After`); an `error` event after HTTP 200 (`overloaded_error` becomes
///   [`ModelError::Overloaded`], any other [`ModelError::Provider`]) is asked again only
///   while nothing of the response was emitted.
/// - A response the API pauses (`stop_reason: pause_turn`, a long turn of server tools) is
///   continued in the same stream: the client sends the content so far back as the last
///   assistant message and asks again, up to 8 times, emitting events throughout; usage is
///   the sum of every request.
///
/// Dropping the stream cancels the request. Cloning is cheap and shares the connection pool.
///
/// ```no_run
/// use kuralle::models::Anthropic;
///
/// # fn main() -> Result<(), kuralle::models::ConfigError> {
/// // ANTHROPIC_API_KEY (and optionally ANTHROPIC_BASE_URL) from the environment:
/// let model = Anthropic::from_env("claude-sonnet-4-5")?;
///
/// // Or explicitly, with extended thinking:
/// let thinking = Anthropic::builder()
///     .api_key("sk-ant-...")
///     .model("claude-sonnet-4-5")
///     .max_tokens(16_000)
///     .thinking(10_000)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Anthropic {
    inner: Arc<Inner>,
}

struct Inner {
    http: Http,
    base_url: String,
    model: String,
    max_tokens: u32,
    thinking: Option<u32>,
    temperature: Option<f64>,
    cache_control: bool,
}

impl fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Anthropic")
            .field("model", &self.inner.model)
            .field("base_url", &self.inner.base_url)
            .field("max_tokens", &self.inner.max_tokens)
            .field("thinking", &self.inner.thinking)
            .finish_non_exhaustive()
    }
}

impl Model for Anthropic {
    fn name(&self) -> &str {
        &self.inner.model
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::info_span!(
            "anthropic.messages",
            model = %inner.model,
            url = %inner.http.endpoint,
            attempts = tracing::field::Empty,
            continuations = tracing::field::Empty,
            finish_reason = tracing::field::Empty,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
            cache_read_tokens = tracing::field::Empty,
            cache_write_tokens = tracing::field::Empty,
        );
        let body = match inner.body(&request) {
            Ok(body) => Arc::new(body),
            Err(e) => return Box::pin(futures::stream::once(async move { Err(e) })),
        };
        let retry = inner.http.retry;
        let events =
            retry_before_first_event(retry, move |failed| respond(Arc::clone(&inner), Arc::clone(&body), failed));
        Box::pin(Instrumented { inner: events, span })
    }
}

/// One attempt at the response: the request, and as many continuations as the API pauses
/// for. A failure of `send` ends the stream and is handed to `failed`.
fn respond(
    inner: Arc<Inner>,
    body: Arc<Value>,
    failed: SendFailure,
) -> impl Stream<Item = Result<ModelEvent, ModelError>> + Send + 'static {
    async_stream::try_stream! {
        let limit = inner.http.max_response_bytes;
        let mut usage = Usage::default();
        // The content of the responses so far, sent back to continue a paused turn.
        let mut content: Vec<Value> = Vec::new();
        let mut continuations = 0u32;
        loop {
            let body = if content.is_empty() { Cow::Borrowed(&*body) } else { Cow::Owned(request::continuation(&body, &content)) };
            let response = match inner.http.send(&body, "text/event-stream").await {
                Ok(response) => response,
                Err(e) => {
                    failed.keep(e);
                    return;
                }
            };
            let mut assembler = Assembler::default();
            if read::is_json(&response) {
                // A server (or proxy) that ignored `stream: true` and sent one whole message.
                let bytes = read::read_bounded(response, limit).await?;
                for event in assembler.on_message(&bytes)? {
                    yield event;
                }
            } else {
                if let Some(kind) = content_type(&response).filter(|t| !t.starts_with("text/event-stream")) {
                    Err(ModelError::Protocol(format!("expected an event stream, got `{kind}`")))?;
                }
                let mut events = std::pin::pin!(read::sse_events(response, limit));
                while let Some(event) = events.next().await {
                    for model_event in assembler.on_event(&event?)? {
                        yield model_event;
                    }
                    if assembler.stopped {
                        break;
                    }
                }
            }
            let (tail, ended) = assembler.end()?;
            for event in tail {
                yield event;
            }
            usage += ended.usage;
            if ended.stop_reason.as_deref() == Some("pause_turn") && continuations < MAX_CONTINUATIONS {
                continuations += 1;
                tracing::Span::current().record("continuations", continuations);
                content.extend(ended.content);
                continue;
            }
            let reason = ended.finish_reason();
            let span = tracing::Span::current();
            span.record("finish_reason", tracing::field::debug(&reason));
            span.record("input_tokens", usage.input_tokens);
            span.record("output_tokens", usage.output_tokens);
            span.record("cache_read_tokens", usage.cache_read_tokens);
            span.record("cache_write_tokens", usage.cache_write_tokens);
            yield ModelEvent::Finish { reason, usage };
            return;
        }
    }
}

fn content_type(response: &reqwest::Response) -> Option<String> {
    let value = response.headers().get(reqwest::header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.trim().to_ascii_lowercase())
}
