//! Configuring an [`OpenAi`] client: the builder, its defaults, and the environment.

use std::{fmt, sync::Arc};

use reqwest::header::AUTHORIZATION;

use super::{DEFAULT_BASE_URL, Inner, OpenAi};
use crate::models::http::{ConfigError, Options, options::forward_http_options};

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
/// doubling up to 5 s. Setting a base URL makes the API key optional (local servers such as
/// Ollama need none).
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
#[derive(Clone)]
pub struct OpenAiBuilder {
    options: Options,
    temperature: Option<f64>,
    max_tokens: Option<u32>,
    strict_tools: bool,
}

impl Default for OpenAiBuilder {
    fn default() -> Self {
        Self { options: Options::default(), temperature: None, max_tokens: None, strict_tools: true }
    }
}

impl fmt::Debug for OpenAiBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiBuilder")
            .field("options", &self.options)
            .field("temperature", &self.temperature)
            .field("max_tokens", &self.max_tokens)
            .field("strict_tools", &self.strict_tools)
            .finish()
    }
}

forward_http_options!(OpenAiBuilder, "OpenAi", "/chat/completions");

impl OpenAiBuilder {
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

    /// Whether tool schemas are sent in OpenAI strict mode (`"strict": true`, with the
    /// [`schema::to_strict`](crate::schema::to_strict) transform). On by default; turn it off for servers that reject
    /// `strict` or for schemas strict mode cannot express.
    #[must_use]
    pub fn strict_tools(mut self, strict: bool) -> Self {
        self.strict_tools = strict;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`ConfigError`] for a missing model, a missing key (when no base URL is set), an
    /// invalid URL or header, or an HTTP client that cannot be built.
    pub fn build(self) -> Result<OpenAi, ConfigError> {
        let model = self.options.model()?;
        let key = self.options.key().map(str::to_owned);
        if key.is_none() && self.options.base_url.is_none() {
            return Err(ConfigError::MissingApiKey);
        }
        let base_url = self.options.base_url(DEFAULT_BASE_URL)?;
        let http = self
            .options
            .http(format!("{base_url}/chat/completions"), key.map(|k| (AUTHORIZATION, format!("Bearer {k}"))))?;
        Ok(OpenAi {
            inner: Arc::new(Inner {
                http,
                base_url,
                model,
                temperature: self.temperature,
                max_tokens: self.max_tokens,
                strict_tools: self.strict_tools,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{super::DEFAULT_MODEL, *};
    use crate::Model;

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
        assert_eq!(local.inner.http.endpoint, "http://localhost:11434/v1/chat/completions");

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
