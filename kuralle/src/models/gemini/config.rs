//! Configuring a [`Gemini`] client: the builder, its defaults, and the environment.

use std::{fmt, sync::Arc};

use reqwest::header::HeaderName;

use super::{DEFAULT_BASE_URL, Gemini, Inner};
use crate::models::http::{ConfigError, Options, options::forward_http_options};

/// The header that carries the key (Google's own SDKs send it there; a key in the URL would
/// end up in logs).
const KEY_HEADER: &str = "x-goog-api-key";

/// The thinking levels Gemini 3 accepts.
const THINKING_LEVELS: &[&str] = &["minimal", "low", "medium", "high"];

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Gemini {
    /// A builder; see [`GeminiBuilder`] for the defaults.
    ///
    /// ```
    /// let model = kuralle::models::Gemini::builder().api_key("k").model("gemini-2.5-pro").build().unwrap();
    /// assert_eq!(model.base_url(), "https://generativelanguage.googleapis.com");
    /// ```
    pub fn builder() -> GeminiBuilder {
        GeminiBuilder::default()
    }

    /// A client for `model` configured from the environment: `GEMINI_API_KEY` (required) and
    /// `GEMINI_BASE_URL` (default `https://generativelanguage.googleapis.com`). Empty variables
    /// count as unset.
    ///
    /// # Errors
    /// [`ConfigError::MissingKey`] when `GEMINI_API_KEY` is unset; [`ConfigError`] for an
    /// invalid URL or key.
    ///
    /// ```
    /// use kuralle::models::{ConfigError, Gemini};
    /// match Gemini::from_env("gemini-2.5-flash") {
    ///     Ok(model) => { /* use it */ let _ = model; }
    ///     Err(ConfigError::MissingKey(var)) => assert_eq!(var, "GEMINI_API_KEY"),
    ///     Err(other) => eprintln!("Gemini is misconfigured: {other}"),
    /// }
    /// ```
    pub fn from_env(model: impl Into<String>) -> Result<Self, ConfigError> {
        Self::from_lookup(model.into(), env_var)
    }

    /// Like [`Gemini::from_env`], but `None` when neither `GEMINI_API_KEY` nor
    /// `GEMINI_BASE_URL` is set, so an example can fall back to a scripted model. The model id
    /// is `GEMINI_MODEL` when set, else `default_model` (for example
    /// [`DEFAULT_GEMINI_MODEL`](super::DEFAULT_GEMINI_MODEL)).
    ///
    /// ```
    /// use kuralle::models::{DEFAULT_GEMINI_MODEL, Gemini};
    /// match Gemini::from_env_if_configured(DEFAULT_GEMINI_MODEL) {
    ///     Some(Ok(model)) => { /* use the real model */ let _ = model; }
    ///     Some(Err(e)) => eprintln!("Gemini is misconfigured: {e}"),
    ///     None => { /* fall back to kuralle::testing::ScriptedModel */ }
    /// }
    /// ```
    pub fn from_env_if_configured(default_model: &str) -> Option<Result<Self, ConfigError>> {
        Self::from_lookup_if_configured(default_model, env_var)
    }

    fn from_lookup(model: String, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let mut builder = Self::builder().model(model);
        if let Some(key) = get("GEMINI_API_KEY") {
            builder = builder.api_key(key);
        }
        if let Some(url) = get("GEMINI_BASE_URL") {
            builder = builder.base_url(url);
        }
        builder.build()
    }

    fn from_lookup_if_configured(
        default_model: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Result<Self, ConfigError>> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if get("GEMINI_API_KEY").is_none() && get("GEMINI_BASE_URL").is_none() {
            return None;
        }
        let model = get("GEMINI_MODEL").unwrap_or_else(|| default_model.to_owned());
        Some(Self::from_lookup(model, lookup))
    }

    /// The base URL requests go to (without `/v1beta/...`).
    ///
    /// ```
    /// let model = kuralle::models::Gemini::builder()
    ///     .api_key("k")
    ///     .model("gemini-2.5-flash")
    ///     .base_url("http://localhost:8080/")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(model.base_url(), "http://localhost:8080");
    /// ```
    pub fn base_url(&self) -> &str {
        &self.inner.base_url
    }
}

