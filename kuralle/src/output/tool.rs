//! The output tool of [`OutputMode::Tool`](crate::OutputMode::Tool): its arguments are the
//! answer. It is dispatched like any tool (in source order, journaled once accepted, replayed
//! on resume), and validation is its `prepare`: an invalid answer is answered with
//! [`ToolError::InvalidInput`] naming what was wrong, which is the repair prompt.

use futures::{StreamExt, stream};
use serde_json::Value;

use super::AgentOutput;
use crate::{
    context::ToolContext,
    error::ToolError,
    tool::{PreparedCall, Tool, ToolEvent, ToolStream},
};

const DESCRIPTION: &str =
    "Give your final answer. Call this once, when you have everything, with the complete answer as the arguments.";

/// An agent's output as a tool.
#[derive(Debug)]
pub(crate) struct OutputTool(pub(crate) AgentOutput);

struct Accepted(Value);

impl PreparedCall for Accepted {
    fn execute(self: Box<Self>, _ctx: ToolContext) -> ToolStream {
        stream::once(async move { ToolEvent::Outcome(Ok(self.0)) }).boxed()
    }
}

impl Tool for OutputTool {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn description(&self) -> &str {
        DESCRIPTION
    }

    fn input_schema(&self) -> &Value {
        &self.0.schema
    }

    fn type_name(&self) -> &'static str {
        self.0.type_name
    }

    fn prepare(&self, args: &Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        self.0.check(args).map_err(|message| ToolError::invalid_input(&self.0.name, message))?;
        Ok(Box::new(Accepted(args.clone())))
    }
}
