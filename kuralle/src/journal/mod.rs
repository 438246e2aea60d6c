//! The durable effect journal: every tool call, model response, `ctx.now()`, `ctx.uuid()` and
//! nested `ctx.tool()` is a step, written as an intent before it runs and finalized after.
//!
//! `Journal` is a run's fenced step writer: it loads a run's steps once, answers replay
//! lookups from memory, and writes intents (a whole batch in one append, so one commit) and
//! outcomes, each through the run's one fenced writer (`RunWriter`), which the run loop
//! also writes the run's row with. An outcome is sent without waiting for its commit
//! (`in_flight.rs`); every later write of the run waits for it.

mod fence;
mod in_flight;
mod key;
mod retry;
mod writer;

use std::sync::{Arc, Mutex, PoisonError};

// Fuzz and bench hooks, and what operators' tools rebuild keys with: not part of the documented API.
#[doc(hidden)]
pub use key::{
    approval_key, canonical_json, effect_key, effect_key_for, helper_key, override_key, tool_key, tool_key_raw,
};
use serde_json::Value;

use crate::{
    clock::now_ms,
    error::RunError,
    json::JsonText,
    keymap::CompactKey,
    limits::Spent,
    store::{
        FinishedStep, FinishedWithIntents, NewStep, RunStore, StepKind, StepOutcome, StepRecord, StepStatus, StoreError,
    },
};
pub(crate) use fence::Fence;
use retry::Retrying;
pub(crate) use writer::RunWriter;

/// Default [`RuntimeBuilder::max_journal_entries`](crate::RuntimeBuilder::max_journal_entries):
/// the most entries one run's journal may hold.
pub const DEFAULT_MAX_JOURNAL_ENTRIES: u64 = 10_000;

/// One run's journal, as seen by one turn of that run.
pub(crate) struct Journal {
    store: Arc<dyn RunStore>,
    /// The turn's lease: every write carries its token; a fenced write stops the turn.
    fence: Arc<Fence>,
    /// `"<key run>#<epoch>"`, the key namespace. The key run is the run whose ids key this
    /// journal: the run itself, or the run a fork was copied from (its copied keys must match).
    /// The run's id is the fence's, and the key run is read from here: a journal keeps no copy
    /// of either (each was an allocation of every run in flight).
    namespace: String,
    /// Where the key run ends in `namespace`.
    key_run_len: usize,
    epoch: u64,
    limit: u64,
    state: Mutex<State>,
}

/// Steps a new run's journal has room for before it first grows: three tool turns and an
/// answer take seven, and seven fill a map's eight buckets (one more would take sixteen).
const FIRST_STEPS: usize = 7;

#[derive(Default)]
struct State {
    by_key: std::collections::HashMap<CompactKey, Cached, foldhash::fast::RandomState>,
    len: u64,
    /// A finished step not yet written: journaled with the next intents (one commit). Boxed:
    /// a turn's context holds the state for the run's whole life, and the futures that write
    /// it held it again while the write waited (80 bytes in each).
    deferred: Option<Box<Deferred>>,
    /// What the run has spent, as journaled: run limits are checked against it.
    spent: Spent,
}

/// What replay needs of a step: a journal of 10,000 steps is held in memory for the whole
/// turn, so the cache keeps this, not the store's full record. Values stay the store's JSON
/// text (shared, not copied): a replayed step is decoded from it only when it is looked up.
enum Cached {
    Running(u64),
    /// `None` when the turn cannot look the step up again and its result stays in the store.
    Finished(Option<JsonText>),
    Failed(JsonText),
}

impl From<StepRecord> for Cached {
    fn from(s: StepRecord) -> Self {
        match s.status {
            StepStatus::Running => Self::Running(s.ordinal),
            StepStatus::Finished => Self::Finished(Some(s.result.unwrap_or_default())),
            StepStatus::Failed => Self::Failed(s.error.unwrap_or_default()),
        }
    }
}

