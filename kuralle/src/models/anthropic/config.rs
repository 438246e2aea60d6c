//! Configuring an [`Anthropic`] client: the builder, its defaults and checks, and the
//! environment.

use std::{fmt, sync::Arc};

use reqwest::header::HeaderName;

use super::{Anthropic, DEFAULT_ANTHROPIC_BASE_URL as DEFAULT_BASE_URL, Inner};
use crate::models::http::{ConfigError, Options, options::forward_http_options};

/// The API version every request names (`anthropic-version`); the event format this client
/// parses is the one of this version.
const API_VERSION: &str = "2023-06-01";

/// The beta that lets Claude 4 models think between tool calls (`anthropic-beta`).
const INTERLEAVED_THINKING_BETA: &str = "interleaved-thinking-2025-05-14";

/// The smallest thinking budget the API accepts.
const MIN_THINKING_BUDGET: u32 = 1024;

const DEFAULT_MAX_TOKENS: u32 = 4096;

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Anthropic {
    /// A builder; see [`AnthropicBuilder`] for the defaults.
    pub fn builder() -> AnthropicBuilder {
        AnthropicBuilder::default()
    }

    /// A client for `model` configured from the environment: `ANTHROPIC_API_KEY` (required)
    /// and `ANTHROPIC_BASE_URL` (default [`DEFAULT_ANTHROPIC_BASE_URL`](super::DEFAULT_ANTHROPIC_BASE_URL)).
    /// Empty variables count as unset.
    ///
    /// ```no_run
    /// let model = kuralle::models::Anthropic::from_env("claude-sonnet-4-5")?;
    /// # Ok::<(), kuralle::models::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::MissingKey`] without `ANTHROPIC_API_KEY`; [`ConfigError`] for an invalid
    /// URL or key.
    pub fn from_env(model: impl Into<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(model.into(), env_var)
    }

    /// Like [`Anthropic::from_env`], but `None` when `ANTHROPIC_API_KEY` is unset, so an
    /// example can fall back to a scripted model. The model id is `ANTHROPIC_MODEL` when set,
    /// else `default_model` (for example [`DEFAULT_ANTHROPIC_MODEL`](super::DEFAULT_ANTHROPIC_MODEL)).
    ///
    /// ```no_run
    /// use kuralle::models::{Anthropic, DEFAULT_ANTHROPIC_MODEL};
    /// match Anthropic::from_env_if_configured(DEFAULT_ANTHROPIC_MODEL) {
    ///     Some(Ok(model)) => { /* use the real model */ }
    ///     Some(Err(e)) => eprintln!("Anthropic is misconfigured: {e}"),
    ///     None => { /* fall back to kuralle::testing::ScriptedModel */ }
    /// }
    /// ```
    pub fn from_env_if_configured(default_model: &str) -> Option<Result<Self, ConfigError>> {
        Self::from_lookup_if_configured(default_model, env_var)
    }

    fn from_lookup(model: String, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let mut builder = Self::builder().model(model);
        if let Some(key) = get("ANTHROPIC_API_KEY") {
            builder = builder.api_key(key);
        }
        if let Some(url) = get("ANTHROPIC_BASE_URL") {
            builder = builder.base_url(url);
        }
        builder.build()
    }

    fn from_lookup_if_configured(
        default_model: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Result<Self, ConfigError>> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        get("ANTHROPIC_API_KEY")?;
        let model = get("ANTHROPIC_MODEL").unwrap_or_else(|| default_model.to_owned());
        Some(Self::from_lookup(model, lookup))
    }

    /// The base URL requests go to (without `/v1/messages`).
    ///
    /// ```
    /// let model = kuralle::models::Anthropic::builder().api_key("k").model("claude-sonnet-4-5").build()?;
    /// assert_eq!(model.base_url(), "https://api.anthropic.com");
    /// # Ok::<(), kuralle::models::ConfigError>(())
    /// ```
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }
}

/// Configures an [`Anthropic`] client.
///
/// Defaults: base URL [`DEFAULT_ANTHROPIC_BASE_URL`](super::DEFAULT_ANTHROPIC_BASE_URL),
/// `max_tokens` 4096 (the API requires one), no extended thinking, no temperature (the
/// API's default), no cache breakpoints, a 120 s timeout, and 3 retries with backoff from
/// 200 ms doubling up to 5 s. An API key is always required.
///
/// ```
/// use kuralle::models::{Anthropic, ConfigError};
///
/// let model = Anthropic::builder()
///     .api_key("sk-ant-...")
///     .model("claude-sonnet-4-5")
///     .max_tokens(16_000)
///     .thinking(8_000)
///     .cache_control(true)
///     .build()?;
/// # let _ = model;
///
/// // The thinking budget must be at least 1024 tokens and below `max_tokens`.
/// let err = Anthropic::builder().api_key("k").model("m").max_tokens(2048).thinking(4096).build().unwrap_err();
/// assert!(matches!(err, ConfigError::InvalidSetting { name: "thinking", .. }));
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AnthropicBuilder {
    options: Options,
    max_tokens: u32,
    thinking: Option<u32>,
    temperature: Option<f64>,
    cache_control: bool,
    interleaved_thinking: bool,
}

