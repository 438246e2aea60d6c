//! A turn's typed final output: judging each answer, counting repairs, and journaling the
//! accepted value so a resumed turn returns it without judging again.
//!
//! An answer is judged where it arrives: a text answer (native and prompted modes) when the
//! response has no calls; an output-tool call (tool mode) after its response's calls ran,
//! in source order with the others, so every effect the model asked for in that response is
//! journaled before the run ends with the value.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::{
    agent::AgentDef,
    dispatch::{CallOutcome, TurnCtx},
    error::{RunError, ToolError},
    json::JsonText,
    model::{FinishReason, OutputMode},
    output::{AgentOutput, OutputError, OutputTool},
    store::{StepKind, StoreError},
    tool::ToolSet,
};

/// What became of one answer.
pub(super) enum Judged {
    /// The value, in the wire schema's shape.
    Accepted(Value),
    /// Not accepted; what was wrong, to tell the model.
    Repair(String),
    /// Not accepted, and no repair can help.
    Failed(OutputError),
}

/// The typed output of a turn, with the repairs spent so far.
pub(super) struct Typed<'a> {
    pub(super) output: &'a AgentOutput,
    failures: u32,
}

/// The agent's tools, with its output tool in tool mode.
pub(super) fn tools(agent: &AgentDef) -> ToolSet {
    let mut tools = agent.tools.clone();
    if let Some(output) = agent.output.as_ref().filter(|o| o.mode == OutputMode::Tool) {
        tools.push(Arc::new(OutputTool(output.clone())));
    }
    tools
}

fn clip(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// What the finish reason says when no answer was accepted: a cut-off or refused answer is
/// not repaired (asking again gets the same).
fn ended_badly(finish: &FinishReason, text: &str) -> Option<OutputError> {
    match finish {
        FinishReason::Length => Some(OutputError::Truncated { partial: clip(text) }),
        FinishReason::Refusal | FinishReason::ContentFilter => Some(OutputError::Refused { message: clip(text) }),
        _ => None,
    }
}

/// The JSON of a text answer: the whole text, or the inside of a Markdown code fence (weak
/// models add one however they are asked).
fn json_of(text: &str) -> Result<Value, serde_json::Error> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map(|body| body.strip_prefix("json").unwrap_or(body))
        .unwrap_or(trimmed);
    serde_json::from_str(inner)
}

impl<'a> Typed<'a> {
    pub(super) fn new(output: &'a AgentOutput) -> Self {
        Self { output, failures: 0 }
    }

    /// Judges a response without calls, whose text is `text`.
    pub(super) fn judge_text(&self, text: &str, finish: &FinishReason) -> Judged {
        if self.output.mode == OutputMode::Tool {
            if let Some(e) = ended_badly(finish, text) {
                return Judged::Failed(e);
            }
            return Judged::Repair(format!(
                "You answered with text instead of calling the `{}` tool",
                self.output.name
            ));
        }
        let checked = json_of(text)
            .map_err(|e| format!("the answer is not JSON ({e})"))
            .and_then(|value| self.output.check(&value).map(|()| value));
        match checked {
            Ok(value) => Judged::Accepted(value),
            Err(problem) => ended_badly(finish, text).map_or(Judged::Repair(problem), Judged::Failed),
        }
    }

    /// Judges a response's calls once they ran: `None` when none was the output tool. The
    /// first accepted output call wins; else the last rejection is what went wrong.
    pub(super) fn judge_calls(&self, outcomes: &[CallOutcome], finish: &FinishReason, text: &str) -> Option<Judged> {
        let mut rejected = None;
        for o in outcomes.iter().filter(|o| o.name == self.output.name) {
            match &o.result {
                Ok(value) => return Some(Judged::Accepted(value.clone())),
                Err(ToolError::InvalidInput { message, .. }) => rejected = Some(message.clone()),
                Err(other) => rejected = Some(other.to_string()),
            }
        }
        let problem = rejected?;
        Some(ended_badly(finish, text).map_or(Judged::Repair(problem), Judged::Failed))
    }

    /// Counts a rejected answer: the prompt that asks for a repair, or the error that ends the
    /// run when the budget is spent.
    pub(super) fn reject(&mut self, problem: &str) -> Result<String, OutputError> {
        self.failures += 1;
        if self.failures > self.output.retries {
            return Err(OutputError::Invalid { attempts: self.failures, message: problem.to_owned() });
        }
        tracing::debug!(attempt = self.failures, problem, "typed output rejected; asking the model to repair it");
        Ok(self.output.repair_prompt(problem))
    }

    /// Journals the accepted `value` as the turn's output step at `callsite`, or, when a
    /// resumed turn finds one there, returns the journaled value instead. Returns `T`'s value.
    pub(super) async fn record(&self, ctx: &TurnCtx, callsite: u64, value: Value) -> Result<Value, RunError> {
        let journal = &ctx.journal;
        let key = journal.key(&callsite.to_string(), &json!("output"));
        let value = match journal.result_text(&key) {
            Some(journaled) => journaled.decode::<Value>().map_err(|e| {
                RunError::Store(StoreError::Corrupt(format!("journaled output is unreadable: {e}").into()))
            })?,
            None => {
                let value = self.output.unwrap(value);
                let text = JsonText::serialize_from(&value).unwrap_or_default();
                journal.defer_finished(key, StepKind::Output, &self.output.name, text).await?;
                value
            }
        };
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::json_of;

    #[test]
    fn a_fenced_answer_is_read_inside_its_fence() {
        assert_eq!(json_of("```json\n{\"a\":1}\n```").unwrap()["a"], 1);
        assert_eq!(json_of(" {\"a\":2} ").unwrap()["a"], 2);
        assert!(json_of("Sure! {\"a\":1}").is_err());
    }
}
