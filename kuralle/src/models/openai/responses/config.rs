//! Configuring an [`OpenAiResponses`] client: the builder, its defaults, and the environment.

use std::{fmt, sync::Arc};

use reqwest::header::AUTHORIZATION;

use super::{super::DEFAULT_BASE_URL, Inner, OpenAiResponses};
use crate::models::http::{ConfigError, Options, options::forward_http_options};

/// The reasoning efforts the API documents (`none` only for models that can skip reasoning).
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high"];
/// The reasoning summary settings the API documents.
const SUMMARIES: &[&str] = &["auto", "concise", "detailed"];

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl OpenAiResponses {
    /// A builder; see [`OpenAiResponsesBuilder`] for the defaults.
    ///
    /// ```
    /// let model = kuralle::models::OpenAiResponses::builder().api_key("sk-test").model("o4-mini").build().unwrap();
    /// assert_eq!(model.base_url(), "https://api.openai.com/v1");
    /// ```
    pub fn builder() -> OpenAiResponsesBuilder {
        OpenAiResponsesBuilder::default()
    }

    /// A client for `model` configured from the environment: `OPENAI_API_KEY` and
    /// `OPENAI_BASE_URL` (default `https://api.openai.com/v1`; requests go to
    /// `{base_url}/responses`). A missing key is allowed when a base URL is set, for servers
    /// that need none. Empty variables count as unset.
    ///
    /// ```no_run
    /// let model = kuralle::models::OpenAiResponses::from_env("gpt-5-mini")?;
    /// # Ok::<(), kuralle::models::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::MissingApiKey`] when neither variable is set; [`ConfigError`] for an
    /// invalid URL or key.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(model.into(), env_var)
    }

    /// Like [`OpenAiResponses::from_env`], but `None` when neither `OPENAI_API_KEY` nor
    /// `OPENAI_BASE_URL` is set, so an example can fall back to a scripted model. The model id
    /// is `OPENAI_MODEL` when set, else `default_model` (for example
    /// [`DEFAULT_RESPONSES_MODEL`](super::DEFAULT_RESPONSES_MODEL)).
    ///
    /// ```no_run
    /// use kuralle::models::{DEFAULT_RESPONSES_MODEL, OpenAiResponses};
    /// match OpenAiResponses::from_env_if_configured(DEFAULT_RESPONSES_MODEL) {
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

    /// The base URL requests go to (without `/responses`).
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }
}

/// Configures an [`OpenAiResponses`] client.
///
/// Defaults: base URL `https://api.openai.com/v1`, no reasoning settings, temperature or
/// output limit (the server's defaults), strict tool schemas on, a 120 s timeout, and 3
/// retries with backoff from 200 ms doubling up to 5 s. Setting a base URL makes the API key
/// optional.
///
/// ```
/// use kuralle::models::{ConfigError, OpenAiResponses};
/// let client = OpenAiResponses::builder()
///     .api_key("sk-test")
///     .model("o4-mini")
///     .reasoning_effort("high")
///     .reasoning_summary("detailed")
///     .max_output_tokens(8192)
///     .build()
///     .unwrap();
/// # let _ = client;
/// let err = OpenAiResponses::builder().api_key("k").model("o4-mini").reasoning_effort("extreme").build().unwrap_err();
/// assert!(matches!(err, ConfigError::InvalidSetting { name: "reasoning_effort", .. }));
/// ```
#[derive(Clone)]
pub struct OpenAiResponsesBuilder {
    options: Options,
    reasoning_effort: Option<String>,
    reasoning_summary: Option<String>,
    encrypted_reasoning: Option<bool>,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    strict_tools: bool,
}

impl Default for OpenAiResponsesBuilder {
    fn default() -> Self {
        Self {
            options: Options::default(),
            reasoning_effort: None,
            reasoning_summary: None,
            encrypted_reasoning: None,
            max_output_tokens: None,
            temperature: None,
            strict_tools: true,
        }
    }
}

impl fmt::Debug for OpenAiResponsesBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiResponsesBuilder")
            .field("options", &self.options)
            .field("reasoning_effort", &self.reasoning_effort)
            .field("reasoning_summary", &self.reasoning_summary)
            .field("encrypted_reasoning", &self.encrypted_reasoning)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("temperature", &self.temperature)
            .field("strict_tools", &self.strict_tools)
            .finish()
    }
}

forward_http_options!(OpenAiResponsesBuilder, "OpenAiResponses", "/responses");

