//! The OpenAI-compatible chat-completions client: request encoding, retries, and a hand-written
//! SSE parser that assembles streamed tool calls.

use std::{
    collections::BTreeMap,
    fmt,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::{Stream, StreamExt, stream::BoxStream};
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::{
    Model,
    model::{FinishReason, Message, ModelError, ModelEvent, ModelRequest, ToolCallRequest, Usage},
    schema,
};

/// The base URL used when none is configured: OpenAI's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The model id [`OpenAi::from_env_if_configured`] suggests when `OPENAI_MODEL` is unset.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_MAX_RETRIES: u32 = 3;
const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(200);
const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(5);
/// How much of an error response body is read for its message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// The largest single SSE event accepted; a larger one is a protocol error, not unbounded memory.
const MAX_EVENT_BYTES: usize = 16 << 20;

/// Why an [`OpenAi`] client could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No API key and no base URL: OpenAI itself always needs a key.
    #[error("no API key: set OPENAI_API_KEY, or OPENAI_BASE_URL for a local server that needs none")]
    MissingApiKey,
    /// [`OpenAiBuilder::model`] was never called.
    #[error("no model id: call `OpenAiBuilder::model`")]
    MissingModel,
    /// The base URL is not an absolute `http`/`https` URL.
    #[error("invalid base URL `{url}`: {message}")]
    InvalidBaseUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// A header name or value (including the API key) is not valid in HTTP.
    #[error("invalid header `{name}`: {message}")]
    InvalidHeader {
        /// The header name.
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// The HTTP client (TLS setup) could not be built.
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

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
}

#[derive(Debug, Clone, Copy)]
struct Retry {
    max_retries: u32,
    base: Duration,
    max: Duration,
}

impl Retry {
    /// The wait before retry number `attempt` (1-based): the server's hint if it gave one,
    /// otherwise `base * 2^(attempt-1)`; never more than `max`.
    fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        let backoff = || self.base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)));
        hint.unwrap_or_else(backoff).min(self.max)
    }
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

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl OpenAi {
    /// A builder; see [`OpenAiBuilder`] for the defaults.
    pub fn builder() -> OpenAiBuilder {
        OpenAiBuilder::default()
    }

    /// A client for `model` configured from the environment: `OPENAI_API_KEY` and
    /// `OPENAI_BASE_URL` (default [`DEFAULT_BASE_URL`]). A missing key is allowed when a base URL
    /// is set, for local servers such as Ollama that need none. Empty variables count as unset.
    ///
    /// # Errors
    /// [`ConfigError::MissingApiKey`] when neither variable is set; [`ConfigError`] for an
    /// invalid URL or key.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(model.into(), env_var)
    }

    /// Like [`OpenAi::from_env`], but `None` when neither `OPENAI_API_KEY` nor `OPENAI_BASE_URL`
    /// is set, so an example can fall back to a scripted model. The model id is `OPENAI_MODEL`
    /// when set, else `default_model` (for example [`DEFAULT_MODEL`]).
    ///
    /// ```no_run
    /// use kuralle::models::{DEFAULT_MODEL, OpenAi};
    /// match OpenAi::from_env_if_configured(DEFAULT_MODEL) {
    ///     Some(Ok(model)) => { /* use the real model */ }
    ///     Some(Err(e)) => eprintln!("OpenAI is misconfigured: {e}"),
    ///     None => { /* fall back to kuralle::testing::ScriptedModel */ }
    /// }
    /// ```
    pub fn from_env_if_configured(default_model: &str) -> Option<Result<Self, ConfigError>> {
        Self::from_lookup_if_configured(default_model, env_var)
    }

    fn from_lookup(model: String, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let mut builder = Self::builder().model(model);
        if let Some(key) = get("OPENAI_API_KEY") {
            builder = builder.api_key(key);
        }
        if let Some(url) = get("OPENAI_BASE_URL") {
            builder = builder.base_url(url);
        }
        builder.build()
    }

    fn from_lookup_if_configured(
        default_model: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Result<Self, ConfigError>> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if get("OPENAI_API_KEY").is_none() && get("OPENAI_BASE_URL").is_none() {
            return None;
        }
        let model = get("OPENAI_MODEL").unwrap_or_else(|| default_model.to_owned());
        Some(Self::from_lookup(model, lookup))
    }

    /// The base URL requests go to (without `/chat/completions`).
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }
}

