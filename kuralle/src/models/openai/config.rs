//! Configuring an [`OpenAi`] client: the builder, its defaults, and the environment.

use std::{fmt, sync::Arc, time::Duration};

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};

use super::{DEFAULT_BASE_URL, DEFAULT_MAX_RESPONSE_BYTES, Inner, OpenAi, request::error_chain};

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_MAX_RETRIES: u32 = 3;
const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(200);
const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(5);

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

#[derive(Debug, Clone, Copy)]
pub(super) struct Retry {
    pub(super) max_retries: u32,
    pub(super) base: Duration,
    pub(super) max: Duration,
}

impl Retry {
    /// The wait before retry number `attempt` (1-based): the server's hint if it gave one,
    /// otherwise a random wait between half and all of `base * 2^(attempt-1)` ("equal
    /// jitter", so clients that failed together do not retry in lockstep); never more than
    /// `max`.
    pub(super) fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        if let Some(hint) = hint {
            return hint.min(self.max);
        }
        let backoff = self.base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1))).min(self.max);
        let half = backoff / 2;
        let spread = u64::try_from((backoff - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(fastrand::u64(0..=spread))
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
    /// when set, else `default_model` (for example [`DEFAULT_MODEL`](super::DEFAULT_MODEL)).
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
    max_response_bytes: usize,
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
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
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
            .field("max_response_bytes", &self.max_response_bytes)
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

    /// The model id (`gpt-4o-mini`, `llama3.2`); also what [`Model::name`](crate::Model::name) returns. Required.
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

    /// The retry backoff: the first wait is up to `base`, each next one doubles, none exceeds
    /// `max`; each wait is drawn at random from its upper half (jitter). A `Retry-After` from
    /// the server replaces the computed wait, also capped at `max`.
    #[must_use]
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.retry.base = base;
        self.retry.max = max;
        self
    }

    /// The largest response body read (default [`DEFAULT_MAX_RESPONSE_BYTES`]), streamed or
    /// not. It is enforced while reading: a longer body is refused with
    /// [`ModelError::TooLarge`](crate::ModelError::TooLarge) as soon as it passes the limit, so
    /// a misbehaving server costs at most about twice this much memory.
    ///
    /// ```
    /// let client = kuralle::models::OpenAi::builder()
    ///     .base_url("http://localhost:11434/v1")
    ///     .model("llama3.2")
    ///     .max_response_bytes(4 << 20)
    ///     .build()
    ///     .unwrap();
    /// # let _ = client;
    /// ```
    #[must_use]
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
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
        if has_empty_port(&base_url) {
            // The URL standard reads `host:` as "the default port"; here it is almost always a
            // port left out of a template, and port 80 would be the wrong server.
            return Err(invalid("the port after `:` is empty".into()));
        }
        if parsed.port() == Some(0) {
            return Err(invalid("port 0 cannot be connected to".into()));
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
                max_response_bytes: self.max_response_bytes,
            }),
        })
    }
}

/// Whether the authority of `url` ends in a `:` with no port after it (`http://host:/v1`).
fn has_empty_port(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else { return false };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    host_port.ends_with(':')
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::{
        super::{DEFAULT_MODEL, request::retry_after},
        *,
    };
    use crate::Model;

    #[test]
    fn retry_delays_double_and_are_capped() {
        let retry = Retry { max_retries: 5, base: Duration::from_millis(200), max: Duration::from_secs(1) };
        for (attempt, full) in [(1, 200), (2, 400), (3, 800), (4, 1000), (9, 1000)] {
            let samples: Vec<u128> = (0..200).map(|_| retry.delay(attempt, None).as_millis()).collect();
            assert!(samples.iter().all(|d| (full / 2..=full).contains(d)), "attempt {attempt}: {samples:?}");
            // Jitter: clients that failed together do not all wait the same time.
            assert!(samples.iter().any(|d| *d != samples[0]), "attempt {attempt} has no jitter");
        }
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
        for url in ["http://127.0.0.1:/v1", "http://user:pw@localhost:", "http://localhost:0/v1"] {
            let err = OpenAi::builder().base_url(url).model("m").build().unwrap_err();
            assert!(matches!(err, ConfigError::InvalidBaseUrl { .. }), "{url}: {err}");
        }
        let err = OpenAi::from_lookup("m".into(), vars(&[("OPENAI_BASE_URL", "http://127.0.0.1:/v1")])).unwrap_err();
        assert!(matches!(&err, ConfigError::InvalidBaseUrl { message, .. } if message.contains("port")), "{err}");
        assert!(OpenAi::builder().base_url("http://[::1]:8080/v1").model("m").build().is_ok());
        assert!(OpenAi::builder().base_url("http://localhost/v1").model("m").build().is_ok());
        let bad_header = OpenAi::builder().api_key("k").model("m").header("bad header", "v").build().unwrap_err();
        assert!(matches!(bad_header, ConfigError::InvalidHeader { .. }), "{bad_header}");
    }
}