/// Configures a [`Gemini`] client.
///
/// Defaults: base URL `https://generativelanguage.googleapis.com`, streaming on, no
/// `generationConfig` beyond what is set here (the model's own defaults), a 120 s timeout, and
/// 3 retries with backoff from 200 ms doubling up to 5 s. An API key is always required.
///
/// Thinking: [`thinking_budget`](Self::thinking_budget) (Gemini 2.5) or
/// [`thinking_level`](Self::thinking_level) (Gemini 3) — the API refuses both in one request,
/// so the builder does too. Either also asks for the thoughts (`includeThoughts: true`), which
/// arrive as [`ModelEvent::ReasoningDelta`](crate::ModelEvent::ReasoningDelta)s and become
/// [`Part::Reasoning`](crate::Part::Reasoning) parts of the turn.
///
/// ```
/// use std::time::Duration;
/// let client = kuralle::models::Gemini::builder()
///     .api_key("AIza-test")
///     .model("gemini-3-pro-preview")
///     .thinking_level("high")
///     .temperature(1.0)
///     .timeout(Duration::from_secs(300))
///     .build()
///     .unwrap();
/// # let _ = client;
/// let both = kuralle::models::Gemini::builder()
///     .api_key("k").model("m").thinking_level("low").thinking_budget(512).build();
/// assert!(both.is_err());
/// ```
#[derive(Clone)]
pub struct GeminiBuilder {
    options: Options,
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    thinking_budget: Option<i32>,
    thinking_level: Option<String>,
    streaming: bool,
}

impl Default for GeminiBuilder {
    fn default() -> Self {
        Self {
            options: Options::default(),
            max_output_tokens: None,
            temperature: None,
            thinking_budget: None,
            thinking_level: None,
            streaming: true,
        }
    }
}

impl fmt::Debug for GeminiBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeminiBuilder")
            .field("options", &self.options)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("temperature", &self.temperature)
            .field("thinking_budget", &self.thinking_budget)
            .field("thinking_level", &self.thinking_level)
            .field("streaming", &self.streaming)
            .finish()
    }
}

forward_http_options!(GeminiBuilder, "Gemini", "/v1beta/models/{model}:streamGenerateContent?alt=sse");

impl GeminiBuilder {
    /// The output-token limit (`generationConfig.maxOutputTokens`); sent only when set.
    ///
    /// ```
    /// let model = kuralle::models::Gemini::builder().api_key("k").model("gemini-2.5-flash").max_output_tokens(1024).build();
    /// assert!(model.is_ok());
    /// ```
    #[must_use]
    pub fn max_output_tokens(mut self, max_output_tokens: u32) -> Self {
        self.max_output_tokens = Some(max_output_tokens);
        self
    }

    /// Sampling temperature (`generationConfig.temperature`, 0 to 2); sent only when set.
    /// Google advises leaving Gemini 3 at its default of 1.0.
    ///
    /// ```
    /// let builder = kuralle::models::Gemini::builder().api_key("k").model("gemini-2.5-flash");
    /// assert!(builder.clone().temperature(0.2).build().is_ok());
    /// assert!(builder.temperature(3.0).build().is_err());
    /// ```
    #[must_use]
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// The thinking budget in tokens (`thinkingConfig.thinkingBudget`, Gemini 2.5): `0` turns
    /// thinking off where the model allows it, `-1` lets the model decide. Any other budget
    /// also asks for the thoughts (`includeThoughts: true`).
    ///
    /// ```
    /// let model = kuralle::models::Gemini::builder().api_key("k").model("gemini-2.5-pro").thinking_budget(-1).build();
    /// assert!(model.is_ok());
    /// ```
    #[must_use]
    pub fn thinking_budget(mut self, tokens: i32) -> Self {
        self.thinking_budget = Some(tokens);
        self
    }

    /// The thinking level (`thinkingConfig.thinkingLevel`, Gemini 3): `"minimal"`, `"low"`,
    /// `"medium"` or `"high"` (which ones a model accepts varies). Also asks for the thoughts
    /// (`includeThoughts: true`).
    ///
    /// ```
    /// let builder = kuralle::models::Gemini::builder().api_key("k").model("gemini-3-pro-preview");
    /// assert!(builder.clone().thinking_level("high").build().is_ok());
    /// assert!(builder.thinking_level("extreme").build().is_err());
    /// ```
    #[must_use]
    pub fn thinking_level(mut self, level: impl Into<String>) -> Self {
        self.thinking_level = Some(level.into());
        self
    }