/// Configures an [`OpenAi`] client.
///
/// Defaults: base URL [`DEFAULT_BASE_URL`], no temperature or `max_tokens` (the server's
/// defaults), strict tool schemas on, a 120 s timeout, and 3 retries with backoff from 200 ms
/// doubling up to 5 s.
#[derive(Clone)]
pub struct OpenAiBuilder {
    base_url: Option<String>,
    api_key: Option<String>,
    model: Option<String>,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    headers: Vec<(String, String)>,
    timeout: Duration,
    strict_tools: bool,
    retry: Retry,
}

impl Default for OpenAiBuilder {
    fn default() -> Self {
        Self {
            base_url: None,
            api_key: None,
            model: None,
            temperature: None,
            max_tokens: None,
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            strict_tools: true,
            retry: Retry { max_retries: DEFAULT_MAX_RETRIES, base: DEFAULT_RETRY_BASE, max: DEFAULT_RETRY_MAX },
        }
    }
}

impl fmt::Debug for OpenAiBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .field("headers", &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("strict_tools", &self.strict_tools)
            .field("retry", &self.retry)
            .finish()
    }
}

impl OpenAiBuilder {
    /// The API base URL, up to and including the version (`https://api.openai.com/v1`,
    /// `http://localhost:11434/v1`); requests go to `{base_url}/chat/completions`. Setting it
    /// makes the API key optional.
    #[must_use]
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// The API key, sent as `Authorization: Bearer <key>`.
    #[must_use]
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The model id (`gpt-4o-mini`, `llama3.2`); also what [`Model::name`] returns. Required.
    #[must_use]
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sampling temperature; sent only when set.
    #[must_use]
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// The output-token limit (`max_tokens`); sent only when set.
    #[must_use]
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// An extra header on every request (for example `OpenAI-Organization` or a proxy's key).
    /// Validated by [`OpenAiBuilder::build`].
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The longest wait for the response headers, and for each piece of the stream after them
    /// (an idle timeout, so a long answer that keeps streaming is never cut). Also bounds the
    /// connect time.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether tool schemas are sent in OpenAI strict mode (`"strict": true`, with the
    /// [`schema::to_strict`] transform). On by default; turn it off for servers that reject
    /// `strict` or for schemas strict mode cannot express.
    #[must_use]
    pub fn strict_tools(mut self, strict: bool) -> Self {
        self.strict_tools = strict;
        self
    }

