//! What a request says about the answer's shape: the typed output's JSON Schema, how the
//! model is asked for it ([`OutputMode`]) and which tool it must call ([`ToolChoice`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How a model is asked for a typed final output.
///
/// ```
/// use kuralle::OutputMode;
/// assert_eq!(OutputMode::default(), OutputMode::Tool);
/// assert_eq!(serde_json::to_value(OutputMode::Native).unwrap(), "native");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// The model answers by calling an output tool whose arguments are the value. Works on
    /// every provider, beside the agent's other tools.
    #[default]
    Tool,
    /// The provider's own structured output constrains the answer text (OpenAI
    /// `response_format` / `text.format` json_schema, Anthropic `output_config`, Gemini
    /// `responseJsonSchema`).
    Native,
    /// The schema goes into the instructions and the answer text is parsed: for models and
    /// servers with neither tools nor structured output.
    Prompted,
}

/// Which tool the model must call.
///
/// ```
/// use kuralle::ToolChoice;
/// let forced = ToolChoice::Tool { name: "final_result".into() };
/// assert_eq!(serde_json::to_value(&forced).unwrap(), serde_json::json!({"type": "tool", "name": "final_result"}));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the provider's default).
    Auto,
    /// Some tool must be called (OpenAI `required`, Anthropic `any`, Gemini `ANY`).
    Required,
    /// This tool must be called. Never sent where the provider refuses a forced choice
    /// (Anthropic with thinking on): the client sends `auto` and the runtime's repair loop
    /// asks again for an answer that is not the tool call.
    Tool {
        /// The tool's name.
        name: String,
    },
}

/// The typed final output a request asks for: what a client encodes natively.
///
/// In [`OutputMode::Tool`] the output tool is also among the request's `tools`, and clients
/// send `tool_choice`; in [`OutputMode::Native`] they send the schema as the provider's
/// structured-output setting; in [`OutputMode::Prompted`] the schema is in the system text
/// and clients send nothing more.
///
/// ```
/// use kuralle::{OutputMode, OutputSpec, ToolChoice};
/// let spec = OutputSpec {
///     name: "final_result".into(),
///     schema: serde_json::json!({"type": "object", "properties": {"total": {"type": "number"}}, "required": ["total"]}),
///     mode: OutputMode::Native,
///     tool_choice: ToolChoice::Auto,
/// };
/// assert_eq!(spec.mode, OutputMode::Native);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSpec {
    /// The output's name: the output tool's name, and the schema's name where a wire wants
    /// one (`[a-zA-Z0-9_-]`, at most 64 characters).
    pub name: String,
    /// JSON Schema (2020-12) of the value.
    pub schema: Value,
    /// How the model is asked for the value.
    pub mode: OutputMode,
    /// Which tool the model must call (meaningful in [`OutputMode::Tool`]).
    pub tool_choice: ToolChoice,
}

impl OutputSpec {
    /// The schema without its `$schema` dialect line, which no provider wants.
    pub(crate) fn plain_schema(&self) -> Value {
        let mut schema = self.schema.clone();
        if let Value::Object(map) = &mut schema {
            map.remove("$schema");
        }
        schema
    }

    /// The schema made strict (`additionalProperties: false`, every property required,
    /// optional ones nullable) when strict mode can express it, else `None`.
    pub(crate) fn strict_schema(&self) -> Option<Value> {
        crate::schema::to_strict(&self.name, &self.schema).ok()
    }

    /// Whether the provider's structured output is asked for.
    pub(crate) fn is_native(&self) -> bool {
        self.mode == OutputMode::Native
    }
}
