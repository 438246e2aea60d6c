//! Closing a turn: the run's row written with the turn's end, retried under optimistic
//! concurrency.

use super::state::{RunState, decode_state, output_of};
use crate::{
    approval::Pending,
    clock::now_ms,
    error::RunError,
    event::RunOutput,
    journal::RunWriter,
    json::JsonText,
    model::Usage,
    store::{RunRecord, RunStatus, StoreError},
    transcript::Transcript,
};

/// How often closing a run retries after losing an optimistic-concurrency race.
pub(super) const CLOSE_ATTEMPTS: usize = 16;

/// How a turn ended, as `close` writes it into the run.
pub(super) struct Closing {
    pub(super) transcript: Transcript,
    pub(super) status: RunStatus,
    pub(super) text: String,
    pub(super) usage: Usage,
    pub(super) pending: Vec<Pending>,
    /// The accepted typed output, if any.
    pub(super) value: Option<serde_json::Value>,
}

/// Persists the turn's end. Losing an optimistic-concurrency race re-reads and retries: the
/// version check protects the record, it never fails the turn.
///
/// The turn's end is folded into the state before the future is made, and the future is an
/// `async` block: an `async fn` keeps its arguments twice (as they came in and as the body's
/// locals) and these are half a kilobyte. Under a kilobyte, the boxed future is one of the
/// allocator's small sizes: with 10,000 runs in flight a large one took glibc's arena lock.
pub(super) fn close<'a>(
    writer: RunWriter<'a>,
    mut record: RunRecord,
    mut state: RunState,
    closing: Closing,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'a {
    let Closing { transcript, status, text, usage, pending, value } = closing;
    // A failed turn's transcript is kept for display; a retry starts the turn again here.
    state.turn_start = (status == RunStatus::Failed).then_some(state.messages.len());
    state.messages = transcript;
    state.output = text;
    state.usage = usage;
    state.pending = pending;
    state.value = value.map(Box::new);
    record.status = status;
    // The record is moved into the store (its state can be a long transcript); only a lost
    // race rebuilds it.
    record.state = JsonText::null();
    async move {
        for _ in 0..CLOSE_ATTEMPTS {
            let attempt = RunRecord {
                state: JsonText::serialize_from(&state).unwrap_or_default(),
                updated_at_ms: now_ms(),
                ..record.clone()
            };
            // A failed turn's close may be followed by marking the run ended, under the lease.
            let written = if status == RunStatus::Failed {
                writer.put_run(attempt).await
            } else {
                writer.put_run_closing(attempt).await
            };
            match written {
                Ok(version) => {
                    record.version = version;
                    return Ok(output_of(&record, &state));
                }
                Err(StoreError::VersionConflict { actual, .. }) => {
                    let fresh = writer.get_run().await?.ok_or_else(|| RunError::RunNotFound(record.run_id.clone()))?;
                    let keys = decode_state(&fresh)?.inbound_keys;
                    state.inbound_keys = keys;
                    record.version = actual.max(fresh.version);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(RunError::Store(StoreError::Unavailable(
            format!("run `{}` kept changing under this turn; gave up after {CLOSE_ATTEMPTS} attempts", record.run_id)
                .into(),
        )))
    }
}
