//! The settings every client's builder shares, their defaults, and how they become an
//! [`Http`](super::Http): base URL checks, headers (the API key marked sensitive, so it is
//! never in `Debug`, spans or errors), timeouts and the retry budget.

use std::{fmt, time::Duration};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::{Http, error_chain};

pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_MAX_RETRIES: u32 = 3;
const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(200);
const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(5);

/// The default largest response body a client reads: 16 MiB, the size of the largest value a
/// store journals ([`DEFAULT_MAX_VALUE_BYTES`](crate::stores::DEFAULT_MAX_VALUE_BYTES)), so a
/// response the client accepts can also be journaled.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Why a model client could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No API key (and, for OpenAI-compatible servers, no base URL that needs none).
    #[error("no API key: set OPENAI_API_KEY, or OPENAI_BASE_URL for a local server that needs none")]
    MissingApiKey,
    /// No API key for a provider that always needs one; names the variable to set.
    #[error("no API key: set {0}")]
    MissingKey(&'static str),
    /// The builder's `model` was never called.
    #[error("no model id: call the builder's `model`")]
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
    /// A setting has a value the provider cannot accept.
    #[error("invalid setting `{name}`: {message}")]
    InvalidSetting {
        /// The setting.
        name: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The HTTP client (TLS setup) could not be built.
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

/// The retry budget: how many retries, and the backoff between them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    pub(crate) max_retries: u32,
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self { max_retries: DEFAULT_MAX_RETRIES, base: DEFAULT_RETRY_BASE, max: DEFAULT_RETRY_MAX }
    }
}

impl Retry {
    /// The wait before retry number `attempt` (1-based): the server's hint if it gave one,
    /// otherwise a random wait between half and all of `base * 2^(attempt-1)` ("equal
    /// jitter", so clients that failed together do not retry in lockstep); never more than
    /// `max`.
    pub(crate) fn delay(&self, attempt: u32, hint: Option<Duration>) -> Duration {
        if let Some(hint) = hint {
            return hint.min(self.max);
        }
        let backoff = self.base.saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1))).min(self.max);
        let half = backoff / 2;
        let spread = u64::try_from((backoff - half).as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(fastrand::u64(0..=spread))
    }
}

/// The builder settings every client has. A client's builder holds one and forwards its
/// setters here.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) base_url: Option<String>,
    pub(crate) api_key: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) timeout: Duration,
    pub(crate) retry: Retry,
    pub(crate) max_response_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            base_url: None,
            api_key: None,
            model: None,
            headers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            retry: Retry::default(),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("headers", &self.headers.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Options {
    /// The model id, required.
    pub(crate) fn model(&self) -> Result<String, ConfigError> {
        self.model.clone().filter(|m| !m.trim().is_empty()).ok_or(ConfigError::MissingModel)
    }

    /// The API key, if one was given and is not blank.
    pub(crate) fn key(&self) -> Option<&str> {
        self.api_key.as_deref().map(str::trim).filter(|k| !k.is_empty())
    }

    /// The base URL (or `default`), checked and without a trailing `/`.
    pub(crate) fn base_url(&self, default: &str) -> Result<String, ConfigError> {
        let raw_url = self.base_url.clone().unwrap_or_else(|| default.to_owned());
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
        Ok(base_url)
    }

    /// The client for `endpoint`, sending the configured headers and `secret` (the API key
    /// header, marked sensitive) on every request.
    pub(crate) fn http(&self, endpoint: String, secret: Option<(HeaderName, String)>) -> Result<Http, ConfigError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let bad = |message: String| ConfigError::InvalidHeader { name: name.clone(), message };
            let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(e.to_string()))?;
            let header_value = HeaderValue::from_str(value).map_err(|e| bad(e.to_string()))?;
            headers.append(header_name, header_value);
        }
        if let Some((name, value)) = secret {
            let mut value = HeaderValue::from_str(&value)
                .map_err(|e| ConfigError::InvalidHeader { name: name.to_string(), message: e.to_string() })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(self.timeout)
            .read_timeout(self.timeout)
            .build()
            .map_err(|e| ConfigError::Client(error_chain(&e)))?;
        Ok(Http {
            client,
            endpoint,
            timeout: self.timeout,
            retry: self.retry,
            max_response_bytes: self.max_response_bytes,
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

/// The setters every client builder forwards to its [`Options`], with one set of docs.
macro_rules! forward_http_options {
    ($builder:ident, $client:literal, $path:literal) => {
        impl $builder {
            #[doc = concat!("The API base URL; requests go to `{base_url}", $path, "`.")]
            #[must_use]
            pub fn base_url(mut self, url: impl Into<String>) -> Self {
                self.options.base_url = Some(url.into());
                self
            }

            /// The API key. It is sent marked sensitive and never shown in `Debug`, spans or
            /// errors.
            #[must_use]
            pub fn api_key(mut self, key: impl Into<String>) -> Self {
                self.options.api_key = Some(key.into());
                self
            }

            #[doc = concat!("The model id; also what [`Model::name`](crate::Model::name) returns for a `", $client, "`. Required.")]
            #[must_use]
            pub fn model(mut self, model: impl Into<String>) -> Self {
                self.options.model = Some(model.into());
                self
            }

            /// An extra header on every request (a proxy's key, say). Validated by `build`.
            #[must_use]
            pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
                self.options.headers.push((name.into(), value.into()));
                self
            }

            /// The longest wait for the response headers, and for each piece of the stream
            /// after them (an idle timeout, so a long answer that keeps streaming is never
            /// cut). Also bounds the connect time. Default 120 s.
            #[must_use]
            pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
                self.options.timeout = timeout;
                self
            }

            /// How many times a 429, a 5xx, an overloaded answer or a failed connection is
            /// retried before anything of the response was emitted (default 3; 0 disables).
            #[must_use]
            pub fn max_retries(mut self, retries: u32) -> Self {
                self.options.retry.max_retries = retries;
                self
            }

            /// The retry backoff: the first wait is up to `base`, each next one doubles, none
            /// exceeds `max`; each wait is drawn at random from its upper half (jitter). A
            /// `Retry-After` from the server replaces the computed wait, also capped at `max`.
            #[must_use]
            pub fn retry_backoff(mut self, base: std::time::Duration, max: std::time::Duration) -> Self {
                self.options.retry.base = base;
                self.options.retry.max = max;
                self
            }

            /// The largest response body read, streamed or not (default 16 MiB). It is
            /// enforced while reading: a longer body is refused with
            /// [`ModelError::TooLarge`](crate::ModelError::TooLarge) as soon as it passes the
            /// limit, so a misbehaving server costs at most about twice this much memory.
            #[must_use]
            pub fn max_response_bytes(mut self, limit: usize) -> Self {
                self.options.max_response_bytes = limit;
                self
            }
        }
    };
}
pub(crate) use forward_http_options;

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn base_urls_are_checked() {
        let with = |url: &str| Options { base_url: Some(url.into()), ..Options::default() }.base_url("https://x");
        assert_eq!(with("http://localhost:11434/v1/").unwrap(), "http://localhost:11434/v1");
        for url in ["ftp://x", "http://127.0.0.1:/v1", "http://user:pw@localhost:", "http://localhost:0/v1"] {
            assert!(matches!(with(url), Err(ConfigError::InvalidBaseUrl { .. })), "{url}");
        }
        assert!(with("http://[::1]:8080/v1").is_ok());
    }

    #[test]
    fn the_key_is_never_in_debug() {
        let options = Options { api_key: Some("sk-secret".into()), ..Options::default() };
        assert!(!format!("{options:?}").contains("sk-secret"));
    }
}