impl OpenAiResponsesBuilder {
    /// How hard a reasoning model thinks: `"minimal"`, `"low"`, `"medium"` or `"high"` (and
    /// `"none"` for models that can skip reasoning), sent as `reasoning.effort`. Checked by
    /// `build`. Setting it also asks for the encrypted reasoning that goes back with the turn
    /// (see [`encrypted_reasoning`](Self::encrypted_reasoning)).
    #[must_use]
    pub fn reasoning_effort(mut self, effort: impl Into<String>) -> Self {
        self.reasoning_effort = Some(effort.into());
        self
    }

    /// Reasoning summaries to stream for display: `"auto"`, `"concise"` or `"detailed"`, sent
    /// as `reasoning.summary`. Checked by `build`. Like
    /// [`reasoning_effort`](Self::reasoning_effort), it also asks for encrypted reasoning.
    #[must_use]
    pub fn reasoning_summary(mut self, summary: impl Into<String>) -> Self {
        self.reasoning_summary = Some(summary.into());
        self
    }

    /// Whether to ask for `include: ["reasoning.encrypted_content"]`, which a reasoning
    /// model needs for its reasoning to go back with the turn when nothing is stored
    /// (`store: false`). By default it is asked for exactly when a reasoning effort or
    /// summary is set, because models that do not reason refuse it ("Encrypted content is not
    /// supported with this model"). Turn it on for a reasoning model used with its default
    /// effort; without it, that model's reasoning is left out of later requests (its
    /// messages and calls still go back, without their item ids).
    #[must_use]
    pub fn encrypted_reasoning(mut self, include: bool) -> Self {
        self.encrypted_reasoning = Some(include);
        self
    }

    /// The output-token limit, reasoning included (`max_output_tokens`); sent only when set.
    /// A response cut by it finishes with [`FinishReason::Length`](crate::FinishReason::Length).
    #[must_use]
    pub fn max_output_tokens(mut self, max_output_tokens: u32) -> Self {
        self.max_output_tokens = Some(max_output_tokens);
        self
    }

    /// Sampling temperature; sent only when set (reasoning models refuse it).
    #[must_use]
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Whether tool schemas are sent in OpenAI strict mode (`"strict": true`, with the
    /// [`schema::to_strict`](crate::schema::to_strict) transform). On by default; turn it off
    /// for schemas strict mode cannot express.
    #[must_use]
    pub fn strict_tools(mut self, strict: bool) -> Self {
        self.strict_tools = strict;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`ConfigError`] for a missing model, a missing key (when no base URL is set), a
    /// reasoning effort or summary the API does not know, an invalid URL or header, or an
    /// HTTP client that cannot be built.
    pub fn build(self) -> Result<OpenAiResponses, ConfigError> {
        let model = self.options.model()?;
        let reasoning_effort = checked("reasoning_effort", self.reasoning_effort, EFFORTS)?;
        let reasoning_summary = checked("reasoning_summary", self.reasoning_summary, SUMMARIES)?;
        let key = self.options.key().map(str::to_owned);
        if key.is_none() && self.options.base_url.is_none() {
            return Err(ConfigError::MissingApiKey);
        }
        let base_url = self.options.base_url(DEFAULT_BASE_URL)?;
        let http =
            self.options.http(format!("{base_url}/responses"), key.map(|k| (AUTHORIZATION, format!("Bearer {k}"))))?;
        let encrypted_reasoning =
            self.encrypted_reasoning.unwrap_or(reasoning_effort.is_some() || reasoning_summary.is_some());
        Ok(OpenAiResponses {
            inner: Arc::new(Inner {
                http,
                base_url,
                model,
                reasoning_effort,
                reasoning_summary,
                encrypted_reasoning,
                max_output_tokens: self.max_output_tokens,
                temperature: self.temperature,
                strict_tools: self.strict_tools,
            }),
        })
    }
}

/// `value`, trimmed, if it is one of `allowed`.
fn checked(name: &'static str, value: Option<String>, allowed: &[&str]) -> Result<Option<String>, ConfigError> {
    let Some(value) = value else { return Ok(None) };
    let value = value.trim().to_owned();
    if allowed.contains(&value.as_str()) {
        Ok(Some(value))
    } else {
        Err(ConfigError::InvalidSetting { name, message: format!("`{value}` is not one of {}", allowed.join(", ")) })
    }
}

#[cfg(test)]
mod tests {
    use super::{super::DEFAULT_RESPONSES_MODEL, *};
    use crate::Model;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn environment_configuration() {
        let err = OpenAiResponses::from_lookup("m".into(), vars(&[])).unwrap_err();
        assert_eq!(err, ConfigError::MissingApiKey);
        let openai = OpenAiResponses::from_lookup("o4-mini".into(), vars(&[("OPENAI_API_KEY", "sk-test")])).unwrap();
        assert_eq!(openai.base_url(), DEFAULT_BASE_URL);
        assert_eq!(openai.inner.http.endpoint, "https://api.openai.com/v1/responses");
        assert_eq!(openai.name(), "o4-mini");
        assert_eq!(openai.provider(), "openai.responses");
        assert!(!format!("{openai:?}").contains("sk-test"));
        let proxy =
            OpenAiResponses::from_lookup("gpt-5".into(), vars(&[("OPENAI_BASE_URL", "http://localhost:8000/v1/")]))
                .unwrap();
        assert_eq!(proxy.inner.http.endpoint, "http://localhost:8000/v1/responses");

        assert!(
            OpenAiResponses::from_lookup_if_configured(DEFAULT_RESPONSES_MODEL, vars(&[("OPENAI_API_KEY", " ")]))
                .is_none()
        );
        let configured = OpenAiResponses::from_lookup_if_configured(
            DEFAULT_RESPONSES_MODEL,
            vars(&[("OPENAI_API_KEY", "k"), ("OPENAI_MODEL", "o3")]),
        );
        assert_eq!(configured.unwrap().unwrap().name(), "o3");
        let default =
            OpenAiResponses::from_lookup_if_configured(DEFAULT_RESPONSES_MODEL, vars(&[("OPENAI_API_KEY", "k")]));
        assert_eq!(default.unwrap().unwrap().name(), DEFAULT_RESPONSES_MODEL);
    }

