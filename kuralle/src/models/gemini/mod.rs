//! The Gemini API client (`generateContent` / `streamGenerateContent`), one idea per file:
//! [`config`] (the builder and the environment), [`request`] (the request body and the tool
//! schema transform) and [`assemble`] (response chunks into [`ModelEvent`]s). Sending, retries
//! and bounded reading are shared ([`http`](crate::models::http)).
//!
//! What this wire needs beyond the others:
//! - `functionCall` parts arrive whole and often without an `id`. Each call gets an id the
//!   client derives from the response itself (see [`assemble`]), so the same response parsed
//!   twice gives the same ids and the journal's keys stay stable; Gemini's own id, when it
//!   sends one, is the call id and is kept on the part ([`Part::ToolCall`]'s `id`) so that it,
//!   and only it, goes back in `functionCall.id` and `functionResponse.id`.
//! - `thoughtSignature` may sit on any part (thought text, answer text, a call, an empty text
//!   part); it is kept on the part it came with and sent back on that part, in that position.
//! - `finishReason` says `STOP` on a function-call turn, and is decided at the end of the
//!   stream.
//!
//! [`Part::ToolCall`]: crate::Part::ToolCall

mod assemble;
mod config;
mod request;

use std::{fmt, sync::Arc};

pub use config::GeminiBuilder;
use futures::{Stream, StreamExt, stream::BoxStream};
use serde_json::Value;

use crate::{
    Model,
    model::{ModelError, ModelEvent, ModelRequest},
    models::http::{
        Http, Instrumented, read,
        send::{SendFailure, retry_before_first_event},
    },
};

/// What [`Model::provider`] says for this wire.
pub(crate) const PROVIDER: &str = "gemini";

/// The base URL used when none is configured: Google's Gemini API.
const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// The model id [`Gemini::from_env_if_configured`] suggests when `GEMINI_MODEL` is unset.
///
/// ```
/// assert_eq!(kuralle::models::DEFAULT_GEMINI_MODEL, "gemini-2.5-flash");
/// ```
pub const DEFAULT_GEMINI_MODEL: &str = "gemini-2.5-flash";

/// A [`Model`] speaking Google's Gemini API.
///
/// Each [`Model::stream`] call POSTs
/// `{base_url}/v1beta/models/{model}:streamGenerateContent?alt=sse` (or `:generateContent`
/// with [`GeminiBuilder::streaming`] off) with the key in the `x-goog-api-key` header, never in
/// the URL. 429 and 5xx answers are retried with bounded, jittered backoff (honouring
/// `Retry-After`), and so is a stream that reports the model overloaded before its first
/// event. The response becomes [`ModelEvent`]s: answer and thought text as it arrives, each
/// function call as soon as its part arrives, every thought signature on the part it came
/// with, then one [`ModelEvent::Finish`] with the token usage. Dropping the stream cancels the
/// request. Cloning is cheap and shares the connection pool.
///
/// The transcript goes back as Gemini needs it: a Gemini turn with every part it had, thought
/// signatures on the parts they came with and call ids only where Gemini gave them; the tool
/// results of a turn as one `user` content of `functionResponse` parts, in call order (a
/// result that is not a JSON object is sent as `{"result": value}`). A turn from another
/// provider goes with its text and calls only, its first call marked with the signature
/// Google documents for calls Gemini did not produce (`skip_thought_signature_validator`),
/// which Gemini 3 requires.
///
/// ```
/// use kuralle::{Model, models::Gemini};
///
/// let model = Gemini::builder()
///     .api_key("AIza-test-key")
///     .model("gemini-2.5-flash")
///     .thinking_budget(1024)
///     .max_output_tokens(4096)
///     .build()
///     .unwrap();
/// assert_eq!((model.name(), model.provider()), ("gemini-2.5-flash", "gemini"));
/// // The key is never shown.
/// assert!(!format!("{model:?}").contains("AIza-test-key"));
/// ```
#[derive(Clone)]
pub struct Gemini {
    inner: Arc<Inner>,
}

struct Inner {
    http: Http,
    base_url: String,
    model: String,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    thinking_budget: Option<i32>,
    thinking_level: Option<String>,
    streaming: bool,
}

impl fmt::Debug for Gemini {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gemini")
            .field("model", &self.inner.model)
            .field("base_url", &self.inner.base_url)
            .field("streaming", &self.inner.streaming)
            .finish_non_exhaustive()
    }
}

impl Model for Gemini {
    fn name(&self) -> &str {
        &self.inner.model
    }

    fn provider(&self) -> &str {
        PROVIDER
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let inner = Arc::clone(&self.inner);
        let span = tracing::info_span!(
            "gemini.generate_content",
            model = %inner.model,
            url = %inner.http.endpoint,
            attempts = tracing::field::Empty,
            finish_reason = tracing::field::Empty,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
        );
        let body = inner.body(&request);
        // Call ids are derived from the response and from where it stands in the run, so two
        // turns of one run that call the same tool the same way still get distinct ids.
        let turn = request.messages.len();
        let events = async_stream::try_stream! {
            let body = Arc::new(body?);
            let mut events = {
                let inner = Arc::clone(&inner);
                retry_before_first_event(inner.http.retry, move |failed| {
                    Arc::clone(&inner).read(Arc::clone(&body), turn, failed)
                })
            };
            while let Some(event) = events.next().await {
                let event = event?;
                if let ModelEvent::Finish { reason, usage } = &event {
                    let span = tracing::Span::current();
                    span.record("finish_reason", tracing::field::debug(reason));
                    span.record("input_tokens", usage.input_tokens);
                    span.record("output_tokens", usage.output_tokens);
                }
                yield event;
            }
        };
        Box::pin(Instrumented { inner: events, span })
    }
}

impl Inner {
    fn accept(&self) -> &'static str {
        if self.streaming { "text/event-stream" } else { "application/json" }
    }

    /// One request and its answer, read to the end. A failure of `send` ends the stream and
    /// is handed to `failed`.
    fn read(
        self: Arc<Self>,
        body: Arc<Value>,
        turn: usize,
        failed: SendFailure,
    ) -> impl Stream<Item = Result<ModelEvent, ModelError>> + Send + 'static {
        async_stream::try_stream! {
            let response = match self.http.send(&body, self.accept()).await {
                Ok(response) => response,
                Err(error) => {
                    failed.keep(key_refused(error));
                    return;
                }
            };
            let limit = self.http.max_response_bytes;
            if read::is_json(&response) {
                // `:generateContent`, or a server that answered the stream as one JSON array.
                let body = read::read_bounded(response, limit).await?;
                for event in assemble::whole_body(&body, turn)? {
                    yield event;
                }
                return;
            }
            let mut events = std::pin::pin!(read::sse_events(response, limit));
            let mut assembler = assemble::Assembler::new(turn);
            while let Some(event) = events.next().await {
                for model_event in assembler.on_event(&event?)? {
                    yield model_event;
                }
            }
            for model_event in assembler.end()? {
                yield model_event;
            }
        }
    }
}

/// Gemini answers a wrong key with 400 `INVALID_ARGUMENT` (reason `API_KEY_INVALID`), not
/// 401; it is a credentials error all the same, and never worth retrying.
fn key_refused(error: ModelError) -> ModelError {
    match error {
        ModelError::Http { status: 400, message, .. }
            if message.contains("API key not valid") || message.contains("API_KEY_INVALID") =>
        {
            ModelError::Auth { status: 400, message }
        }
        other => other,
    }
}