    /// How many times a 429, a 5xx or a failed connection is retried (default 3; 0 disables).
    #[must_use]
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.retry.max_retries = retries;
        self
    }

    /// The retry backoff: the first wait is `base`, each next one doubles, none exceeds `max`.
    /// A `Retry-After` from the server replaces the computed wait, also capped at `max`.
    #[must_use]
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.retry.base = base;
        self.retry.max = max;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`ConfigError`] for a missing model, a missing key (when no base URL is set), an
    /// invalid URL or header, or an HTTP client that cannot be built.
    pub fn build(self) -> Result<OpenAi, ConfigError> {
        let model = self.model.filter(|m| !m.trim().is_empty()).ok_or(ConfigError::MissingModel)?;
        let api_key = self.api_key.filter(|k| !k.trim().is_empty());
        if api_key.is_none() && self.base_url.is_none() {
            return Err(ConfigError::MissingApiKey);
        }
        let raw_url = self.base_url.unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        let base_url = raw_url.trim().trim_end_matches('/').to_owned();
        let invalid = |message: String| ConfigError::InvalidBaseUrl { url: raw_url.clone(), message };
        let parsed = reqwest::Url::parse(&base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid(format!("the scheme must be http or https, not `{}`", parsed.scheme())));
        }

        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let bad = |message: String| ConfigError::InvalidHeader { name: name.clone(), message };
            let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let header_value = HeaderValue::from_str(value).map_err(|e| bad(e.to_string()))?;
            headers.append(header_name, header_value);
        }
        if let Some(key) = &api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
                .map_err(|e| ConfigError::InvalidHeader { name: AUTHORIZATION.to_string(), message: e.to_string() })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(self.timeout)
            .read_timeout(self.timeout)
            .build()
            .map_err(|e| ConfigError::Client(error_chain(&e)))?;

        Ok(OpenAi {
            inner: Arc::new(Inner {
                client,
                endpoint: format!("{base_url}/chat/completions"),
                base_url,
                model,
                temperature: self.temperature,
                max_tokens: self.max_tokens,
                strict_tools: self.strict_tools,
                timeout: self.timeout,
                retry: self.retry,
            }),
        })
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
        let events = async_stream::try_stream! {
            let body = body?;
            let response = inner.send(&body).await?;
            if is_json(&response) {
                // A server (or proxy) that ignored `stream: true` and sent one whole completion.
                let body = response.bytes().await.map_err(|e| ModelError::Transport(error_chain(&e)))?;
                for model_event in completion_events(&body)? {
                    yield model_event;
                }
                return;
            }
            let mut bytes = response.bytes_stream();
            let mut sse = SseParser::default();
            let mut assembler = Assembler::default();
            'read: while let Some(chunk) = bytes.next().await {
                let chunk = chunk.map_err(|e| ModelError::Transport(error_chain(&e)))?;
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

impl Inner {
    /// The chat-completions request body for `request`.
    fn body(&self, request: &ModelRequest) -> Result<Value, ModelError> {
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
    async fn send(&self, body: &Value) -> Result<reqwest::Response, ModelError> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            tracing::Span::current().record("attempts", attempt);
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

fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// The events of a non-streamed `chat.completion` object: its message is treated as one delta.
fn completion_events(body: &[u8]) -> Result<Vec<ModelEvent>, ModelError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ModelError::Protocol(format!("invalid completion JSON ({e}): {}", excerpt(&String::from_utf8_lossy(body), 500)))
    })?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        return Err(ModelError::Provider(describe_error(error)));
    }
    let choice = value.get("choices").and_then(|c| c.get(0)).ok_or_else(|| {
        ModelError::Protocol(format!("a completion without choices: {}", excerpt(&value.to_string(), 500)))
    })?;
    let chunk = json!({
        "choices": [{"index": 0, "delta": choice.get("message"), "finish_reason": choice.get("finish_reason")}],
        "usage": value.get("usage"),
    });
    let mut assembler = Assembler { done: true, ..Assembler::default() };
    let mut events = assembler.on_event(&SseEvent { event: None, data: chunk.to_string() })?;
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
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let valid = |n: f64| n.is_finite() && n >= 0.0;
    if let Some(ms) = number("retry-after-ms").filter(|n| valid(*n)) {
        return Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)));
    }
    number("retry-after").filter(|n| valid(*n)).map(|s| Duration::from_secs_f64(s.min(86_400.0)))
}