    #[test]
    fn reasoning_settings_are_checked_and_decide_the_include() {
        let build = |b: OpenAiResponsesBuilder| b.api_key("k").model("o4-mini").build();
        for effort in ["none", "minimal", "low", "medium", "high", " high "] {
            let model = build(OpenAiResponses::builder().reasoning_effort(effort)).unwrap();
            assert_eq!(model.inner.reasoning_effort.as_deref(), Some(effort.trim()));
            assert!(model.inner.encrypted_reasoning, "{effort}");
        }
        for (name, builder) in [
            ("reasoning_effort", OpenAiResponses::builder().reasoning_effort("max")),
            ("reasoning_effort", OpenAiResponses::builder().reasoning_effort("")),
            ("reasoning_summary", OpenAiResponses::builder().reasoning_summary("short")),
        ] {
            let err = build(builder).unwrap_err();
            assert!(matches!(&err, ConfigError::InvalidSetting { name: n, .. } if *n == name), "{err}");
        }
        let summary = build(OpenAiResponses::builder().reasoning_summary("concise")).unwrap();
        assert!(summary.inner.encrypted_reasoning);
        assert!(!build(OpenAiResponses::builder()).unwrap().inner.encrypted_reasoning);
        assert!(build(OpenAiResponses::builder().encrypted_reasoning(true)).unwrap().inner.encrypted_reasoning);
        let off = build(OpenAiResponses::builder().reasoning_effort("low").encrypted_reasoning(false)).unwrap();
        assert!(!off.inner.encrypted_reasoning);
    }

    #[test]
    fn builder_validation() {
        assert_eq!(OpenAiResponses::builder().api_key("k").build().unwrap_err(), ConfigError::MissingModel);
        assert_eq!(OpenAiResponses::builder().model("m").build().unwrap_err(), ConfigError::MissingApiKey);
        let bad_url = OpenAiResponses::builder().base_url("ftp://x").model("m").build().unwrap_err();
        assert!(matches!(bad_url, ConfigError::InvalidBaseUrl { .. }), "{bad_url}");
        let bad_key = OpenAiResponses::builder().api_key("sk-\nsecret").model("m").build().unwrap_err();
        assert!(matches!(&bad_key, ConfigError::InvalidHeader { .. }), "{bad_key}");
        assert!(!bad_key.to_string().contains("secret"), "{bad_key}");
        let builder = OpenAiResponses::builder().api_key("sk-hidden").model("m");
        assert!(!format!("{builder:?}").contains("sk-hidden"));
    }
}
