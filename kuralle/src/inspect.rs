//! Reading a run from outside the process that owns it: what it waits on and what each
//! journal step was called with. Operators' tools (the `kuralle` CLI and console) need only
//! the store, never the agent's code, so everything here works from stored records alone.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    approval::{Pending, PendingApproval},
    input::text::parse_args,
    journal::{approval_key, effect_key, tool_key},
    model::{Message, Part, ToolCallRequest},
    store::{RunRecord, StepKind, StepRecord, StepStatus},
};

/// The approvals a paused run waits for, decided or not (see [`recorded_decisions`]); empty
/// once a turn has carried the decisions out.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use futures::StreamExt;
/// use kuralle::{AgentDef, Runtime, inspect, testing::{ScriptedModel, Turn}, tool};
///
/// /// Refund an order.
/// #[tool(needs_approval)]
/// async fn refund(order: String) -> String { format!("refunded {order}") }
///
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("shop", "Refund when asked.").tool(Refund))
///     .model(ScriptedModel::new([Turn::tool_calls([("c1", "refund", r#"{"order":"A1"}"#)])]))
///     .build()
///     .unwrap();
/// let output = runtime.run("Refund A1").await.unwrap();
/// let record = runtime.get_run(&output.run_id).await.unwrap().unwrap();
/// let pending = inspect::pending_approvals(&record);
/// assert_eq!(pending[0].name, "refund");
/// assert_eq!(pending[0].args["order"], "A1");
/// # });
/// ```
pub fn pending_approvals(record: &RunRecord) -> Vec<PendingApproval> {
    waiting(record).into_iter().map(|w| w.request).collect()
}

/// A pending approval's decision, when one is recorded in `steps` but the run has not been
/// resumed yet (by request id): the owner, or a worker, acts on it when it resumes the run.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{AgentDef, Decision, Runtime, inspect, record_decision, testing::{ScriptedModel, Turn}, tool};
///
/// /// Refund an order.
/// #[tool(needs_approval)]
/// async fn refund(order: String) -> String { format!("refunded {order}") }
///
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("shop", "Refund when asked.").tool(Refund))
///     .model(ScriptedModel::new([Turn::tool_calls([("c1", "refund", r#"{"order":"A1"}"#)])]))
///     .build()
///     .unwrap();
/// let run_id = runtime.run("Refund A1").await.unwrap().run_id;
/// let store = runtime.store().as_ref();
/// record_decision(store, &run_id, &Decision::approve("alice")).await.unwrap();
///
/// let record = store.get_run(&run_id).await.unwrap().unwrap();
/// let decided = inspect::recorded_decisions(&record, &store.steps(&run_id).await.unwrap());
/// let request = &inspect::pending_approvals(&record)[0].request_id;
/// assert_eq!(decided[request].by, "alice");
/// # });
/// ```
pub fn recorded_decisions(record: &RunRecord, steps: &[StepRecord]) -> HashMap<String, RecordedDecision> {
    let waiting = waiting(record);
    steps
        .iter()
        .filter(|s| s.kind == StepKind::Approval && s.status == StepStatus::Finished)
        .filter_map(|s| {
            let w = waiting.iter().find(|w| w.decision_key == s.key)?;
            let decision = s.result.as_ref()?.decode().ok()?;
            Some((w.request.request_id.clone(), decision))
        })
        .collect()
}

pub use crate::approval::{DecisionClock, RecordedDecision};

fn waiting(record: &RunRecord) -> Vec<Pending> {
    // A run whose every pending call is decided is `running` (runnable) until a turn carries
    // the decisions out; until then its pending calls are still in its state.
    if !matches!(record.status, crate::store::RunStatus::Paused | crate::store::RunStatus::Running) {
        return Vec::new();
    }
    #[derive(Deserialize)]
    struct PendingOnly {
        #[serde(default)]
        pending: Vec<Pending>,
    }
    record.state.decode::<PendingOnly>().map(|s| s.pending).unwrap_or_default()
}

