//! Agents: an id, instructions, tools and limits. `#[agent]` implements [`Agent`].

use std::{fmt, sync::Arc};

use crate::{
    limits::RunLimits,
    model::{Model, OutputMode},
    output::AgentOutput,
    policy::Policy,
    tool::{Tool, ToolSet},
};

/// Default `max_steps`: model responses per turn before the run ends with
/// [`RunStatus::MaxSteps`](crate::RunStatus::MaxSteps).
pub const DEFAULT_MAX_STEPS: usize = 8;
/// Default `max_tool_concurrency`: calls of one batch running at once.
pub const DEFAULT_MAX_TOOL_CONCURRENCY: usize = 8;
/// Default `max_tool_result_tokens`: the cap on a result as it enters the transcript.
pub const DEFAULT_MAX_TOOL_RESULT_TOKENS: usize = 8000;

/// Something that declares an agent. `#[agent]` implements it for a unit struct; an
/// [`AgentDef`] implements it too, for agents built at run time.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kuralle agent",
    note = "annotate a unit struct with `#[kuralle::agent(id = \"...\", tools = [...])]`, or build an `AgentDef`"
)]
pub trait Agent: Send + Sync + 'static {
    /// The agent's definition.
    fn definition(&self) -> AgentDef;
}

/// An agent's definition.
///
/// ```
/// use kuralle::{AgentDef, tool};
///
/// /// Echo back the provided text.
/// #[tool]
/// async fn echo(text: String) -> String { text }
///
/// let agent = AgentDef::new("support", "Use the echo tool when asked.").tool(Echo).max_steps(4);
/// assert_eq!(agent.id, "support");
/// assert_eq!(agent.tools.len(), 1);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct AgentDef {
    /// Agent id (`[a-z0-9_-]+`).
    pub id: String,
    /// System text.
    pub instructions: String,
    /// The tools the model may call.
    pub tools: ToolSet,
    /// Model responses per turn before the turn ends with status `max_steps`.
    pub max_steps: usize,
    /// Calls of one batch running at once.
    pub max_tool_concurrency: usize,
    /// Cap on a result as it enters the transcript, in estimated tokens.
    pub max_tool_result_tokens: usize,
    /// The agent's own model; `None` uses the runtime's default model.
    pub model: Option<Arc<dyn Model>>,
    /// Which calls run, wait for a human, or are refused (default: allow all).
    pub policy: Policy,
    /// The typed final output, if the agent answers with one (see [`AgentDef::output`]).
    pub output: Option<AgentOutput>,
    /// What each run of this agent may spend (default: no caps); a request's own
    /// [`RunRequest::limits`](crate::RunRequest::limits) can only tighten them.
    pub limits: RunLimits,
}