    /// Whether to stream (`:streamGenerateContent?alt=sse`, the default) or ask for the whole
    /// answer at once (`:generateContent`). Either way the events are the same; streaming shows
    /// text as it is written.
    ///
    /// ```
    /// let model = kuralle::models::Gemini::builder().api_key("k").model("gemini-2.5-flash").streaming(false).build();
    /// assert!(model.is_ok());
    /// ```
    #[must_use]
    pub fn streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    /// [`ConfigError`] for a missing model or key, an invalid URL, header, model id or
    /// generation setting, or an HTTP client that cannot be built.
    ///
    /// ```
    /// use kuralle::models::{ConfigError, Gemini};
    /// assert_eq!(Gemini::builder().model("gemini-2.5-flash").build().unwrap_err(), ConfigError::MissingKey("GEMINI_API_KEY"));
    /// ```
    pub fn build(self) -> Result<Gemini, ConfigError> {
        let model = self.options.model()?;
        let key = self.options.key().map(str::to_owned).ok_or(ConfigError::MissingKey("GEMINI_API_KEY"))?;
        let base_url = self.options.base_url(DEFAULT_BASE_URL)?;
        let resource = model_resource(&model)?;
        if let Some(t) = self.temperature
            && !(t.is_finite() && (0.0..=2.0).contains(&t))
        {
            return Err(invalid("temperature", format!("{t} is not between 0 and 2")));
        }
        if let Some(budget) = self.thinking_budget
            && budget < -1
        {
            return Err(invalid("thinking_budget", format!("{budget} is below -1 (dynamic)")));
        }
        if let Some(level) = &self.thinking_level
            && !THINKING_LEVELS.contains(&level.as_str())
        {
            return Err(invalid("thinking_level", format!("`{level}` is not one of {}", THINKING_LEVELS.join(", "))));
        }
        if self.thinking_budget.is_some() && self.thinking_level.is_some() {
            return Err(invalid(
                "thinking_level",
                "the API refuses thinking_level and thinking_budget in one request; set one".into(),
            ));
        }
        let method = if self.streaming { "streamGenerateContent?alt=sse" } else { "generateContent" };
        let http = self
            .options
            .http(format!("{base_url}/v1beta/{resource}:{method}"), Some((HeaderName::from_static(KEY_HEADER), key)))?;
        Ok(Gemini {
            inner: Arc::new(Inner {
                http,
                base_url,
                model,
                max_output_tokens: self.max_output_tokens,
                temperature: self.temperature,
                thinking_budget: self.thinking_budget,
                thinking_level: self.thinking_level,
                streaming: self.streaming,
            }),
        })
    }
}

fn invalid(name: &'static str, message: String) -> ConfigError {
    ConfigError::InvalidSetting { name, message }
}

/// The model's resource path: `models/{model}`, or the id itself when it already names one
/// (`models/gemini-2.5-flash`, `tunedModels/my-model`).
fn model_resource(model: &str) -> Result<String, ConfigError> {
    let model = model.trim();
    // The id goes into the URL path; anything that would change the URL's meaning is refused.
    if let Some(bad) = model.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))) {
        return Err(invalid("model", format!("`{model}` has `{bad}`, which cannot be part of the URL path")));
    }
    if model.starts_with("models/") || model.starts_with("tunedModels/") {
        Ok(model.to_owned())
    } else {
        Ok(format!("models/{model}"))
    }
}