/// The model's call behind a journaled tool or approval step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepCall {
    /// The model's id for the call.
    pub call_id: String,
    /// The arguments the model sent (parsed).
    pub args: Value,
}

/// The part of a journaled model response that names its calls, read straight from the text:
/// its parts, or the `tool_calls` of a response journaled before parts existed.
#[derive(Deserialize)]
struct ToolCalls {
    #[serde(default)]
    parts: Option<Vec<crate::model::Part>>,
    #[serde(default)]
    tool_calls: Vec<ToolCallRequest>,
}

impl ToolCalls {
    fn into_calls(self) -> Vec<ToolCallRequest> {
        match self.parts {
            Some(parts) => parts
                .into_iter()
                .filter_map(|p| match p {
                    crate::model::Part::ToolCall { call, .. } => Some(call),
                    _ => None,
                })
                .collect(),
            None => self.tool_calls,
        }
    }
}

/// The model-issued call behind each tool and approval step of `steps`, by ordinal.
///
/// The journal stores keys, not arguments; the arguments are recovered from the journaled
/// model responses, whose calls hash to those keys. Steps a model response does not explain
/// (nested `ctx.tool()` calls, tools with their own `idempotency_key`) are absent.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{AgentDef, Runtime, inspect, testing::{ScriptedModel, Turn}, tool};
///
/// /// Echo back the provided text.
/// #[tool]
/// async fn echo(text: String) -> String { text }
///
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("support", "Echo.").tool(Echo))
///     .model(ScriptedModel::new([Turn::tool_calls([("c1", "echo", r#"{"text":"hi"}"#)]), Turn::text("hi")]))
///     .build()
///     .unwrap();
/// let run_id = runtime.run("Say hi").await.unwrap().run_id;
/// let steps = runtime.journal(&run_id).await.unwrap();
/// let calls = inspect::step_calls(&run_id, &steps);
/// let echo_step = steps.iter().find(|s| s.name == "echo").unwrap();
/// assert_eq!(calls[&echo_step.ordinal].call_id, "c1");
/// assert_eq!(calls[&echo_step.ordinal].args["text"], "hi");
/// # });
/// ```
pub fn step_calls(run_id: &str, steps: &[StepRecord]) -> HashMap<u64, StepCall> {
    let mut by_key: HashMap<(u64, &str), u64> = HashMap::with_capacity(steps.len());
    for s in steps {
        by_key.insert((s.epoch, s.key.as_str()), s.ordinal);
    }
    let results: HashMap<u64, &StepRecord> = steps.iter().map(|s| (s.ordinal, s)).collect();
    let mut epochs: Vec<u64> = steps.iter().map(|s| s.epoch).collect();
    epochs.sort_unstable();
    epochs.dedup();

    let mut calls = HashMap::new();
    for epoch in epochs {
        let mut callsite: u64 = 0;
        loop {
            let model_key = effect_key(run_id, epoch, &callsite.to_string(), &json!("model"));
            let Some(step) = by_key.get(&(epoch, model_key.as_str())).and_then(|o| results.get(o)) else { break };
            if step.kind != StepKind::Model || step.status != StepStatus::Finished {
                break;
            }
            let requests: Vec<ToolCallRequest> = step
                .result
                .as_ref()
                .and_then(|r| r.decode::<ToolCalls>().ok())
                .map(ToolCalls::into_calls)
                .unwrap_or_default();
            for (i, req) in requests.iter().enumerate() {
                let Ok(args) = parse_args(&req.name, &req.arguments) else { continue };
                let key = tool_key(run_id, epoch, callsite + 1 + i as u64, &req.name, &args);
                // A `replay = false` call is journaled once per execution, as `<key>:nonreplay:<n>`.
                let journaled = |k: &str| by_key.contains_key(&(epoch, k));
                let executions = (0u64..)
                    .map(|n| format!("{key}:nonreplay:{n}"))
                    .take_while(|k| journaled(k) || journaled(&approval_key(run_id, epoch, k, &req.name, &args)));
                for effect in std::iter::once(key.clone()).chain(executions) {
                    let approval = approval_key(run_id, epoch, &effect, &req.name, &args);
                    for k in [effect.as_str(), approval.as_str()] {
                        if let Some(&ordinal) = by_key.get(&(epoch, k)) {
                            calls.insert(ordinal, StepCall { call_id: req.call_id.to_string(), args: args.clone() });
                        }
                    }
                }
            }
            callsite += 1 + requests.len() as u64;
        }
    }
    calls
}

