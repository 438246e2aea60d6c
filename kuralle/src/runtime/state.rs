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
    /// The limits the run holds to, set when a turn opens with input (agent's and request's),
    /// so a resumed run, or a worker's, holds to the same ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) limits: Option<RunLimits>,
}

pub(super) fn decode_state(record: &RunRecord) -> Result<RunState, RunError> {
    record.state.decode().map_err(|e| {
        RunError::Store(StoreError::Corrupt(format!("run `{}` has unreadable state: {e}", record.run_id).into()))
    })
}

pub(super) fn output_of(record: &RunRecord, state: &RunState) -> RunOutput {
    RunOutput { run_id: record.run_id.clone(), text: state.output.clone(), status: record.status, usage: state.usage }
}