#[cfg(test)]
mod tests {
    use super::{super::DEFAULT_GEMINI_MODEL, *};
    use crate::Model;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    }

    #[test]
    fn environment_configuration() {
        let err = Gemini::from_lookup("m".into(), vars(&[])).unwrap_err();
        assert_eq!(err, ConfigError::MissingKey("GEMINI_API_KEY"));
        assert!(err.to_string().contains("GEMINI_API_KEY"));
        // A base URL does not make the key optional: Google's API always needs one.
        let err = Gemini::from_lookup("m".into(), vars(&[("GEMINI_BASE_URL", "http://localhost:8080")])).unwrap_err();
        assert_eq!(err, ConfigError::MissingKey("GEMINI_API_KEY"));

        let gemini =
            Gemini::from_lookup("gemini-2.5-flash".into(), vars(&[("GEMINI_API_KEY", "AIza-secret")])).unwrap();
        assert_eq!(gemini.base_url(), DEFAULT_BASE_URL);
        assert_eq!(gemini.name(), "gemini-2.5-flash");
        assert_eq!(gemini.provider(), "gemini");
        assert_eq!(
            gemini.inner.http.endpoint,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert!(!format!("{gemini:?}").contains("AIza-secret"));
        assert!(!gemini.inner.http.endpoint.contains("AIza-secret"));

        let proxied = Gemini::from_lookup(
            "gemini-2.5-pro".into(),
            vars(&[("GEMINI_API_KEY", "k"), ("GEMINI_BASE_URL", " http://127.0.0.1:9000/ ")]),
        )
        .unwrap();
        assert_eq!(proxied.base_url(), "http://127.0.0.1:9000");

        assert!(Gemini::from_lookup_if_configured(DEFAULT_GEMINI_MODEL, vars(&[("GEMINI_API_KEY", " ")])).is_none());
        let configured = Gemini::from_lookup_if_configured(
            DEFAULT_GEMINI_MODEL,
            vars(&[("GEMINI_API_KEY", "k"), ("GEMINI_MODEL", "gemini-3-pro-preview")]),
        );
        assert_eq!(configured.unwrap().unwrap().name(), "gemini-3-pro-preview");
        let default = Gemini::from_lookup_if_configured(DEFAULT_GEMINI_MODEL, vars(&[("GEMINI_API_KEY", "k")]));
        assert_eq!(default.unwrap().unwrap().name(), DEFAULT_GEMINI_MODEL);
        let keyless = Gemini::from_lookup_if_configured(DEFAULT_GEMINI_MODEL, vars(&[("GEMINI_BASE_URL", "http://x")]));
        assert_eq!(keyless.unwrap().unwrap_err(), ConfigError::MissingKey("GEMINI_API_KEY"));
    }

    #[test]
    fn builder_validation() {
        let base = || Gemini::builder().api_key("k").model("gemini-2.5-flash");
        assert_eq!(Gemini::builder().api_key("k").build().unwrap_err(), ConfigError::MissingModel);
        assert_eq!(Gemini::builder().model("m").build().unwrap_err(), ConfigError::MissingKey("GEMINI_API_KEY"));
        assert!(matches!(base().base_url("ftp://x").build(), Err(ConfigError::InvalidBaseUrl { .. })));
        for (builder, name) in [
            (base().temperature(2.5), "temperature"),
            (base().temperature(f64::NAN), "temperature"),
            (base().thinking_budget(-2), "thinking_budget"),
            (base().thinking_level("HIGH"), "thinking_level"),
            (base().thinking_level("low").thinking_budget(0), "thinking_level"),
            (Gemini::builder().api_key("k").model("gemini?key=x"), "model"),
            (Gemini::builder().api_key("k").model("gemini 2.5"), "model"),
        ] {
            match builder.build() {
                Err(ConfigError::InvalidSetting { name: got, .. }) => assert_eq!(got, name),
                other => panic!("{name}: expected InvalidSetting, got {other:?}"),
            }
        }
        assert!(base().thinking_budget(-1).build().is_ok());
        assert!(base().thinking_level("minimal").build().is_ok());
        let bad_header = base().header("bad header", "v").build().unwrap_err();
        assert!(matches!(bad_header, ConfigError::InvalidHeader { .. }), "{bad_header}");
    }

    #[test]
    fn endpoints() {
        let endpoint = |model: &str, streaming: bool| {
            Gemini::builder()
                .api_key("k")
                .model(model)
                .base_url("http://localhost:1")
                .streaming(streaming)
                .build()
                .unwrap()
                .inner
                .http
                .endpoint
                .clone()
        };
        assert_eq!(
            endpoint("gemini-2.5-flash", false),
            "http://localhost:1/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(
            endpoint("models/gemini-2.5-flash", true),
            "http://localhost:1/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            endpoint("tunedModels/mine-01", false),
            "http://localhost:1/v1beta/tunedModels/mine-01:generateContent"
        );
    }
}
