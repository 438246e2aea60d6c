//! Picking a provider from the environment, for examples and apps that run against whichever
//! model the user has a key for.

use std::sync::Arc;

use super::ConfigError;
use crate::Model;

/// The providers [`from_env`] knows, by their `KURALLE_PROVIDER` names.
pub const PROVIDERS: [&str; 4] = ["anthropic", "gemini", "openai.responses", "openai"];

/// A model client chosen from the environment, or `None` when nothing is configured (so an
/// example can fall back to [`ScriptedModel`](crate::testing::ScriptedModel)).
///
/// `KURALLE_PROVIDER` (one of [`PROVIDERS`]) chooses when set; otherwise the first of
/// `ANTHROPIC_API_KEY` ([`Anthropic`](super::Anthropic)), `GEMINI_API_KEY`
/// ([`Gemini`](super::Gemini)), `OPENAI_API_KEY` or `OPENAI_BASE_URL` ([`OpenAi`](super::OpenAi),
/// chat completions, which local servers speak too). `KURALLE_MODEL` names the model (for the
/// chat wire `OPENAI_MODEL` also works); each provider has a default. Each client then reads
/// its own variables (`*_API_KEY`, `*_BASE_URL`). [`Model::provider`] and [`Model::name`] say
/// what was chosen.
///
/// ```no_run
/// let model = match kuralle::models::from_env() {
///     Some(model) => model?,
///     None => std::sync::Arc::new(kuralle::testing::ScriptedModel::new([kuralle::testing::Turn::text("hi")])),
/// };
/// println!("model: {} ({})", model.name(), model.provider());
/// # Ok::<(), kuralle::models::ConfigError>(())
/// ```
///
/// # Errors
/// [`ConfigError::InvalidSetting`] for an unknown `KURALLE_PROVIDER` (or one whose feature is
/// off); the chosen client's [`ConfigError`] otherwise.
pub fn from_env() -> Option<Result<Arc<dyn Model>, ConfigError>> {
    let get = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let provider = match get("KURALLE_PROVIDER") {
        Some(p) => p.to_ascii_lowercase(),
        None if get("ANTHROPIC_API_KEY").is_some() => "anthropic".into(),
        None if get("GEMINI_API_KEY").is_some() => "gemini".into(),
        None if get("OPENAI_API_KEY").is_some() || get("OPENAI_BASE_URL").is_some() => "openai".into(),
        None => return None,
    };
    let model = get("KURALLE_MODEL");
    Some(build(&provider, model, get("OPENAI_MODEL")))
}

fn build(provider: &str, model: Option<String>, openai_model: Option<String>) -> Result<Arc<dyn Model>, ConfigError> {
    let _ = &openai_model;
    match provider {
        #[cfg(feature = "anthropic")]
        "anthropic" => {
            Ok(Arc::new(super::Anthropic::from_env(model.unwrap_or_else(|| super::DEFAULT_ANTHROPIC_MODEL.into()))?))
        }
        #[cfg(feature = "gemini")]
        "gemini" => Ok(Arc::new(super::Gemini::from_env(model.unwrap_or_else(|| super::DEFAULT_GEMINI_MODEL.into()))?)),
        #[cfg(feature = "openai")]
        "openai.responses" | "responses" => {
            let model = model.or(openai_model).unwrap_or_else(|| super::DEFAULT_RESPONSES_MODEL.into());
            Ok(Arc::new(super::OpenAiResponses::from_env(model)?))
        }
        #[cfg(feature = "openai")]
        "openai" | "openai.chat" | "chat" => Ok(Arc::new(super::OpenAi::from_env(
            model.or(openai_model).unwrap_or_else(|| super::DEFAULT_MODEL.into()),
        )?)),
        other => Err(ConfigError::InvalidSetting {
            name: "KURALLE_PROVIDER",
            message: format!("`{other}` is not one of {} (or its cargo feature is off)", PROVIDERS.join(", ")),
        }),
    }
}