impl Default for AnthropicBuilder {
    fn default() -> Self {
        Self {
            options: Options::default(),
            max_tokens: DEFAULT_MAX_TOKENS,
            thinking: None,
            temperature: None,
            cache_control: false,
            interleaved_thinking: false,
        }
    }
}

impl fmt::Debug for AnthropicBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicBuilder")
            .field("options", &self.options)
            .field("max_tokens", &self.max_tokens)
            .field("thinking", &self.thinking)
            .field("temperature", &self.temperature)
            .field("cache_control", &self.cache_control)
            .field("interleaved_thinking", &self.interleaved_thinking)
            .finish()
    }
}

forward_http_options!(AnthropicBuilder, "Anthropic", "/v1/messages");

impl AnthropicBuilder {
    /// The output-token limit of each response (`max_tokens`, which the API requires);
    /// thinking counts toward it. Default 4096.
    #[must_use]
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Turns extended thinking on with a budget of `budget_tokens` (`thinking: {type:
    /// "enabled", budget_tokens}`). The budget must be at least 1024 and, unless
    /// [`interleaved_thinking`](Self::interleaved_thinking) is on, below `max_tokens`.
    ///
    /// With thinking on, the temperature is not sent (the API accepts none), tool use is
    /// never forced, and each thinking block goes back to the API unmodified, signature
    /// included, as the API requires. A request whose tool-use turn in progress does not
    /// start with thinking (a turn another provider produced) is sent without thinking, as
    /// the API's documentation says it handles such a turn.
    #[must_use]
    pub fn thinking(mut self, budget_tokens: u32) -> Self {
        self.thinking = Some(budget_tokens);
        self
    }

    /// Sampling temperature (0 to 1); sent only when set and thinking is off.
    #[must_use]
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Puts prompt-cache breakpoints (`cache_control: {type: "ephemeral"}`) on the system
    /// prompt and on the last tool, so later requests of a run read them from the cache.
    /// Off by default.
    #[must_use]
    pub fn cache_control(mut self, on: bool) -> Self {
        self.cache_control = on;
        self
    }

