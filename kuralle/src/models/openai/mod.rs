//! The OpenAI-compatible chat-completions client, one idea per file: [`config`] (the builder
//! and the environment), [`request`] (the request body) and [`assemble`] (chunks into
//! [`ModelEvent`]s). Sending, retries and bounded reading are shared
//! ([`http`](crate::models::http)).

mod assemble;
mod config;
mod request;
mod responses;

use std::{fmt, sync::Arc};

use assemble::Assembler;
pub use config::OpenAiBuilder;
use futures::{StreamExt, stream::BoxStream};
pub use responses::{DEFAULT_RESPONSES_MODEL, OpenAiResponses, OpenAiResponsesBuilder};

use crate::{
    Model,
    model::{ModelError, ModelEvent, ModelRequest},
    models::{
        http::{Http, Instrumented, read},
        sse,
    },
};

/// What [`Model::provider`] says for this wire.
pub(crate) const PROVIDER: &str = "openai";

/// The base URL used when none is configured: OpenAI's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The model id [`OpenAi::from_env_if_configured`] suggests when `OPENAI_MODEL` is unset.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

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
    http: Http,
    base_url: String,
    model: String,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    strict_tools: bool,
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

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::info_span!(
            "openai.chat_completions",
            model = %inner.model,
            url = %inner.http.endpoint,
            attempts = tracing::field::Empty,
            finish_reason = tracing::field::Empty,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
        );
        let body = inner.body(&request);
        let limit = inner.http.max_response_bytes;
        let events = async_stream::try_stream! {
            let body = body?;
            let response = inner.http.send(&body, "text/event-stream").await?;
            if read::is_json(&response) {
                // A server (or proxy) that ignored `stream: true` and sent one whole completion.
                let body = read::read_bounded(response, limit).await?;
                for model_event in request::completion_events(&body)? {
                    yield model_event;
                }
                return;
            }
            let mut events = std::pin::pin!(read::sse_events(response, limit));
            let mut assembler = Assembler::default();
            while let Some(event) = events.next().await {
                for model_event in assembler.on_event(&event?)? {
                    yield model_event;
                }
                if assembler.done {
                    break;
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
