//! Typed final output: an agent's answer as a Rust value (`#[agent(output = T)]`,
//! [`AgentDef::output`](crate::AgentDef::output)), asked for in one of three
//! [`OutputMode`]s, checked against `T`'s JSON Schema and serde, repaired by telling the model
//! what was wrong, and journaled once accepted.
//!
//! One idea per file: [`schema`] is the schema every wire is sent (an object at the root),
//! [`validate`] checks a value against a schema, [`tool`] is the output tool of
//! [`OutputMode::Tool`], [`error`] what a typed output can fail with.

mod error;
mod schema;
mod tool;
mod validate;

use std::{fmt, sync::Arc};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use error::OutputError;
pub(crate) use tool::OutputTool;
pub use validate::check_schema;

use crate::model::{OutputMode, OutputSpec, ToolChoice};

/// Default [`AgentOutput::retries`]: how many times an invalid answer goes back to the model
/// with what was wrong before the run fails with [`OutputError::Invalid`].
pub const DEFAULT_OUTPUT_RETRIES: u32 = 2;

/// The name of the output (the output tool's name in [`OutputMode::Tool`], the schema's name
/// where a wire wants one).
pub const OUTPUT_TOOL_NAME: &str = "final_result";

/// Checks a value by deserializing it into the output type.
type Check = Arc<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

/// An agent's typed final output: `T`'s JSON Schema, how the model is asked for it, the
/// repair budget, and a check that the value deserializes into `T`.
///
/// ```
/// use kuralle::{AgentOutput, OutputMode};
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Invoice { number: String, total_cents: u64 }
///
/// let output = AgentOutput::of::<Invoice>().mode(OutputMode::Native).retries(1);
/// assert_eq!(output.name, "final_result");
/// assert_eq!(output.schema["required"], serde_json::json!(["number", "total_cents"]));
/// assert!(output.check(&serde_json::json!({"number": "A-1", "total_cents": 1200})).is_ok());
/// let err = output.check(&serde_json::json!({"number": "A-1", "total_cents": -5})).unwrap_err();
/// assert!(err.contains("/total_cents"), "{err}");
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct AgentOutput {
    /// The output's name ([`OUTPUT_TOOL_NAME`] unless set).
    pub name: String,
    /// The JSON Schema every wire is sent: `T`'s own when its root is an object, else `T`'s
    /// wrapped as the property `response` of an object (tools and strict structured output
    /// want an object at the root); the accepted value is `T`'s either way.
    pub schema: Value,
    /// Whether [`schema`](Self::schema) wraps `T`'s under `response`.
    pub wrapped: bool,
    /// How the model is asked for the value.
    pub mode: OutputMode,
    /// How many invalid answers go back to the model for repair.
    pub retries: u32,
    /// `T`'s type name, for messages.
    pub type_name: &'static str,
    deserializes: Check,
}

impl fmt::Debug for AgentOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentOutput")
            .field("name", &self.name)
            .field("type_name", &self.type_name)
            .field("mode", &self.mode)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

impl AgentOutput {
    /// The typed output `T`, in [`OutputMode::Tool`] with [`DEFAULT_OUTPUT_RETRIES`].
    pub fn of<T: DeserializeOwned + JsonSchema + 'static>() -> Self {
        let (schema, wrapped) = schema::wire_schema(crate::schema::input_schema::<T>());
        let deserializes: Check = Arc::new(|value: &Value| {
            serde_path_to_error::deserialize::<_, T>(value).map(drop).map_err(|e| {
                let path = e.path().to_string();
                if path == "." { e.into_inner().to_string() } else { format!("at `{path}`: {}", e.into_inner()) }
            })
        });
        Self {
            name: OUTPUT_TOOL_NAME.to_owned(),
            schema,
            wrapped,
            mode: OutputMode::default(),
            retries: DEFAULT_OUTPUT_RETRIES,
            type_name: std::any::type_name::<T>(),
            deserializes,
        }
    }

    /// Sets the mode.
    #[must_use]
    pub fn mode(mut self, mode: OutputMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the repair budget (0: the first invalid answer fails the run).
    #[must_use]
    pub fn retries(mut self, n: u32) -> Self {
        self.retries = n;
        self
    }

    /// Sets the output's name (`[a-zA-Z0-9_-]`, at most 64 characters): the output tool's name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Checks `value` (in the shape of [`schema`](Self::schema)) against the schema, then
    /// against `T`'s `Deserialize`; the error names the JSON path and the problem.
    ///
    /// # Errors
    /// What is wrong, as the model is told it.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        check_schema(&self.schema, value)?;
        (self.deserializes)(self.unwrap_ref(value))
    }

    /// `T`'s value inside a checked value (the `response` property when wrapped).
    pub(crate) fn unwrap(&self, mut value: Value) -> Value {
        if self.wrapped { value.get_mut("response").map(Value::take).unwrap_or(Value::Null) } else { value }
    }

    fn unwrap_ref<'v>(&self, value: &'v Value) -> &'v Value {
        if self.wrapped { value.get("response").unwrap_or(&Value::Null) } else { value }
    }

    /// What a request of an agent with `other_tools` carries: in tool mode, a forced call of
    /// the output tool, or any tool call when the agent has others to call first.
    pub(crate) fn spec(&self, other_tools: bool) -> OutputSpec {
        let tool_choice = match self.mode {
            OutputMode::Tool if other_tools => ToolChoice::Required,
            OutputMode::Tool => ToolChoice::Tool { name: self.name.clone() },
            OutputMode::Native | OutputMode::Prompted => ToolChoice::Auto,
        };
        OutputSpec { name: self.name.clone(), schema: self.schema.clone(), mode: self.mode, tool_choice }
    }

    /// The agent's instructions with what prompted mode adds: the schema and how to answer.
    pub(crate) fn instructions(&self, instructions: &str) -> String {
        if self.mode != OutputMode::Prompted {
            return instructions.to_owned();
        }
        let schema = serde_json::to_string_pretty(&self.schema).unwrap_or_default();
        format!(
            "{instructions}\n\nAnswer with only a JSON value (no prose, no code fence) that matches this JSON \
             Schema:\n{schema}"
        )
    }

    /// What the model is told when its answer `problem` was not accepted.
    pub(crate) fn repair_prompt(&self, problem: &str) -> String {
        match self.mode {
            OutputMode::Tool => format!(
                "{problem}. Give your final answer by calling the `{}` tool with arguments that match its schema.",
                self.name
            ),
            OutputMode::Native | OutputMode::Prompted => format!(
                "Your answer was not accepted: {problem}. Answer again with only a JSON value that matches the \
                 schema."
            ),
        }
    }
}