/// An intent to write: a step's key, kind and name.
pub(crate) type Intent<'a> = (&'a str, StepKind, &'a str);

/// A finished step waiting to be written with the intents that follow it.
struct Deferred {
    key: String,
    kind: StepKind,
    name: String,
    value: JsonText,
    started_at_ms: i64,
}

/// What the journal knows about a key.
pub(crate) enum Lookup {
    /// Never journaled: write an intent, then run.
    Fresh,
    /// Intent written, no outcome: the process died mid-call (or the call was cancelled).
    Running(u64),
    /// Finished with this result.
    Finished(Value),
    /// Failed with this serialized error.
    Failed(Value),
}

impl Journal {
    /// Loads the steps of the run whose lease `fence` guards. `limit` is `max_journal_entries`. With `usage`, what the run's
    /// model responses spent (tokens, dollars) is added up as well (see [`spent`](Self::spent)).
    /// A run the turn has just created has none, and its store is not asked: on SQLite that
    /// read was a trip to a blocking thread for every run started.
    pub(crate) async fn open(
        store: Arc<dyn RunStore>,
        fence: Arc<Fence>,
        key_run: &str,
        epoch: u64,
        limit: u64,
        usage: bool,
        created: bool,
    ) -> Result<Self, RunError> {
        let steps = if created { Vec::new() } else { store.steps(fence.run_id()).await? };
        let len = steps.len() as u64;
        let mut spent = Spent::default();
        for step in &steps {
            spent.add_step(step, usage);
        }
        // The key moves into the map; the cached record's own copy is never read.
        let by_key = steps
            .into_iter()
            .map(|mut s| (CompactKey::from_owned(std::mem::take(&mut s.key)), Cached::from(s)))
            .collect();
        Ok(Self {
            store,
            fence,
            namespace: format!("{key_run}#{epoch}"),
            key_run_len: key_run.len(),
            epoch,
            limit,
            state: Mutex::new(State { by_key, len, deferred: None, spent }),
        })
    }

    /// A throwaway journal for one call outside any run (an MCP `tools/call`): a fresh
    /// in-memory store holding the run `run_id`, owned by its own lease like any other run (the
    /// store checks the fence on every write).
    #[cfg(feature = "mcp")]
    pub(crate) async fn standalone(run_id: &str) -> Result<Self, RunError> {
        /// The throwaway lease is never renewed; expiry alone does not fence a write.
        const TTL: std::time::Duration = std::time::Duration::from_secs(30);
        let store: Arc<dyn RunStore> = Arc::new(crate::stores::MemoryStore::new());
        let lease = store.acquire_lease(run_id, "standalone", TTL).await?;
        let fence = Fence::new(&lease, tokio_util::sync::CancellationToken::new());
        store.create_run(crate::store::RunRecord::new(run_id, "standalone"), fence.token()).await?;
        Self::open(store, fence, run_id, 0, DEFAULT_MAX_JOURNAL_ENTRIES, false, true).await
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section is a single map operation, so a panic cannot leave the
        // state half-updated: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The run's fenced writer, through which every step write goes.
    fn writer(&self) -> RunWriter<'_> {
        RunWriter::new(self.store.as_ref(), &self.fence)
    }

    pub(crate) fn run_id(&self) -> &str {
        self.fence.run_id()
    }