/// One line of a run's conversation, as [`conversation`] reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Utterance {
    /// `user` (an input), `assistant` (the model's text) or `reasoning` (the model's
    /// reasoning summary, or its reasoning text when the provider gave no summary; only where
    /// the provider returned and the run kept it).
    pub role: &'static str,
    /// The text.
    pub text: String,
    /// The journal step it came from, for the current turn's model responses (the earlier
    /// turns are read from the run's transcript, which keeps no ordinals).
    pub ordinal: Option<u64>,
}

/// A run's conversation in order: user inputs, the model's text and its kept reasoning
/// summaries; tool calls and results are the journal's (see [`step_calls`]). Closed turns come
/// from the run's transcript; a turn still open (paused, running, cancelled, failed) from its
/// input and the model responses journaled so far.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{AgentDef, Runtime, inspect, testing::{ScriptedModel, Turn}};
///
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("support", "Be brief."))
///     .model(ScriptedModel::new([Turn::text("Hello.")]))
///     .build()
///     .unwrap();
/// let run_id = runtime.run("Hi").await.unwrap().run_id;
/// let record = runtime.get_run(&run_id).await.unwrap().unwrap();
/// let lines = inspect::conversation(&record, &runtime.journal(&run_id).await.unwrap());
/// let said: Vec<_> = lines.iter().map(|u| (u.role, u.text.as_str())).collect();
/// assert_eq!(said, [("user", "Hi"), ("assistant", "Hello.")]);
/// # });
/// ```
pub fn conversation(record: &RunRecord, steps: &[StepRecord]) -> Vec<Utterance> {
    let Ok((transcript, open_input)) = crate::runtime::recorded_conversation(record) else { return Vec::new() };
    let mut lines = Vec::new();
    for message in &transcript {
        match message {
            Message::User { content } => lines.push(Utterance { role: "user", text: content.clone(), ordinal: None }),
            Message::Assistant { parts, .. } => said(&mut lines, parts, None),
            Message::Tool { .. } => {}
        }
    }
    if let Some(input) = open_input {
        lines.push(Utterance { role: "user", text: input, ordinal: None });
        let turn = steps
            .iter()
            .filter(|s| s.epoch == record.epoch && s.kind == StepKind::Model && s.status == StepStatus::Finished);
        for step in turn {
            let parts = step.result.as_ref().and_then(|r| r.decode::<Parts>().ok()).map(|p| p.parts);
            said(&mut lines, &parts.unwrap_or_default(), Some(step.ordinal));
        }
    }
    lines
}

/// The run id a run's journal keys are made from, for [`step_calls`]: the run's own, or for a
/// fork ([`Runtime::fork`](crate::Runtime::fork)) its original's.
///
/// ```
/// let record = kuralle::RunRecord::new("run-1", "support");
/// assert_eq!(kuralle::inspect::key_run(&record), "run-1");
/// ```
pub fn key_run(record: &RunRecord) -> String {
    crate::runtime::key_run(record)
}

/// A journaled model response's parts.
#[derive(Deserialize)]
struct Parts {
    #[serde(default)]
    parts: Vec<Part>,
}

fn said(lines: &mut Vec<Utterance>, parts: &[Part], ordinal: Option<u64>) {
    for part in parts {
        match part {
            Part::Text { text, .. } if !text.is_empty() => {
                lines.push(Utterance { role: "assistant", text: text.clone(), ordinal });
            }
            Part::Reasoning { text, summary, .. } => {
                let kept = if summary.is_empty() { text.clone() } else { summary.join("\n") };
                if !kept.is_empty() {
                    lines.push(Utterance { role: "reasoning", text: kept, ordinal });
                }
            }
            _ => {}
        }
    }
}