    /// Lets Claude 4 models think between tool calls (the `interleaved-thinking-2025-05-14`
    /// beta header); needs [`thinking`](Self::thinking). With it the budget may exceed
    /// `max_tokens`, since it spans every thinking block of the turn.
    #[must_use]
    pub fn interleaved_thinking(mut self, on: bool) -> Self {
        self.interleaved_thinking = on;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`ConfigError::MissingModel`], [`ConfigError::MissingKey`]`("ANTHROPIC_API_KEY")`,
    /// [`ConfigError::InvalidSetting`] for a `max_tokens` of 0, a thinking budget the API
    /// refuses, interleaved thinking without thinking, or a temperature outside 0 to 1;
    /// [`ConfigError`] for an invalid URL or header.
    pub fn build(self) -> Result<Anthropic, ConfigError> {
        let model = self.options.model()?;
        let key = self.options.key().map(str::to_owned).ok_or(ConfigError::MissingKey("ANTHROPIC_API_KEY"))?;
        let invalid = |name, message: String| ConfigError::InvalidSetting { name, message };
        if self.max_tokens == 0 {
            return Err(invalid("max_tokens", "must be at least 1".into()));
        }
        if let Some(budget) = self.thinking {
            if budget < MIN_THINKING_BUDGET {
                return Err(invalid(
                    "thinking",
                    format!("the budget must be at least {MIN_THINKING_BUDGET} tokens, not {budget}"),
                ));
            }
            if budget >= self.max_tokens && !self.interleaved_thinking {
                return Err(invalid(
                    "thinking",
                    format!(
                        "the budget ({budget}) must be below max_tokens ({}), or use interleaved thinking",
                        self.max_tokens
                    ),
                ));
            }
        } else if self.interleaved_thinking {
            return Err(invalid("interleaved_thinking", "needs thinking (call `thinking(budget_tokens)`)".into()));
        }
        if let Some(t) = self.temperature
            && !(0.0..=1.0).contains(&t)
        {
            return Err(invalid("temperature", format!("must be between 0 and 1, not {t}")));
        }
        let base_url = self.options.base_url(DEFAULT_BASE_URL)?;
        let mut options = self.options.clone();
        let has = |name: &str| options.headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
        // A header the caller set (a newer version, another beta) wins over the default.
        if !has("anthropic-version") {
            options.headers.push(("anthropic-version".into(), API_VERSION.into()));
        }
        if self.interleaved_thinking {
            options.headers.push(("anthropic-beta".into(), INTERLEAVED_THINKING_BETA.into()));
        }
        let http =
            options.http(format!("{base_url}/v1/messages"), Some((HeaderName::from_static("x-api-key"), key)))?;
        Ok(Anthropic {
            inner: Arc::new(Inner {
                http,
                base_url,
                model,
                max_tokens: self.max_tokens,
                thinking: self.thinking,
                temperature: self.temperature,
                cache_control: self.cache_control,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{super::DEFAULT_ANTHROPIC_MODEL, *};
    use crate::Model;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn environment_configuration() {
        let err = Anthropic::from_lookup("m".into(), vars(&[("ANTHROPIC_BASE_URL", "http://localhost:8080")]));
        assert_eq!(err.unwrap_err(), ConfigError::MissingKey("ANTHROPIC_API_KEY"));
        let model = Anthropic::from_lookup("claude-sonnet-4-5".into(), vars(&[("ANTHROPIC_API_KEY", "sk-ant-secret")]))
            .unwrap();
        assert_eq!(model.base_url(), DEFAULT_BASE_URL);
        assert_eq!(model.inner.http.endpoint, "https://api.anthropic.com/v1/messages");
        assert_eq!((model.name(), model.provider()), ("claude-sonnet-4-5", "anthropic"));
        assert!(!format!("{model:?}").contains("sk-ant-secret"));
        let proxied = Anthropic::from_lookup(
            "m".into(),
            vars(&[("ANTHROPIC_API_KEY", "k"), ("ANTHROPIC_BASE_URL", "http://localhost:8080/")]),
        )
        .unwrap();
        assert_eq!(proxied.inner.http.endpoint, "http://localhost:8080/v1/messages");

        assert!(
            Anthropic::from_lookup_if_configured(DEFAULT_ANTHROPIC_MODEL, vars(&[("ANTHROPIC_API_KEY", " ")]))
                .is_none()
        );
        let named = Anthropic::from_lookup_if_configured(
            DEFAULT_ANTHROPIC_MODEL,
            vars(&[("ANTHROPIC_API_KEY", "k"), ("ANTHROPIC_MODEL", "claude-opus-4-1")]),
        );
        assert_eq!(named.unwrap().unwrap().name(), "claude-opus-4-1");
        let default =
            Anthropic::from_lookup_if_configured(DEFAULT_ANTHROPIC_MODEL, vars(&[("ANTHROPIC_API_KEY", "k")]));
        assert_eq!(default.unwrap().unwrap().name(), DEFAULT_ANTHROPIC_MODEL);
    }

    #[test]
    fn settings_the_api_refuses_are_refused_when_building() {
        let base = || Anthropic::builder().api_key("k").model("m");
        let setting = |r: Result<Anthropic, ConfigError>| match r {
            Err(ConfigError::InvalidSetting { name, .. }) => name,
            other => panic!("expected an invalid setting, got {other:?}"),
        };
        assert_eq!(setting(base().thinking(1023).build()), "thinking");
        assert_eq!(setting(base().max_tokens(4096).thinking(4096).build()), "thinking");
        assert_eq!(setting(base().max_tokens(0).build()), "max_tokens");
        assert_eq!(setting(base().interleaved_thinking(true).build()), "interleaved_thinking");
        assert_eq!(setting(base().temperature(1.5).build()), "temperature");
        assert_eq!(setting(base().temperature(f64::NAN).build()), "temperature");
        assert!(base().max_tokens(4096).thinking(1024).build().is_ok());
        assert!(base().max_tokens(4096).thinking(4095).build().is_ok());
        // Interleaved thinking's budget spans the whole turn, so it may exceed max_tokens.
        assert!(base().max_tokens(4096).thinking(32_000).interleaved_thinking(true).build().is_ok());
        assert_eq!(Anthropic::builder().model("m").build().unwrap_err(), ConfigError::MissingKey("ANTHROPIC_API_KEY"));
        assert_eq!(Anthropic::builder().api_key("k").build().unwrap_err(), ConfigError::MissingModel);
        let bad_url = Anthropic::builder().api_key("k").model("m").base_url("ftp://x").build().unwrap_err();
        assert!(matches!(bad_url, ConfigError::InvalidBaseUrl { .. }), "{bad_url}");
        let bad_key = Anthropic::builder().api_key("bad\nkey").model("m").build().unwrap_err();
        assert!(matches!(&bad_key, ConfigError::InvalidHeader { name, .. } if name == "x-api-key"), "{bad_key}");
        assert!(!bad_key.to_string().contains("bad\nkey"));
    }
}
