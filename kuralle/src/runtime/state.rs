//! The runtime-owned part of a run record (`RunRecord::state`): the transcript before the
//! current turn, the turn's input and output, and the calls waiting for a decision.

use serde::{Deserialize, Serialize};

use crate::{
    approval::Pending,
    error::RunError,
    event::RunOutput,
    limits::RunLimits,
    model::Usage,
    store::{RunRecord, StoreError},
    transcript::Transcript,
};

/// The runtime-owned part of a run record (`RunRecord::state`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct RunState {
    /// The transcript before the current turn.
    pub(super) messages: Transcript,
    /// The current (or last) turn's input.
    pub(super) turn_input: Option<String>,
    /// The last finished turn's text.
    pub(super) output: String,
    /// The last turn's usage.
    pub(super) usage: Usage,
    /// Recently processed inbound idempotency keys.
    pub(super) inbound_keys: Vec<String>,
    /// Calls waiting for a human decision (status `paused`).
    #[serde(default)]
    pub(super) pending: Vec<Pending>,
    /// The agent's sensitive tool values, so readers of the store (the CLI, the console, an
    /// export) hide what the runtime hides. Refreshed each time the run opens.
    #[serde(default, skip_serializing_if = "crate::Redactions::is_empty")]
    pub(super) redact: crate::Redactions,
    /// The run's instructions when they differ from its agent's (a fork's override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) instructions: Option<String>,
    /// The run whose id keys this run's journal: set on a fork, to its original's (its copied
    /// steps keep their keys, so they replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) key_run: Option<String>,
    /// For a turn that failed after its transcript was written back: how many messages came
    /// before it, so `Runtime::retry` can open the turn again from its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) turn_start: Option<usize>,
    /// The last finished turn's accepted typed output. Boxed, as the limits below: a turn
    /// holds its run's state until it closes, and most runs have neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) value: Option<Box<serde_json::Value>>,
    /// The limits the run holds to, set when a turn opens with input (agent's and request's),
    /// so a resumed run, or a worker's, holds to the same ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) limits: Option<Box<RunLimits>>,
}

pub(super) fn decode_state(record: &RunRecord) -> Result<RunState, RunError> {
    decode_state_text(&record.run_id, &record.state)
}

/// [`decode_state`] of a state's text held apart from its record (a closing turn's).
pub(super) fn decode_state_text(run_id: &str, text: &crate::JsonText) -> Result<RunState, RunError> {
    text.decode()
        .map_err(|e| RunError::Store(StoreError::Corrupt(format!("run `{run_id}` has unreadable state: {e}").into())))
}

pub(super) fn output_of(record: &RunRecord, state: &RunState) -> RunOutput {
    output(record, state.output.clone(), state.usage, state.value.as_deref().cloned())
}

/// The run's output from its record and the parts of its state that make it: a closing turn
/// keeps these and lets the rest of its state go.
pub(super) fn output(record: &RunRecord, text: String, usage: Usage, value: Option<serde_json::Value>) -> RunOutput {
    RunOutput { run_id: record.run_id.clone(), text, status: record.status, usage, value }
}

/// The user inputs of a run's turns, in order, from its stored record: the user messages of
/// its transcript, then the input of a turn that has not closed (paused, running or failed:
/// its transcript was not written back).
pub(crate) fn recorded_inputs(record: &RunRecord) -> Result<Vec<String>, RunError> {
    let mut state = decode_state(record)?;
    if let Some(start) = state.turn_start.take() {
        state.messages = state.messages.prefix(start);
    }
    let mut inputs: Vec<String> = state
        .messages
        .iter()
        .filter_map(|m| match m {
            crate::model::Message::User { content } => Some(content.clone()),
            _ => None,
        })
        .collect();
    if !closed(record)
        && let Some(input) = state.turn_input
    {
        inputs.push(input);
    }
    Ok(inputs)
}

/// Whether the run's last turn closed with its transcript written back.
fn closed(record: &RunRecord) -> bool {
    matches!(
        record.status,
        crate::store::RunStatus::Finished | crate::store::RunStatus::MaxSteps | crate::store::RunStatus::Interrupted
    )
}

/// The stored conversation of a run: its transcript, and for a turn whose transcript was not
/// written back (paused, running, cancelled, failed) that turn's input, separately.
pub(crate) fn recorded_conversation(record: &RunRecord) -> Result<(Transcript, Option<String>), RunError> {
    let state = decode_state(record)?;
    if state.turn_start.is_some() || closed(record) {
        return Ok((state.messages, None));
    }
    Ok((state.messages, state.turn_input))
}

/// The run whose id keys the run's journal (a fork's original; else the run itself).
pub(crate) fn key_run(record: &RunRecord) -> String {
    decode_state(record).ok().and_then(|s| s.key_run).unwrap_or_else(|| record.run_id.clone())
}