/// An error and its sources, joined: reqwest's top-level message alone rarely says what failed.
fn error_chain(error: &dyn std::error::Error) -> String {
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

// ---------------------------------------------------------------------------------------------
// Server-sent events.

/// One dispatched server-sent event.
#[derive(Debug, Default, PartialEq, Eq)]
struct SseEvent {
    /// The `event:` field, when present.
    event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    data: String,
}

/// An incremental SSE parser: bytes in (split anywhere, even inside a UTF-8 character), events
/// out at each blank line. Only `data:` and `event:` matter here; comments (`:`), `id:` and
/// `retry:` are ignored.
#[derive(Debug, Default)]
struct SseParser {
    buf: Vec<u8>,
    /// How far `buf` is known to hold no line break.
    scanned: usize,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, ModelError> {
        self.buf.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.buf);
        let mut events = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(offset) = buf[from..].iter().position(|b| *b == b'\n') {
            let end = from + offset;
            let line = buf[start..end].strip_suffix(b"\r").unwrap_or(&buf[start..end]);
            self.line(line, &mut events)?;
            start = end + 1;
            from = start;
        }
        self.buf = buf;
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        if self.buf.len() + self.data.len() > MAX_EVENT_BYTES {
            return Err(ModelError::Protocol(format!("a server-sent event exceeds {MAX_EVENT_BYTES} bytes")));
        }
        Ok(events)
    }

    /// The end of the body: a last line without a line break, and an event without its blank line.
    fn finish(&mut self) -> Result<Vec<SseEvent>, ModelError> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        self.scanned = 0;
        if !rest.is_empty() {
            self.line(rest.strip_suffix(b"\r").unwrap_or(&rest), &mut events)?;
        }
        self.line(b"", &mut events)?;
        Ok(events)
    }

    fn line(&mut self, line: &[u8], events: &mut Vec<SseEvent>) -> Result<(), ModelError> {
        if line.is_empty() {
            if self.has_data {
                events.push(SseEvent { event: self.event.take(), data: std::mem::take(&mut self.data) });
                self.has_data = false;
            }
            self.event = None;
            return Ok(());
        }
        let line = std::str::from_utf8(line)
            .map_err(|e| ModelError::Protocol(format!("a server-sent event line is not UTF-8: {e}")))?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Chunk assembly.

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A string fragment; a server that sends a whole JSON object instead gets it re-encoded.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Turns chunks into events: text at once, tool calls gathered by `index` until the finish.
#[derive(Debug, Default)]
struct Assembler {
    calls: BTreeMap<usize, PartialCall>,
    last_index: Option<usize>,
    emitted_calls: bool,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// `data: [DONE]` arrived.
    done: bool,
}

impl Assembler {
    fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, ModelError> {
        let data = event.data.trim();
        if event.event.as_deref() == Some("error") {
            let message = serde_json::from_str::<Value>(data)
                .map(|v| describe_error(v.get("error").unwrap_or(&v)))
                .unwrap_or_else(|_| excerpt(data, 2000));
            return Err(ModelError::Provider(message));
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!("invalid chunk in the event stream ({e}): {}", excerpt(data, 500)))
        })?;
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(ModelError::Provider(describe_error(&error)));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(Usage {
                input_tokens: usage.prompt_tokens.unwrap_or(0),
                output_tokens: usage.completion_tokens.unwrap_or(0),
            });
        }
        let mut out = Vec::new();
        // Only the first choice is requested (`n` is never sent); others are ignored.
        for choice in chunk.choices.unwrap_or_default().into_iter().filter(|c| c.index.unwrap_or(0) == 0) {
            if let Some(delta) = choice.delta {
                for text in [delta.content, delta.refusal].into_iter().flatten() {
                    if !text.is_empty() {
                        out.push(ModelEvent::TextDelta { delta: text });
                    }
                }
                for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    self.merge(position, call);
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(finish_reason(&reason));
                out.extend(self.flush_calls()?);
            }
        }
        Ok(out)
    }

    /// Adds one tool-call fragment. OpenAI sends `index` on every fragment and `id`/`name` on the
    /// first; servers that omit `index` are matched by `id`, else by the last call touched.
    fn merge(&mut self, position: usize, call: ToolCallDelta) {
        let index = call.index.unwrap_or_else(|| match &call.id {
            Some(id) => self
                .calls
                .iter()
                .find(|(_, c)| c.id.as_deref() == Some(id))
                .map(|(i, _)| *i)
                .unwrap_or_else(|| self.calls.keys().next_back().map_or(position, |last| last + 1)),
            None => self.last_index.unwrap_or(position),
        });
        self.last_index = Some(index);
        let entry = self.calls.entry(index).or_default();
        if let Some(id) = call.id.filter(|id| !id.is_empty()) {
            entry.id.get_or_insert(id);
        }
        if let Some(function) = call.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty())
                && entry.name.is_empty()
            {
                entry.name = name;
            }
            match function.arguments {
                Some(Value::String(fragment)) => entry.arguments.push_str(&fragment),
                Some(Value::Null) | None => {}
                Some(other) => entry.arguments.push_str(&other.to_string()),
            }
        }
    }

    /// The gathered tool calls, in `index` order.
    fn flush_calls(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        let calls = std::mem::take(&mut self.calls);
        self.last_index = None;
        let mut out = Vec::with_capacity(calls.len());
        for (index, call) in calls {
            if call.name.is_empty() {
                return Err(ModelError::Protocol(format!("tool call at index {index} has no function name")));
            }
            self.emitted_calls = true;
            out.push(ModelEvent::ToolCall(ToolCallRequest {
                call_id: call.id.unwrap_or_else(|| format!("call_{index}")),
                name: call.name,
                arguments: call.arguments,
            }));
        }
        Ok(out)
    }

    /// The end of the stream: pending tool calls and the [`ModelEvent::Finish`], or a protocol
    /// error when the response was cut short (neither a finish reason nor `[DONE]` arrived).
    fn end(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        if !self.done && self.finish.is_none() {
            return Err(ModelError::Protocol(
                "the event stream ended without a finish_reason or [DONE] (truncated response)".into(),
            ));
        }
        let mut out = self.flush_calls()?;
        let reason = match self.finish.take() {
            // Some servers report `stop` after tool calls; the model is waiting for results.
            Some(FinishReason::Stop) | None if self.emitted_calls => FinishReason::ToolCalls,
            Some(reason) => reason,
            None => FinishReason::Stop,
        };
        out.push(ModelEvent::Finish { reason, usage: self.usage.unwrap_or_default() });
        Ok(out)
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

// ---------------------------------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(pieces: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(parser.push(piece).unwrap());
        }
        events.extend(parser.finish().unwrap());
        events
    }

    #[test]
    fn sse_events_survive_every_split_point() {
        let body =
            "data: {\"a\":\"é\"}\r\n\r\n: keep-alive\n\nevent: error\ndata: x\ndata: y\n\ndata: [DONE]\n\n".as_bytes();
        let expected = vec![
            SseEvent { event: None, data: "{\"a\":\"é\"}".into() },
            SseEvent { event: Some("error".into()), data: "x\ny".into() },
            SseEvent { event: None, data: "[DONE]".into() },
        ];
        assert_eq!(parse_all(&[body]), expected);
        for split in 0..body.len() {
            assert_eq!(parse_all(&[&body[..split], &body[split..]]), expected, "split at {split}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse_all(&bytes), expected);
    }

    #[test]
    fn sse_last_event_without_blank_line_is_dispatched_at_the_end() {
        assert_eq!(parse_all(&[b"data: [DONE]"]), vec![SseEvent { event: None, data: "[DONE]".into() }]);
    }

    #[test]
    fn retry_delays_double_and_are_capped() {
        let retry = Retry { max_retries: 5, base: Duration::from_millis(200), max: Duration::from_secs(1) };
        let delays: Vec<_> = (1..=4).map(|a| retry.delay(a, None).as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1000]);
        assert_eq!(retry.delay(1, Some(Duration::from_secs(30))), Duration::from_secs(1));
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(150)));
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn environment_configuration() {
        let err = OpenAi::from_lookup("m".into(), vars(&[])).unwrap_err();
        assert_eq!(err, ConfigError::MissingApiKey);
        let openai = OpenAi::from_lookup("gpt-4o-mini".into(), vars(&[("OPENAI_API_KEY", "sk-test")])).unwrap();
        assert_eq!(openai.base_url(), DEFAULT_BASE_URL);
        assert_eq!(openai.name(), "gpt-4o-mini");
        assert!(!format!("{openai:?}").contains("sk-test"));
        let local =
            OpenAi::from_lookup("llama3.2".into(), vars(&[("OPENAI_BASE_URL", "http://localhost:11434/v1/")])).unwrap();
        assert_eq!(local.base_url(), "http://localhost:11434/v1");
        assert_eq!(local.inner.endpoint, "http://localhost:11434/v1/chat/completions");

        assert!(OpenAi::from_lookup_if_configured(DEFAULT_MODEL, vars(&[("OPENAI_API_KEY", " ")])).is_none());
        let configured = OpenAi::from_lookup_if_configured(
            DEFAULT_MODEL,
            vars(&[("OPENAI_BASE_URL", "http://localhost:11434/v1"), ("OPENAI_MODEL", "qwen3")]),
        );
        assert_eq!(configured.unwrap().unwrap().name(), "qwen3");
        let default = OpenAi::from_lookup_if_configured(DEFAULT_MODEL, vars(&[("OPENAI_API_KEY", "k")]));
        assert_eq!(default.unwrap().unwrap().name(), DEFAULT_MODEL);
    }

    #[test]
    fn builder_validation() {
        assert_eq!(OpenAi::builder().api_key("k").build().unwrap_err(), ConfigError::MissingModel);
        let bad_url = OpenAi::builder().base_url("ftp://x").model("m").build().unwrap_err();
        assert!(matches!(bad_url, ConfigError::InvalidBaseUrl { .. }), "{bad_url}");
        let bad_header = OpenAi::builder().api_key("k").model("m").header("bad header", "v").build().unwrap_err();
        assert!(matches!(bad_header, ConfigError::InvalidHeader { .. }), "{bad_header}");
    }
}
