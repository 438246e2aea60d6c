//! The OpenAI Responses API client, stateless (`store: false`), one idea per file like the
//! chat-completions client: [`config`] (the builder and the environment), [`request`] (the
//! request body: the transcript as input items) and [`assemble`] (stream events into
//! [`ModelEvent`]s). Sending, retries and bounded reading are shared
//! ([`http`](crate::models::http)).

mod assemble;
mod config;
mod request;

use std::{fmt, sync::Arc};

use assemble::Assembler;
pub use config::OpenAiResponsesBuilder;
use futures::{StreamExt, stream::BoxStream};
use serde_json::Value;

use crate::{
    Model,
    model::{ModelError, ModelEvent, ModelRequest},
    models::http::{
        Http, Instrumented, read,
        send::{SendFailure, retry_before_first_event},
    },
};

/// What [`Model::provider`] says for this wire. Distinct from the chat wire's `"openai"`: a
/// reasoning item or item id from this wire must never be sent to chat completions, and a
/// chat-completions turn carries nothing this wire can read back.
pub(crate) const PROVIDER: &str = "openai.responses";

/// The model id [`OpenAiResponses::from_env_if_configured`] suggests when `OPENAI_MODEL` is
/// unset.
pub const DEFAULT_RESPONSES_MODEL: &str = "gpt-5-mini";

/// A [`Model`] speaking the OpenAI Responses API (`POST {base_url}/responses`), stateless.
///
/// Every request carries the whole transcript as input items and `store: false`, so nothing
/// is kept on OpenAI's side and a run resumed from the journal sends exactly what the first
/// attempt sent. Reasoning goes back as the provider returned it: each `reasoning` item (its
/// id, `encrypted_content` and summary) right before the message or function call it
/// preceded, and every item with its id. For that, the client asks for
/// `include: ["reasoning.encrypted_content"]` whenever reasoning is configured
/// ([`OpenAiResponsesBuilder::reasoning_effort`] or
/// [`reasoning_summary`](OpenAiResponsesBuilder::reasoning_summary)), or when told to with
/// [`encrypted_reasoning`](OpenAiResponsesBuilder::encrypted_reasoning).
///
/// The stream becomes [`ModelEvent`]s: answer text and reasoning summaries as they arrive,
/// then each output item complete, with its provider state, as a [`ModelEvent::Part`]:
/// a reasoning item, a message (replacing its streamed text, same text plus the item id), a
/// function call (its `call_id` is what the runtime dispatches by; the item id `fc_…` is
/// kept beside it). A response cut by `max_output_tokens` finishes with
/// [`FinishReason::Length`](crate::FinishReason::Length), one the content filter stopped
/// with `ContentFilter`; a refusal is kept as the turn's text and finishes with `Refusal`.
/// A `response.failed` or `error` event is a typed error (context window, rate limit,
/// overloaded, provider); a rate-limit or overloaded one before any output is asked again
/// within the retry budget. Dropping the stream cancels the request. Cloning is cheap and
/// shares the connection pool.
///
/// ```no_run
/// use kuralle::models::OpenAiResponses;
///
/// # fn main() -> Result<(), kuralle::models::ConfigError> {
/// // OPENAI_API_KEY (and optionally OPENAI_BASE_URL) from the environment:
/// let model = OpenAiResponses::from_env("gpt-5-mini")?;
///
/// // Or explicitly, with reasoning summaries streamed for display:
/// let model = OpenAiResponses::builder()
///     .api_key("sk-...")
///     .model("o4-mini")
///     .reasoning_effort("medium")
///     .reasoning_summary("auto")
///     .max_output_tokens(4096)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OpenAiResponses {
    inner: Arc<Inner>,
}

struct Inner {
    http: Http,
    base_url: String,
    model: String,
    reasoning_effort: Option<String>,
    reasoning_summary: Option<String>,
    encrypted_reasoning: bool,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    strict_tools: bool,
}

impl fmt::Debug for OpenAiResponses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiResponses")
            .field("model", &self.inner.model)
            .field("base_url", &self.inner.base_url)
            .field("reasoning_effort", &self.inner.reasoning_effort)
            .field("reasoning_summary", &self.inner.reasoning_summary)
            .field("encrypted_reasoning", &self.inner.encrypted_reasoning)
            .field("strict_tools", &self.inner.strict_tools)
            .finish_non_exhaustive()
    }
}

impl Model for OpenAiResponses {
    fn name(&self) -> &str {
        &self.inner.model
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let span = tracing::info_span!(
            "openai.responses",
            model = %self.inner.model,
            url = %self.inner.http.endpoint,
            attempts = tracing::field::Empty,
            finish_reason = tracing::field::Empty,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
            cache_read_tokens = tracing::field::Empty,
            reasoning_tokens = tracing::field::Empty,
        );
        let events = match self.inner.body(&request) {
            Ok(body) => {
                let (inner, body) = (Arc::clone(&self.inner), Arc::new(body));
                // A `response.failed` (rate limit, overloaded) after HTTP 200 but before any
                // output is asked again; once something was emitted, an error is final.
                retry_before_first_event(self.inner.http.retry, move |failed| {
                    attempt(Arc::clone(&inner), Arc::clone(&body), failed)
                })
            }
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        };
        Box::pin(Instrumented { inner: events, span })
    }
}

/// One request and its answer, as events. A failure of `send` (its retries spent) ends the
/// stream and is handed to `failed`, so it is not asked again.
fn attempt(
    inner: Arc<Inner>,
    body: Arc<Value>,
    failed: SendFailure,
) -> impl futures::Stream<Item = Result<ModelEvent, ModelError>> + Send + 'static {
    async_stream::try_stream! {
        let limit = inner.http.max_response_bytes;
        let response = match inner.http.send(&body, "text/event-stream").await {
            Ok(response) => response,
            Err(e) => {
                failed.keep(e);
                return;
            }
        };
        let mut assembler = Assembler::default();
        if read::is_json(&response) {
            // A server (or proxy) that ignored `stream: true` and sent the whole response.
            let body = read::read_bounded(response, limit).await?;
            for event in assembler.on_response_body(&body)? {
                record(&event);
                yield event;
            }
            return;
        }
        let mut events = std::pin::pin!(read::sse_events(response, limit));
        while let Some(event) = events.next().await {
            for event in assembler.on_event(&event?)? {
                record(&event);
                yield event;
            }
            if assembler.done {
                return;
            }
        }
        assembler.end()?;
    }
}

/// Puts the finish reason and token counts on the request's span.
fn record(event: &ModelEvent) {
    if let ModelEvent::Finish { reason, usage } = event {
        let span = tracing::Span::current();
        span.record("finish_reason", tracing::field::debug(reason));
        span.record("input_tokens", usage.input_tokens);
        span.record("output_tokens", usage.output_tokens);
        span.record("cache_read_tokens", usage.cache_read_tokens);
        span.record("reasoning_tokens", usage.reasoning_tokens);
    }
}