impl fmt::Debug for AgentDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentDef")
            .field("id", &self.id)
            .field("tools", &self.tools)
            .field("max_steps", &self.max_steps)
            .field("max_tool_concurrency", &self.max_tool_concurrency)
            .field("max_tool_result_tokens", &self.max_tool_result_tokens)
            .field("model", &self.model.as_ref().map(|m| m.name().to_owned()))
            .field("policy", &self.policy)
            .field("output", &self.output)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl AgentDef {
    /// An agent with default limits and no tools.
    pub fn new(id: impl Into<String>, instructions: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            instructions: instructions.into(),
            tools: ToolSet::new(),
            max_steps: DEFAULT_MAX_STEPS,
            max_tool_concurrency: DEFAULT_MAX_TOOL_CONCURRENCY,
            max_tool_result_tokens: DEFAULT_MAX_TOOL_RESULT_TOKENS,
            model: None,
            policy: Policy::new(),
            output: None,
            limits: RunLimits::new(),
        }
    }

    /// Adds a tool.
    #[must_use]
    pub fn tool(mut self, tool: impl Tool) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Replaces the tool set.
    #[must_use]
    pub fn tools(mut self, tools: ToolSet) -> Self {
        self.tools = tools;
        self
    }

    /// Sets `max_steps` (at least 1).
    #[must_use]
    pub fn max_steps(mut self, n: usize) -> Self {
        self.max_steps = n.max(1);
        self
    }

    /// Sets `max_tool_concurrency` (at least 1).
    #[must_use]
    pub fn max_tool_concurrency(mut self, n: usize) -> Self {
        self.max_tool_concurrency = n.max(1);
        self
    }

    /// Sets `max_tool_result_tokens`.
    #[must_use]
    pub fn max_tool_result_tokens(mut self, n: usize) -> Self {
        self.max_tool_result_tokens = n;
        self
    }

    /// Gives the agent its own model.
    #[must_use]
    pub fn model(mut self, model: impl Model) -> Self {
        self.model = Some(Arc::new(model));
        self
    }

    /// Sets the approval policy, checked before every call of this agent's runs (see
    /// [`Policy`]).
    ///
    /// ```
    /// use kuralle::{AgentDef, Policy};
    /// let agent = AgentDef::new("payments", "Move money carefully.")
    ///     .policy(Policy::new().ask_when("wire", |a| a["amount"].as_f64().is_some_and(|x| x > 500.0)));
    /// # let _ = agent;
    /// ```
    #[must_use]
    pub fn policy(mut self, policy: impl Into<Policy>) -> Self {
        self.policy = policy.into();
        self
    }

    /// Makes the agent answer with a `T`, read with
    /// [`RunOutput::typed`](crate::RunOutput::typed). By default the model answers by calling
    /// an output tool whose arguments are `T` ([`OutputMode::Tool`]); an answer that fails
    /// `T`'s JSON Schema or `Deserialize` goes back to the model with what was wrong, up to
    /// [`output_retries`](Self::output_retries) times. See `docs/typed-output.md`.
    ///
    /// ```
    /// use kuralle::{AgentDef, Runtime, testing::{ScriptedModel, Turn}};
    ///
    /// #[derive(serde::Deserialize, schemars::JsonSchema, Debug, PartialEq)]
    /// struct Invoice { number: String, total_cents: u64 }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let model = ScriptedModel::new([Turn::tool_calls([
    ///     ("call_1", "final_result", r#"{"number":"A-7","total_cents":1250}"#),
    /// ])]);
    /// let agent = AgentDef::new("billing", "Read the invoice.").output::<Invoice>();
    /// let runtime = Runtime::builder().agent(agent).model(model).build()?;
    /// let out = runtime.run("Invoice A-7, total 12.50").await?;
    /// assert_eq!(out.typed::<Invoice>()?, Invoice { number: "A-7".into(), total_cents: 1250 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn output<T: serde::de::DeserializeOwned + schemars::JsonSchema + 'static>(mut self) -> Self {
        let (mode, retries) = self.output.as_ref().map_or((OutputMode::default(), None), |o| (o.mode, Some(o.retries)));
        let mut output = AgentOutput::of::<T>().mode(mode);
        if let Some(n) = retries {
            output = output.retries(n);
        }
        self.output = Some(output);
        self
    }

    /// Sets how the model is asked for the typed output (after [`output`](Self::output);
    /// without one it does nothing).
    #[must_use]
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.output = self.output.map(|o| o.mode(mode));
        self
    }

    /// Sets how many invalid answers go back to the model for repair before the run fails
    /// (default [`DEFAULT_OUTPUT_RETRIES`](crate::DEFAULT_OUTPUT_RETRIES); after
    /// [`output`](Self::output)).
    #[must_use]
    pub fn output_retries(mut self, n: u32) -> Self {
        self.output = self.output.map(|o| o.retries(n));
        self
    }

    /// Caps what each run of this agent may spend (see [`RunLimits`]).
    ///
    /// ```
    /// use kuralle::{AgentDef, RunLimits};
    /// let agent = AgentDef::new("support", "Be brief.").limits(RunLimits::new().max_tool_calls(10));
    /// assert_eq!(agent.limits.max_tool_calls, Some(10));
    /// ```
    #[must_use]
    pub fn limits(mut self, limits: RunLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Gives the agent a shared model.
    #[must_use]
    pub fn model_arc(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }
}

impl Agent for AgentDef {
    fn definition(&self) -> AgentDef {
        self.clone()
    }
}