    /// The run id in this journal's keys (see [`Journal::open`]).
    pub(crate) fn key_run(&self) -> &str {
        &self.namespace[..self.key_run_len]
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// What the run has spent: its journaled model requests and tool calls, and (when the
    /// journal was opened counting usage) the tokens and dollars of its model responses.
    pub(crate) fn spent(&self) -> Spent {
        self.state().spent
    }

    /// Adds a model response's tokens and dollars to [`spent`](Self::spent).
    pub(crate) fn spend(&self, usage: crate::model::Usage, cost_usd: Option<f64>) {
        self.state().spent.add_response(usage, cost_usd);
    }

    /// Whether the turn lost the run's lease: nothing more may execute or be journaled.
    pub(crate) fn lease_lost(&self) -> bool {
        self.fence.is_lost()
    }

    /// The key of the effect at `callsite` with `payload`.
    pub(crate) fn key(&self, callsite: &str, payload: &Value) -> String {
        effect_key_for(&self.namespace, callsite, payload)
    }

    /// The key of the step at `callsite` whose payload is the string `what` (`"now"`, `"uuid"`).
    pub(crate) fn string_key(&self, callsite: &str, what: &str) -> String {
        key::string_key_at(&self.namespace, callsite, what)
    }

    /// The key of the model step at `callsite` (its payload is the string `"model"`).
    pub(crate) fn model_key(&self, callsite: u64) -> String {
        key::string_key_at(&self.namespace, itoa::Buffer::new().format(callsite), "model")
    }

    /// The key of the tool call `name(args)` at `callsite`.
    pub(crate) fn tool_key(&self, callsite: &str, name: &str, args: &Value) -> String {
        key::tool_key_at(&self.namespace, callsite, name, args)
    }

    /// [`tool_key`](Self::tool_key) from the raw argument text, without parsing it into a `Value`.
    pub(crate) fn tool_key_raw(&self, callsite: &str, name: &str, raw: &str) -> Result<String, serde_json::Error> {
        key::tool_key_raw_at(&self.namespace, callsite, name, raw)
    }

    /// A finished step's result as its JSON text (shared, not copied), for a caller that
    /// decodes it straight into its own type.
    pub(crate) fn result_text(&self, key: &str) -> Option<JsonText> {
        match self.state().by_key.get(&CompactKey::of(key))? {
            Cached::Finished(result) => Some(result.clone().unwrap_or_default()),
            Cached::Running(_) | Cached::Failed(_) => None,
        }
    }

    pub(crate) fn lookup(&self, key: &str) -> Lookup {
        // The text is cloned (a reference count) under the lock and parsed outside it.
        let found = match self.state().by_key.get(&CompactKey::of(key)) {
            None => return Lookup::Fresh,
            Some(Cached::Running(ordinal)) => return Lookup::Running(*ordinal),
            Some(Cached::Finished(result)) => Ok(result.clone()),
            Some(Cached::Failed(error)) => Err(error.clone()),
        };
        match found {
            Ok(result) => Lookup::Finished(result.map_or(Value::Null, |text| text.to_value())),
            Err(error) => Lookup::Failed(error.to_value()),
        }
    }

    /// Reserves `n` steps under the limit before any await, so concurrent writers cannot
    /// overshoot it together.
    fn reserve(&self, n: u64) -> Result<(), RunError> {
        let mut st = self.state();
        if st.len + n > self.limit {
            return Err(RunError::StepLimit { run_id: self.run_id().to_owned(), limit: self.limit });
        }
        st.len += n;
        Ok(())
    }

    /// Journals a finished step (a model response) with the next write instead of on its
    /// own: [`begin`](Self::begin) writes it together with the intents of the calls the
    /// response asks for, one commit for both. Nothing runs in between, so a crash before that
    /// write loses only the response, which a resumed run asks for again; the run must
    /// [`flush`](Self::flush) before it ends.
    pub(crate) async fn defer_finished(
        &self,
        key: String,
        kind: StepKind,
        name: &str,
        value: JsonText,
    ) -> Result<(), RunError> {
        self.flush().await?;
        self.reserve(1)?;
        let deferred = Box::new(Deferred { key, kind, name: name.to_owned(), value, started_at_ms: now_ms() });
        let mut st = self.state();
        st.spent.count(kind);
        st.deferred = Some(deferred);
        Ok(())
    }

    /// Writes a deferred finished step, if any, on its own, and waits for the outcomes in
    /// flight: after it, every step of the turn so far is journaled.
    pub(crate) async fn flush(&self) -> Result<(), RunError> {
        self.begin(&[]).await.map(drop)
    }

    /// The deferred finished step, if any, for the write that closes the turn
    /// ([`RunWriter::put_run_closing`]) to journal with the run's row: one commit where a
    /// flush and the close were two. The journal notes nothing of it: the turn ends with that
    /// write.
    pub(crate) fn take_deferred(&self) -> Option<FinishedStep> {
        let d = self.state().deferred.take()?;
        let step =
            NewStep { key: d.key, kind: d.kind, name: d.name, epoch: self.epoch, started_at_ms: d.started_at_ms };
        Some(FinishedStep { step, outcome: StepOutcome::Finished(d.value), finished_at_ms: now_ms() })
    }

    /// Lets go of what the turn knows of its steps, once it is closing: it looks no step up
    /// again, and a call still running that finishes later only writes its outcome. The cache
    /// is half a kilobyte of every run while its closing write waits for a commit, and at
    /// 10,000 runs in flight every run's close waited in the writer's queue at once.
    pub(crate) fn forget_steps(&self) {
        let cache = std::mem::take(&mut self.state().by_key);
        // Freed once the lock is let go.
        drop(cache);
    }

    /// Journals `last`, which a closing write ([`take_deferred`](Self::take_deferred)) failed
    /// to write in doubt (an outage answered it, and it may have committed): once, and found
    /// journaled if that write's append landed. Not tried again on an outage: the close stopped
    /// renewing the lease before its write, so no renewal proves it held.
    pub(crate) async fn journal_after_doubt(&self, last: FinishedStep) -> Result<(), RunError> {
        let FinishedStep { step, outcome, .. } = last;
        let value = match outcome {
            StepOutcome::Finished(value) => value,
            // `take_deferred` makes only finished steps.
            StepOutcome::Failed(_) => return Err(RunError::Store(StoreError::Corrupt("a failed closing step".into()))),
        };
        let deferred =
            Deferred { key: step.key, kind: step.kind, name: step.name, value, started_at_ms: step.started_at_ms };
        self.append(Some(&deferred), &[], Retrying::once_after_doubt()).await?;
        Ok(())
    }

    /// Writes intents for `(key, kind, name)` in order, in one append (preceded by a deferred
    /// finished step, if any, in the same commit); returns the intents' ordinals. Borrowed:
    /// the store gets its own copies, and the cache keeps a key's digest, not its text.
    ///
    /// Not an `async fn`: its future is part of the one every run of a wave of answers holds
    /// while its intents commit, and an async fn keeps each argument twice.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub(crate) fn begin<'a>(
        &'a self,
        intents: &'a [Intent<'_>],
    ) -> impl Future<Output = Result<Vec<u64>, RunError>> + Send + 'a {
        async move {
            let deferred = self.state().deferred.take();
            if intents.is_empty() && deferred.is_none() {
                // Nothing to write, but what was sent must have committed: a flush promises the
                // turn's steps are journaled.
                self.fence.written().await?;
                return Ok(Vec::new());
            }
            let n = intents.len() as u64;
            self.reserve(n)?;
            let mut ordinals = match self.append(deferred.as_deref(), intents, Retrying::new()).await {
                Ok(o) => o,
                Err(e) => {
                    self.state().len -= n + u64::from(deferred.is_some());
                    return Err(e.into());
                }
            };
            let mut st = self.state();
            if st.by_key.capacity() == 0 {
                // Room for a short run's steps at once: a map grown from empty was allocated,
                // rehashed and freed twice in a run of seven steps, and the frees were among the
                // allocator's most contended at 10,000 runs in flight. Made here, with the first
                // step, not when the journal opens: every run started at once touched it before
                // its first model call.
                st.by_key.reserve(FIRST_STEPS);
            }
            if let Some(d) = deferred {
                ordinals.remove(0);
                // This turn never reads a finished model response again (its callsite is behind
                // it): the cache notes only that it finished.
                st.by_key.insert(CompactKey::from_owned(d.key), Cached::Finished(None));
            }
            for (&(key, kind, _), ordinal) in intents.iter().zip(&ordinals) {
                st.spent.count(kind);
                st.by_key.insert(CompactKey::of(key), Cached::Running(*ordinal));
            }
            Ok(ordinals)
        }
    }

    /// Appends the intents (after the deferred finished step, if any) in one write. A store
    /// outage does not end the turn at once: the append is tried again, as an outcome's write
    /// is, while one renewal proves the lease held. A retry that finds the keys journaled
    /// learns that an earlier attempt committed and only its answer was lost (the connection
    /// broke): under our fence nobody else appends, so the ordinals are read back and the calls
    /// run now. Ending the turn instead would leave their intents `Running` for the next turn,
    /// which must then report an `at_most_once` call that never started as indeterminate.
    ///
    /// Not an `async fn`, as [`begin`](Self::begin), whose future holds this one.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    fn append<'a>(
        &'a self,
        deferred: Option<&'a Deferred>,
        intents: &'a [Intent<'_>],
        mut retrying: Retrying,
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send + 'a {
        async move {
            let started_at_ms = now_ms();
            let step = |key: &str, kind: StepKind, name: &str, started_at_ms: i64| NewStep {
                key: key.to_owned(),
                kind,
                name: name.to_owned(),
                epoch: self.epoch,
                started_at_ms,
            };
            loop {
                let new: Vec<NewStep> =
                    intents.iter().map(|(key, kind, name)| step(key, *kind, name, started_at_ms)).collect();
                let writer = self.writer();
                let appended = match deferred {
                    None => writer.append_steps(new).await,
                    Some(d) => {
                        let done = step(&d.key, d.kind, &d.name, d.started_at_ms);
                        // The store shares the text (a reference count); this turn never reads a
                        // finished model response again (its callsite is behind it), so the cache
                        // keeps none and the deferred copy is dropped by the caller.
                        let outcome = StepOutcome::Finished(d.value.clone());
                        let write =
                            FinishedWithIntents { finished: done, outcome, finished_at_ms: now_ms(), intents: new };
                        writer.append_finished_with_intents(write).await
                    }
                };
                match appended {
                    Ok(ordinals) => return Ok(ordinals),
                    // Both boxed: after an outage only, and in this future they would size the one
                    // every run of a wave of answers holds while its intents commit.
                    Err(e @ StoreError::DuplicateKey { .. }) if retrying.retried() => {
                        return Box::pin(self.appended_before(deferred, intents)).await?.ok_or(e);
                    }
                    // Only a lost connection can hide a committed append; a full disk refused it.
                    // An outcome the turn lost fails every write alike: not this append's to retry.
                    Err(e @ StoreError::Unavailable(_)) if !self.fence.is_lost() && !self.fence.outcome_lost() => {
                        if !Box::pin(retrying.again(&self.fence, "journaling the calls' intents", &e)).await {
                            return Err(e);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// The ordinals an earlier, unanswered append gave the deferred step and the intents, as
    /// [`append`](Self::append) returns them, if the store holds every one of them as this
    /// turn wrote it (its epoch; the intents still running); `None` otherwise.
    async fn appended_before(
        &self,
        deferred: Option<&Deferred>,
        intents: &[Intent<'_>],
    ) -> Result<Option<Vec<u64>>, StoreError> {
        let steps = self.store.steps(self.run_id()).await?;
        let ours = |key: &str| steps.iter().find(|s| s.key == key && s.epoch == self.epoch);
        let mut ordinals = Vec::with_capacity(intents.len() + 1);
        for (key, _, _) in intents {
            match ours(key) {
                Some(s) if s.status == StepStatus::Running => ordinals.push(s.ordinal),
                _ => return Ok(None),
            }
        }
        if let Some(d) = deferred {
            let Some(s) = ours(&d.key) else { return Ok(None) };
            // A store whose append and finish are two writes may have lost the answer between
            // them: the response is in hand, so it is finished now.
            if s.status == StepStatus::Running {
                self.writer().finish_step(s.ordinal, StepOutcome::Finished(d.value.clone()), now_ms()).await?;
            }
            ordinals.insert(0, s.ordinal);
        }
        tracing::info!(run_id = %self.run_id(), "an earlier attempt journaled the intents; its answer was lost");
        Ok(Some(ordinals))
    }

    /// Records the outcome of the step at `ordinal` (whose key is `key`). `reused` says whether
    /// this turn may look the key up again (a user-chosen idempotency key two calls can share);
    /// otherwise the cache keeps only that the step finished, not its result.
    ///
    /// Returns once the write is sent, not committed (see [`in_flight`]): the run's next write
    /// waits for the commit, and fails if it failed. An error here is one the store gave at
    /// once.
    pub(crate) async fn finish(
        &self,
        key: &str,
        ordinal: u64,
        outcome: StepOutcome,
        reused: bool,
    ) -> Result<(), RunError> {
        let at = now_ms();
        // Clones of the text share it with the store's copy: a reference count each.
        let cached = match &outcome {
            StepOutcome::Finished(v) if reused => Some(v.clone()),
            _ => None,
        };
        let failed = match &outcome {
            StepOutcome::Failed(e) => Some(e.clone()),
            StepOutcome::Finished(_) => None,
        };
        let write = write_outcome(Arc::clone(&self.store), Arc::clone(&self.fence), ordinal, outcome, at);
        in_flight::send(&self.fence, self.store.finishes_without_polling(), write).await?;
        if let Some(entry) = self.state().by_key.get_mut(&CompactKey::of(key)) {
            *entry = match failed {
                None => Cached::Finished(cached),
                Some(e) => Cached::Failed(e),
            };
        }
        Ok(())
    }
}

/// Writes a step's outcome. The outcome is in hand: the call ran. Losing it would run the call
/// again on resume, so a store outage does not end the turn at once: the write is tried again,
/// with backoff, for as long as one renewal proves the lease held (the renewals lose the fence
/// sooner if the lease lapses). An outage longer than that ends the turn, resumable, as before.
/// Owns what it needs: it runs on as a write in flight ([`in_flight::send`]) after the caller
/// went on.
async fn write_outcome(
    store: Arc<dyn RunStore>,
    fence: Arc<Fence>,
    ordinal: u64,
    outcome: StepOutcome,
    at: i64,
) -> Result<(), StoreError> {
    let mut retrying = Retrying::new();
    loop {
        match RunWriter::new(store.as_ref(), &fence).finish_step(ordinal, outcome.clone(), at).await {
            Ok(()) => return Ok(()),
            // An earlier attempt committed but its answer was lost (the connection broke):
            // under our fence nobody else can have finished the step.
            Err(StoreError::StepNotRunning { .. }) if retrying.retried() => return Ok(()),
            Err(e) if e.is_retryable() && !fence.is_lost() => {
                if !retrying.again(&fence, &format!("writing step {ordinal}'s outcome"), &e).await {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::{store::RunRecord, stores::MemoryStore};

    /// A just-created run's journal takes the room of its cache with its first step, not when
    /// it opens: 10,000 runs started at once each touched 536 bytes of it before their first
    /// model call.
    #[tokio::test]
    async fn a_new_runs_journal_takes_its_room_with_its_first_step() {
        let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
        let lease = store.acquire_lease("a", "me/turn", Duration::from_secs(30)).await.unwrap();
        store.create_run(RunRecord::new("a", "support"), lease.token).await.unwrap();
        let fence = Fence::new(&lease, CancellationToken::new());
        let journal = Journal::open(Arc::clone(&store), fence, "a", 0, 100, false, true).await.unwrap();
        assert_eq!(journal.state().by_key.capacity(), 0);
        journal.begin(&[("k1", StepKind::Tool, "echo")]).await.unwrap();
        let room = journal.state().by_key.capacity();
        assert!(room >= FIRST_STEPS, "room for a short run at once: {room}");
    }
}
