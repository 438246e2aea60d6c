//! Closing a turn: the run's row written with the turn's end, retried under optimistic
//! concurrency.

use super::state::{RunState, decode_state, decode_state_text, output};
use crate::{
    approval::Pending,
    clock::now_ms,
    error::RunError,
    event::RunOutput,
    journal::{Journal, RunWriter},
    json::JsonText,
    model::Usage,
    store::{FinishedStep, RunRecord, RunStatus, StoreError},
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
    /// The turn's last model response, journaled with the closing write (not with a failed
    /// turn's, which the turn flushes first).
    pub(super) last: Option<FinishedStep>,
}

/// Persists the turn's end. Losing an optimistic-concurrency race re-reads and retries: the
/// version check protects the record, it never fails the turn.
///
/// The turn's end is folded into the state before the future is made, and the future is an
/// `async` block: an `async fn` keeps its arguments twice (as they came in and as the body's
/// locals) and these are half a kilobyte. Under a kilobyte, the boxed future is one of the
/// allocator's small sizes: with 10,000 runs in flight a large one took glibc's arena lock.
///
/// The state is serialized there too, and only its text is kept: the write waits for a
/// commit, and with 10,000 runs in flight every run's close waited in the writer's queue at
/// once, each holding its transcript and the journal's cache of its steps (about two
/// kilobytes a run) for nothing. A lost race, which is rare, decodes the text again.
pub(super) fn close<'a>(
    writer: RunWriter<'a>,
    journal: &'a Journal,
    mut record: RunRecord,
    mut state: RunState,
    closing: Closing,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'a {
    let Closing { transcript, status, text, usage, pending, value, mut last } = closing;
    journal.forget_steps();
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
    let mut serialized = JsonText::serialize_from(&state).unwrap_or_default();
    let RunState { output: text, usage, value, .. } = state;
    async move {
        // Whether a close was refused: after one, a store that journals `last` apart from the
        // run (`RunStore::put_run_and_release_after`'s provided two writes) may hold it.
        let mut refused = false;
        for _ in 0..CLOSE_ATTEMPTS {
            let at_ms = now_ms();
            let attempt = RunRecord { state: serialized.clone(), updated_at_ms: at_ms, ..record.clone() };
            // A failed turn's close may be followed by marking the run ended, under the lease.
            let written = if status == RunStatus::Failed {
                writer.put_run(attempt).await
            } else {
                writer.put_run_closing(attempt, last.clone()).await
            };
            match written {
                Ok(version) => {
                    record.version = version;
                    return Ok(output(&record, text, usage, value.map(|v| *v)));
                }
                Err(StoreError::VersionConflict { actual, .. }) => {
                    refused = true;
                    let fresh = writer.get_run().await?.ok_or_else(|| RunError::RunNotFound(record.run_id.clone()))?;
                    let keys = decode_state(&fresh)?.inbound_keys;
                    let mut state = decode_state_text(&record.run_id, &serialized)?;
                    state.inbound_keys = keys;
                    serialized = JsonText::serialize_from(&state).unwrap_or_default();
                    record.version = actual.max(fresh.version);
                }
                // Journaled by the refused attempt: only the run is left to write.
                Err(StoreError::DuplicateKey { .. }) if refused && last.is_some() => last = None,
                // In doubt: an outage answered the write, which may have landed whole (its
                // answer lost) or not at all. Not when it was an outcome the turn lost: that
                // write was never sent.
                Err(e @ StoreError::Unavailable(_)) if status != RunStatus::Failed && !writer.outcome_lost() => {
                    if let Some(version) = landed(writer, &record, at_ms).await? {
                        record.version = version;
                        return Ok(output(&record, text, usage, value.map(|v| *v)));
                    }
                    // Not landed: the answer is journaled as the journal journals a step after
                    // an outage (found if an earlier write of it landed), then the run alone, as
                    // when the two were separate writes.
                    match last.take() {
                        // Boxed: only a close an outage left in doubt awaits it.
                        Some(last) => Box::pin(journal.journal_after_doubt(last)).await?,
                        None => return Err(e.into()),
                    }
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

/// The version a closing write of `record` at `at_ms` gave the run, if the run reads as that
/// write left it: the write landed whole though an outage answered it. A run written with its
/// last step (one transaction, or after the step's own write) holds the step too. Read without
/// the lease, which the write may have given up; a given-up lease is noted, so that the turn
/// does not release it again.
async fn landed(writer: RunWriter<'_>, record: &RunRecord, at_ms: i64) -> Result<Option<u64>, RunError> {
    let Some(fresh) = writer.get_run().await? else { return Ok(None) };
    let ours = fresh.version == record.version + 1 && fresh.status == record.status && fresh.updated_at_ms == at_ms;
    if !ours {
        return Ok(None);
    }
    writer.note_release().await?;
    Ok(Some(fresh.version))
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{
        journal::Fence,
        store::{NewStep, RunStore, StepKind, StepOutcome, StepStatus},
        stores::{MemoryStore, SqliteStore},
    };

    /// A close refused by a version conflict is retried with the run read again, and its last
    /// model response lands once: with the run (one transaction) or, where the store journals
    /// it apart, by the refused attempt, whose step a retry then finds a duplicate.
    #[tokio::test]
    async fn a_refused_close_journals_its_last_step_once() {
        for release in [true, false] {
            let stores: [Arc<dyn RunStore>; 2] =
                [Arc::new(MemoryStore::new()), Arc::new(SqliteStore::in_memory().unwrap())];
            for store in stores {
                let lease = store.acquire_lease("r", "me", Duration::from_secs(60)).await.unwrap();
                // Another turn's inbound key, which the retried close must keep.
                let theirs = RunState { inbound_keys: vec!["k1".into()], ..RunState::default() };
                let state = JsonText::serialize_from(&theirs).unwrap();
                store.create_run(RunRecord::new("r", "a").with_state(state), lease.token).await.unwrap();
                // Another write under the lease since the turn read the run (version 0).
                let read = store.get_run("r").await.unwrap().unwrap();
                assert_eq!(store.put_run(read, lease.token).await.unwrap(), 1);
                let fence = Fence::new(&lease, CancellationToken::new());
                if release {
                    fence.on_close(Box::new(|| true));
                }
                let last = FinishedStep {
                    step: NewStep::new("m", StepKind::Model, "model"),
                    outcome: StepOutcome::Finished(JsonText::from(serde_json::json!({"text": "done"}))),
                    finished_at_ms: 7,
                };
                let closing = Closing {
                    transcript: {
                        let mut t = Transcript::default();
                        t.push(crate::Message::User { content: "hi".into() });
                        t
                    },
                    status: RunStatus::Finished,
                    text: "done".into(),
                    usage: Usage::default(),
                    pending: Vec::new(),
                    value: Some(serde_json::json!({"n": 1})),
                    last: Some(last),
                };
                // What else a run's state may hold, which the retry must write as it was.
                let ours = RunState {
                    turn_input: Some("hi".into()),
                    instructions: Some("Be terse.".into()),
                    key_run: Some("original".into()),
                    limits: Some(Box::new(crate::RunLimits { max_requests: Some(3), ..Default::default() })),
                    ..RunState::default()
                };
                let journal =
                    Journal::open(Arc::clone(&store), Arc::clone(&fence), "r", 0, 100, false, true).await.unwrap();
                let writer = RunWriter::new(store.as_ref(), &fence);
                let out = close(writer, &journal, RunRecord::new("r", "a"), ours, closing).await.unwrap();
                assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "done"));
                assert_eq!(out.value, Some(serde_json::json!({"n": 1})));
                let run = store.get_run("r").await.unwrap().unwrap();
                assert_eq!((run.status, run.version), (RunStatus::Finished, 2));
                // The retry wrote the turn's state, decoded again from the refused attempt's
                // text, with the inbound keys the run had since.
                let stored = decode_state(&run).unwrap();
                assert_eq!(stored.messages.to_vec(), [crate::Message::User { content: "hi".into() }]);
                assert_eq!((stored.output.as_str(), &stored.inbound_keys[..]), ("done", &["k1".to_owned()][..]));
                assert_eq!(stored.value.as_deref(), Some(&serde_json::json!({"n": 1})));
                assert_eq!(
                    (stored.turn_input.as_deref(), stored.instructions.as_deref(), stored.key_run.as_deref()),
                    (Some("hi"), Some("Be terse."), Some("original"))
                );
                assert_eq!(stored.limits.and_then(|l| l.max_requests), Some(3));
                let steps = store.steps("r").await.unwrap();
                let journaled: Vec<_> = steps.iter().map(|s| (s.key.as_str(), s.status)).collect();
                assert_eq!(journaled, [("m", StepStatus::Finished)], "release at close: {release}");
            }
        }
    }
}
