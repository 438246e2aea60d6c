//! `MemoryStore`: runs and journals in a process-local map.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hashbrown::{HashTable, hash_table::Entry};
use tokio::time::Instant;

use super::{DEFAULT_MAX_VALUE_BYTES, check_len};
use crate::clock::now_ms;
use crate::json::JsonText;
use crate::keymap::{CompactKey, KeyMap};
use crate::store::{
    FinishedStep, FinishedWithIntents, InstanceLock, Lease, NewStep, Registered, Registry, RunFilter, RunRecord,
    RunStatus, RunStore, RunSummary, StepKind, StepOutcome, StepRecord, StepStatus, StoreError, StoreFuture,
    owner_prefix,
};

/// A [`RunStore`] that keeps runs and journals in memory, behind a mutex per shard of runs.
///
/// Nothing survives the process, so it suits tests, examples and runs that need no durability.
/// Its semantics are exactly those of the durable stores (same errors, same ordering, same
/// value size limit). Clones share the same data.
///
/// Lease expiry uses Tokio's clock ([`tokio::time::Instant`]), so a test with a paused clock
/// (`#[tokio::test(start_paused = true)]`) can expire a lease with `tokio::time::advance`.
///
/// ```
/// use kuralle::stores::MemoryStore;
/// use kuralle::{NewStep, RunRecord, RunStatus, RunStore, StepKind, StepOutcome};
///
/// # futures::executor::block_on(async {
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "me", std::time::Duration::from_secs(30)).await?;
/// let run = RunRecord {
///     run_id: "run-1".into(),
///     agent_id: "support".into(),
///     status: RunStatus::Running,
///     epoch: 0,
///     version: 0,
///     state: serde_json::json!({}).into(),
///     created_at_ms: 1,
///     updated_at_ms: 1,
/// };
/// store.create_run(run, lease.token).await?;
/// let step = NewStep { key: "k1".into(), kind: StepKind::Tool, name: "echo".into(), epoch: 0, started_at_ms: 2 };
/// let ordinals = store.append_steps("run-1", lease.token, vec![step]).await?;
/// assert_eq!(ordinals, [0]);
/// store.finish_step("run-1", lease.token, 0, StepOutcome::Finished(kuralle::JsonText::from(serde_json::json!("hi"))), 3).await?;
///
/// // A clone sees the same journal.
/// let steps = store.clone().steps("run-1").await?;
/// assert_eq!(steps[0].result.as_ref().expect("finished"), &serde_json::json!("hi"));
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Shards>,
    max_value_bytes: usize,
    clock: Clock,
    /// Instance ids held by runtimes on this store (it cannot outlive the process, so an
    /// in-process registry is proof enough).
    instances: Registry,
}

#[derive(Debug, Default)]
struct State {
    runs: Runs,
    /// Hashes the journal keys of every run's `keys` table.
    hasher: foldhash::fast::RandomState,
    /// Kept when a run is deleted, so a reused id never reuses a token.
    leases: KeyMap<LeaseRow>,
    names: Names,
}

/// The shard's step names, one copy of each. A run's steps are named after its agent's few
/// tools and `model`, and a copy in every step was an allocation of every step of every run.
#[derive(Debug, Default)]
struct Names(std::collections::HashSet<Arc<str>, foldhash::fast::RandomState>);

impl Names {
    fn of(&mut self, name: String) -> Arc<str> {
        if let Some(known) = self.0.get(name.as_str()) {
            return Arc::clone(known);
        }
        let name: Arc<str> = name.into();
        self.0.insert(Arc::clone(&name));
        name
    }

    /// Forgets the names no step holds any more (after a run is deleted, or steps refused),
    /// so names made up per run do not pile up.
    fn forget_unused(&mut self) {
        self.0.retain(|name| Arc::strong_count(name) > 1);
    }
}

/// A shard's runs, found by their record's own id: a map keyed by a copy of the id held one
/// more allocation for every run.
#[derive(Debug, Default)]
struct Runs {
    table: HashTable<RunEntry>,
    hasher: foldhash::fast::RandomState,
}

impl Runs {
    fn get(&self, run_id: &str) -> Option<&RunEntry> {
        self.table.find(self.hasher.hash_one(run_id), |e| e.record.run_id == run_id)
    }

    fn get_mut(&mut self, run_id: &str) -> Option<&mut RunEntry> {
        self.table.find_mut(self.hasher.hash_one(run_id), |e| e.record.run_id == run_id)
    }

    fn remove(&mut self, run_id: &str) -> Option<RunEntry> {
        let found = self.table.find_entry(self.hasher.hash_one(run_id), |e| e.record.run_id == run_id);
        found.ok().map(|entry| entry.remove().0)
    }

    /// Adds `run` with an empty journal, unless the shard holds a run of its id already.
    fn create(&mut self, run: RunRecord) -> Result<(), StoreError> {
        let Self { table, hasher } = self;
        let hash = hasher.hash_one(run.run_id.as_str());
        match table.entry(hash, |e| e.record.run_id == run.run_id, |e| hasher.hash_one(e.record.run_id.as_str())) {
            Entry::Occupied(_) => Err(StoreError::RunExists(run.run_id)),
            Entry::Vacant(slot) => {
                // Empty: the journal gets its room with its first step (`append`), not here,
                // where every run started at once would touch it before its first model call.
                slot.insert(RunEntry { record: run, steps: Vec::new(), keys: HashTable::new() });
                Ok(())
            }
        }
    }

    fn values(&self) -> impl Iterator<Item = &RunEntry> {
        self.table.iter()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

/// Steps a new run has room for before its journal first grows (a table of seven keys fills
/// eight buckets; one more would take sixteen).
const FIRST_STEPS: usize = 7;

/// How many shards the runs are spread over (by their id's hash): enough that two worker
/// threads rarely want the same lock at once.
const SHARDS: usize = 16;

/// The store's runs and leases, sharded by run id. A run and its lease always share a shard,
/// so every write to a run takes one lock; only `list_runs` and taking back an instance's
/// leases take them all (in order, so they see one consistent moment, as a database read
/// does). One mutex for everything was contended at 10,000 runs in flight: each turn takes it
/// several times, and a waiter sleeps in the kernel.
#[derive(Debug)]
struct Shards {
    shards: [Shard; SHARDS],
    /// Picks a run's shard.
    pick: foldhash::fast::RandomState,
}

/// One shard, alone in its cache lines so that two shards' locks never share one.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<State>);

impl Default for Shards {
    fn default() -> Self {
        Self { shards: std::array::from_fn(|_| Shard::default()), pick: foldhash::fast::RandomState::default() }
    }
}

#[derive(Debug)]
struct LeaseRow {
    owner: String,
    token: u64,
    expires_at: Instant,
    released: bool,
}

/// Maps Tokio instants to wall-clock milliseconds, for [`Lease::expires_at_ms`].
#[derive(Debug, Clone, Copy)]
struct Clock {
    base: Instant,
    base_ms: i64,
}

impl Clock {
    fn new() -> Self {
        Self { base: Instant::now(), base_ms: now_ms() }
    }

    fn ms(self, at: Instant) -> i64 {
        let after = i64::try_from(at.saturating_duration_since(self.base).as_millis()).unwrap_or(i64::MAX);
        self.base_ms.saturating_add(after)
    }
}

#[derive(Debug)]
struct RunEntry {
    record: RunRecord,
    /// Dense: the step at `steps[i]` has ordinal `i`.
    steps: Vec<Step>,
    /// Effect key → ordinal: the table holds ordinals and hashes the key of the step each
    /// names, so a key is stored once (a map keyed by a copy held about a kilobyte more per
    /// run of seven steps).
    keys: HashTable<usize>,
}

/// A journal step as the store keeps it: its key compact ([`CompactKey`]), its result or its
/// error in one field (the status says which), and no ordinal (its place in the journal is
/// its ordinal). About a hundred bytes, where a [`StepRecord`] is 128 and holds two strings
/// on the heap besides.
#[derive(Debug)]
struct Step {
    key: CompactKey,
    name: Arc<str>,
    kind: StepKind,
    status: StepStatus,
    epoch: u64,
    value: Option<JsonText>,
    started_at_ms: i64,
    /// Read only once the step has ended (its status says so): an `Option` would make every
    /// step of every run 8 bytes longer.
    finished_at_ms: i64,
}

impl Step {
    fn running(step: NewStep, names: &mut Names) -> Self {
        Self {
            key: CompactKey::from_owned(step.key),
            name: names.of(step.name),
            kind: step.kind,
            status: StepStatus::Running,
            epoch: step.epoch,
            value: None,
            started_at_ms: step.started_at_ms,
            finished_at_ms: 0,
        }
    }

    /// The step as the store's callers see it.
    fn record(&self, ordinal: u64) -> StepRecord {
        let (result, error) = match self.status {
            StepStatus::Running => (None, None),
            StepStatus::Finished => (self.value.clone(), None),
            StepStatus::Failed => (None, self.value.clone()),
        };
        StepRecord {
            ordinal,
            key: self.key.to_text(),
            kind: self.kind,
            name: self.name.to_string(),
            epoch: self.epoch,
            status: self.status,
            result,
            error,
            started_at_ms: self.started_at_ms,
            finished_at_ms: (self.status != StepStatus::Running).then_some(self.finished_at_ms),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            clock: Clock::new(),
            instances: Registry::default(),
        }
    }
}

impl MemoryStore {
    /// An empty store.
    ///
    /// ```
    /// let store = kuralle::stores::MemoryStore::new();
    /// # let _ = store;
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the largest accepted JSON value, in bytes of compact JSON text (default
    /// [`DEFAULT_MAX_VALUE_BYTES`](super::DEFAULT_MAX_VALUE_BYTES)); larger values are
    /// rejected with [`StoreError::LimitExceeded`].
    ///
    /// ```
    /// let store = kuralle::stores::MemoryStore::new().with_max_value_bytes(1024);
    /// # let _ = store;
    /// ```
    pub fn with_max_value_bytes(mut self, max: usize) -> Self {
        self.max_value_bytes = max;
        self
    }

    /// The shard of `run_id`, locked.
    fn lock(&self, run_id: &str) -> MutexGuard<'_, State> {
        let i = (self.inner.pick.hash_one(run_id) % SHARDS as u64) as usize;
        lock(&self.inner.shards[i])
    }

    /// Every shard, locked in order (no other lock is taken while holding one, so this
    /// cannot deadlock).
    fn lock_all(&self) -> Vec<MutexGuard<'_, State>> {
        self.inner.shards.iter().map(lock).collect()
    }

    fn create_run_now(&self, run: RunRecord, fence: u64) -> Result<(), StoreError> {
        // The size first, as the durable stores check it before their write.
        check_len("run state", run.state.len(), self.max_value_bytes)?;
        let mut state = self.lock(&run.run_id);
        state.check_fence(&run.run_id, fence)?;
        state.runs.create(run)
    }

    fn put_run_now(&self, run: RunRecord, fence: u64) -> Result<u64, StoreError> {
        let mut state = self.lock(&run.run_id);
        let version = self.check_put(&state, &run, fence)?;
        state.write_run(run, version);
        Ok(version)
    }

    /// [`RunStore::put_run_and_release`] under one lock.
    fn put_and_release_now(&self, run: RunRecord, fence: u64) -> Result<(u64, bool), StoreError> {
        let mut state = self.lock(&run.run_id);
        let version = self.check_put(&state, &run, fence)?;
        state.release(&run.run_id);
        state.write_run(run, version);
        Ok((version, true))
    }

    /// [`RunStore::put_run_and_release_after`] under one lock, in SQLite's order: the sizes
    /// first, then the run (a refused run journals nothing), then the answer.
    fn close_now(&self, last: FinishedStep, run: RunRecord, fence: u64) -> Result<(u64, bool), StoreError> {
        let FinishedStep { step, outcome, finished_at_ms } = last;
        self.check_outcome_size(&outcome)?;
        let mut state = self.lock(&run.run_id);
        let version = self.check_put(&state, &run, fence)?;
        state.append_finished(&run.run_id, fence, vec![step], outcome, finished_at_ms)?;
        state.release(&run.run_id);
        state.write_run(run, version);
        Ok((version, true))
    }

    /// The version `run` would be written at under lease `fence`, or why it would be refused;
    /// changes nothing.
    fn check_put(&self, state: &State, run: &RunRecord, fence: u64) -> Result<u64, StoreError> {
        // The size first, as the durable stores check it before their write.
        check_len("run state", run.state.len(), self.max_value_bytes)?;
        state.check_fence(&run.run_id, fence)?;
        let Some(entry) = state.runs.get(&run.run_id) else {
            return Err(StoreError::RunNotFound(run.run_id.clone()));
        };
        if entry.record.version != run.version {
            return Err(StoreError::VersionConflict {
                run_id: run.run_id.clone(),
                expected: run.version,
                actual: entry.record.version,
            });
        }
        Ok(run.version + 1)
    }

    fn list_runs_now(&self, filter: &RunFilter) -> Vec<RunSummary> {
        let shards = self.lock_all();
        let mut runs: Vec<RunSummary> = shards
            .iter()
            .flat_map(|state| state.runs.values())
            .filter(|entry| filter.status.is_none_or(|status| entry.record.status == status))
            .map(|entry| RunSummary {
                run_id: entry.record.run_id.clone(),
                agent_id: entry.record.agent_id.clone(),
                status: entry.record.status,
                updated_at_ms: entry.record.updated_at_ms,
            })
            .collect();
        drop(shards);
        runs.sort_by(|a, b| b.updated_at_ms.cmp(&a.updated_at_ms).then_with(|| a.run_id.cmp(&b.run_id)));
        if let Some(limit) = filter.limit {
            runs.truncate(limit);
        }
        runs
    }

    fn append_steps_now(&self, run_id: &str, fence: u64, steps: Vec<NewStep>) -> Result<Vec<u64>, StoreError> {
        self.lock(run_id).append(run_id, fence, steps)
    }

    /// [`RunStore::append_finished_with_intents`] under one lock: nothing is written unless
    /// all of it is.
    fn append_finished_now(
        &self,
        run_id: &str,
        fence: u64,
        write: FinishedWithIntents,
    ) -> Result<Vec<u64>, StoreError> {
        let FinishedWithIntents { finished, outcome, finished_at_ms, intents } = write;
        self.check_outcome_size(&outcome)?;
        let mut state = self.lock(run_id);
        state.check_fence(run_id, fence)?;
        let mut steps = Vec::with_capacity(intents.len() + 1);
        steps.push(finished);
        steps.extend(intents);
        state.append_finished(run_id, fence, steps, outcome, finished_at_ms)
    }

    fn check_outcome_size(&self, outcome: &StepOutcome) -> Result<(), StoreError> {
        match outcome {
            StepOutcome::Finished(text) => check_len("step result", text.len(), self.max_value_bytes),
            StepOutcome::Failed(text) => check_len("step error", text.len(), self.max_value_bytes),
        }
    }

    fn finish_step_now(
        &self,
        run_id: &str,
        fence: u64,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> Result<(), StoreError> {
        self.check_outcome_size(&outcome)?;
        let mut state = self.lock(run_id);
        state.check_fence(run_id, fence)?;
        state.finish(run_id, ordinal, outcome, finished_at_ms)
    }

    fn acquire_now(&self, run_id: &str, owner: &str, ttl: Duration) -> Result<Lease, StoreError> {
        self.acquire_in(&mut self.lock(run_id), run_id, owner, ttl)
    }

    /// [`RunStore::acquire_lease_and_create_run`] under one lock. A run too large to create is
    /// refused before the lease is taken, as on SQLite and PostgreSQL.
    fn acquire_and_create_now(
        &self,
        new: RunRecord,
        owner: &str,
        ttl: Duration,
    ) -> Result<(Lease, Option<RunRecord>), StoreError> {
        check_len("run state", new.state.len(), self.max_value_bytes)?;
        let mut state = self.lock(&new.run_id);
        let lease = self.acquire_in(&mut state, &new.run_id, owner, ttl)?;
        if let Some(entry) = state.runs.get(&new.run_id) {
            return Ok((lease, Some(entry.record.clone())));
        }
        // Checked absent under this lock: the create cannot fail.
        state.runs.create(new)?;
        Ok((lease, None))
    }

    /// Takes `run_id`'s lease in its locked shard `state`.
    fn acquire_in(&self, state: &mut State, run_id: &str, owner: &str, ttl: Duration) -> Result<Lease, StoreError> {
        let now = Instant::now();
        let expires_at = now + ttl;
        let token = match state.leases.get(run_id) {
            Some(row) if !row.released && row.expires_at > now => {
                return Err(StoreError::LeaseHeld {
                    run_id: run_id.to_owned(),
                    owner: row.owner.clone(),
                    expires_at_ms: self.clock.ms(row.expires_at),
                });
            }
            Some(row) => row.token + 1,
            None => 1,
        };
        state
            .leases
            .insert(run_id.to_owned(), LeaseRow { owner: owner.to_owned(), token, expires_at, released: false });
        Ok(Lease {
            run_id: run_id.to_owned(),
            owner: owner.to_owned(),
            token,
            expires_at_ms: self.clock.ms(expires_at),
        })
    }

    fn renew_now(&self, lease: &Lease, ttl: Duration) -> Result<Lease, StoreError> {
        let mut state = self.lock(&lease.run_id);
        state.check_fence(&lease.run_id, lease.token)?;
        let expires_at = Instant::now() + ttl;
        if let Some(row) = state.leases.get_mut(&lease.run_id) {
            row.expires_at = expires_at;
        }
        Ok(Lease { expires_at_ms: self.clock.ms(expires_at), ..lease.clone() })
    }

    fn release_now(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut state = self.lock(&lease.run_id);
        state.check_fence(&lease.run_id, lease.token)?;
        state.release(&lease.run_id);
        Ok(())
    }

    /// [`RunStore::cancel_run`] under one lock.
    fn cancel_now(&self, run_id: &str) -> Option<RunStatus> {
        let mut state = self.lock(run_id);
        let entry = state.runs.get_mut(run_id)?;
        let before = entry.record.status;
        if !matches!(before, RunStatus::Running | RunStatus::Paused) {
            return Some(before);
        }
        entry.record.status = RunStatus::Cancelled;
        entry.record.version += 1;
        entry.record.updated_at_ms = now_ms();
        if let Some(row) = state.leases.get_mut(run_id) {
            row.released = true;
        }
        Some(before)
    }

    /// Ends every unreleased lease whose owner starts with `prefix`; returns their run ids.
    fn take_back_now(&self, prefix: &str) -> Vec<String> {
        let mut shards = self.lock_all();
        let mut taken: Vec<String> = shards
            .iter_mut()
            .flat_map(|state| state.leases.iter_mut())
            .filter(|(_, row)| !row.released && row.owner.starts_with(prefix))
            .map(|(run_id, row)| {
                row.released = true;
                run_id.clone()
            })
            .collect();
        taken.sort();
        taken
    }

    fn get_run_now(&self, run_id: &str) -> Option<RunRecord> {
        self.lock(run_id).runs.get(run_id).map(|entry| entry.record.clone())
    }

    fn current_now(&self, run_id: &str) -> Option<Lease> {
        let state = self.lock(run_id);
        let row = state.leases.get(run_id).filter(|row| !row.released && row.expires_at > Instant::now())?;
        Some(Lease {
            run_id: run_id.to_owned(),
            owner: row.owner.clone(),
            token: row.token,
            expires_at_ms: self.clock.ms(row.expires_at),
        })
    }
}

fn lock(shard: &Shard) -> MutexGuard<'_, State> {
    // Every mutation below is complete before it can panic, so a poisoned map is consistent.
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Appends `steps` as `Running`, all or none; returns their ordinals.
    fn append(&mut self, run_id: &str, fence: u64, steps: Vec<NewStep>) -> Result<Vec<u64>, StoreError> {
        self.check_fence(run_id, fence)?;
        let Some(entry) = self.runs.get_mut(run_id) else {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        };
        // All or nothing: the steps go on the journal's end, each claims its key (one hash
        // each), and on a duplicate the claims are given back and the steps taken off again.
        let first = entry.steps.len();
        if first == 0 {
            // Room for a short run's journal at once (seven steps: three tool turns and an
            // answer); grown from empty, both were allocated, copied and freed twice.
            entry.steps.reserve_exact(FIRST_STEPS.max(steps.len()));
            entry.keys.reserve(FIRST_STEPS.max(steps.len()), |&p| self.hasher.hash_one(&entry.steps[p].key));
        }
        entry.steps.extend(steps.into_iter().map(|step| Step::running(step, &mut self.names)));
        let (table, stored, hasher) = (&mut entry.keys, &entry.steps, &self.hasher);
        for o in first..stored.len() {
            let key = &stored[o].key;
            let hash = hasher.hash_one(key);
            if table.find(hash, |&p| stored[p].key == *key).is_none() {
                table.insert_unique(hash, o, |&p| hasher.hash_one(&stored[p].key));
                continue;
            }
            for (p, earlier) in (first..o).zip(&stored[first..o]) {
                if let Ok(claimed) = table.find_entry(hasher.hash_one(&earlier.key), |&q| q == p) {
                    claimed.remove();
                }
            }
            let key = key.to_text();
            entry.steps.truncate(first);
            self.names.forget_unused();
            return Err(StoreError::DuplicateKey { run_id: run_id.to_owned(), key });
        }
        Ok((first as u64..entry.steps.len() as u64).collect())
    }

    /// Records the outcome of the `Running` step at `ordinal`; the caller has checked the fence
    /// and the size under the same lock.
    fn finish(
        &mut self,
        run_id: &str,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> Result<(), StoreError> {
        let Some(entry) = self.runs.get_mut(run_id) else {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        };
        let step = usize::try_from(ordinal).ok().and_then(|i| entry.steps.get_mut(i));
        let Some(step) = step.filter(|step| step.status == StepStatus::Running) else {
            return Err(StoreError::StepNotRunning { run_id: run_id.to_owned(), ordinal });
        };
        let (status, value) = match outcome {
            StepOutcome::Finished(value) => (StepStatus::Finished, value),
            StepOutcome::Failed(value) => (StepStatus::Failed, value),
        };
        step.status = status;
        step.value = Some(value);
        step.finished_at_ms = finished_at_ms;
        Ok(())
    }

    /// Accepts a write iff the run's lease is unreleased and its token is `fence`; expiry
    /// alone does not reject (only a newer grant or a release does).
    fn check_fence(&self, run_id: &str, fence: u64) -> Result<(), StoreError> {
        match self.leases.get(run_id) {
            Some(row) if row.token == fence && !row.released => Ok(()),
            _ => Err(StoreError::Fenced { run_id: run_id.to_owned(), token: fence }),
        }
    }

    /// Appends `steps`, the first finished with `outcome`, all or none; returns their ordinals.
    fn append_finished(
        &mut self,
        run_id: &str,
        fence: u64,
        steps: Vec<NewStep>,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> Result<Vec<u64>, StoreError> {
        let ordinals = self.append(run_id, fence, steps)?;
        // The first step was just appended `Running` under a checked fence: finishing it
        // cannot fail.
        self.finish(run_id, ordinals[0], outcome, finished_at_ms)?;
        Ok(ordinals)
    }

    /// Gives `run_id`'s lease up, whoever holds it (the caller checked the fence).
    fn release(&mut self, run_id: &str) {
        if let Some(row) = self.leases.get_mut(run_id) {
            row.released = true;
        }
    }

    /// Writes `run` over its stored row at `version` (the caller checked it, [`MemoryStore::check_put`]).
    fn write_run(&mut self, run: RunRecord, version: u64) {
        if let Some(entry) = self.runs.get_mut(&run.run_id) {
            let stored = &mut entry.record;
            stored.agent_id = run.agent_id;
            stored.status = run.status;
            stored.epoch = run.epoch;
            stored.version = version;
            stored.state = run.state;
            stored.updated_at_ms = run.updated_at_ms;
        }
    }
}

// Each future does its work when first polled, like the durable stores' futures.
impl RunStore for MemoryStore {
    fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()> {
        Box::pin(async move { self.create_run_now(run, fence) })
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        Box::pin(async move { Ok(self.get_run_now(run_id)) })
    }

    fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64> {
        Box::pin(async move { self.put_run_now(run, fence) })
    }

    fn put_run_and_release(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, (u64, bool)> {
        Box::pin(async move { self.put_and_release_now(run, fence) })
    }

    /// One lock for the answer, the run and the lease: nothing is written unless all of it is.
    fn put_run_and_release_after(
        &self,
        last: FinishedStep,
        run: RunRecord,
        fence: u64,
    ) -> StoreFuture<'_, (u64, bool)> {
        Box::pin(async move { self.close_now(last, run, fence) })
    }

    fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
        Box::pin(async move { Ok(self.list_runs_now(&filter)) })
    }

    fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut state = self.lock(run_id);
            let deleted = state.runs.remove(run_id).is_some();
            if deleted {
                state.names.forget_unused();
            }
            Ok(deleted)
        })
    }

    fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move { self.append_steps_now(run_id, fence, steps) })
    }

    fn append_finished_with_intents<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        write: FinishedWithIntents,
    ) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move { self.append_finished_now(run_id, fence, write) })
    }

    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: StepOutcome,
        finished_at_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.finish_step_now(run_id, fence, ordinal, outcome, finished_at_ms) })
    }

    fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunStatus>> {
        Box::pin(async move { Ok(self.cancel_now(run_id)) })
    }

    fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
        Box::pin(async move {
            let state = self.lock(run_id);
            let steps = state.runs.get(run_id).map(|entry| &entry.steps[..]).unwrap_or_default();
            Ok((0..).zip(steps).map(|(ordinal, step)| step.record(ordinal)).collect())
        })
    }

    fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease> {
        Box::pin(async move { self.acquire_now(run_id, owner, ttl) })
    }

    /// One future for both: the memory store cannot fail the read.
    fn acquire_lease_and_get_run<'a>(
        &'a self,
        run_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        Box::pin(async move {
            let lease = self.acquire_now(run_id, owner, ttl)?;
            Ok((lease, self.get_run_now(run_id)))
        })
    }

    fn acquire_lease_and_create_run<'a>(
        &'a self,
        new: RunRecord,
        owner: &'a str,
        ttl: Duration,
    ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
        Box::pin(async move { self.acquire_and_create_now(new, owner, ttl) })
    }

    fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease> {
        Box::pin(async move { self.renew_now(lease, ttl) })
    }

    fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.release_now(lease) })
    }

    fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>> {
        Box::pin(async move { Ok(self.current_now(run_id)) })
    }

    fn lock_instance<'a>(&'a self, instance_id: &'a str) -> StoreFuture<'a, Option<Box<dyn InstanceLock>>> {
        Box::pin(async move {
            let registered = self.instances.claim(instance_id).ok_or_else(|| StoreError::InstanceInUse {
                instance_id: instance_id.to_owned(),
                holder: "another runtime of this process holds it on this in-memory store".to_owned(),
            })?;
            let lock: Box<dyn InstanceLock> = Box::new(MemoryInstance {
                store: self.clone(),
                prefix: owner_prefix(instance_id),
                _registered: registered,
                id: instance_id.to_owned(),
            });
            Ok(Some(lock))
        })
    }
}

/// A [`MemoryStore`]'s proof of an instance id: its entry in the store's registry.
#[derive(Debug)]
struct MemoryInstance {
    store: MemoryStore,
    id: String,
    prefix: String,
    /// Unregisters the id when dropped.
    _registered: Registered,
}

impl InstanceLock for MemoryInstance {
    fn instance_id(&self) -> &str {
        &self.id
    }

    fn take_back(&self) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move { Ok(self.store.take_back_now(&self.prefix)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: &str, updated_at_ms: i64) -> RunRecord {
        RunRecord {
            run_id: run_id.into(),
            agent_id: "support".into(),
            status: RunStatus::Running,
            epoch: 0,
            version: 0,
            state: JsonText::null(),
            created_at_ms: 1,
            updated_at_ms,
        }
    }

    #[test]
    fn a_name_is_kept_once_and_forgotten_when_no_step_holds_it() {
        let mut names = Names::default();
        let (first, again) = (names.of("echo".into()), names.of("echo".into()));
        assert!(Arc::ptr_eq(&first, &again));
        drop(names.of("made-up".into()));
        names.forget_unused();
        assert!(names.0.contains("echo") && !names.0.contains("made-up"));
    }

    /// Steps share their names, read back as written; refused steps and a deleted run leave no
    /// names behind.
    #[tokio::test]
    async fn steps_share_their_names_and_refused_or_deleted_ones_leave_none_behind() {
        let store = MemoryStore::new();
        let lease = store.acquire_lease("a", "me/turn", Duration::from_secs(30)).await.unwrap();
        store.create_run(record("a", 1), lease.token).await.unwrap();
        let step = |key: &str, name: &str| NewStep {
            key: key.into(),
            kind: StepKind::Tool,
            name: name.into(),
            epoch: 0,
            started_at_ms: 1,
        };
        let steps = vec![step("k1", "echo"), step("k2", "echo"), step("k3", "only-a")];
        store.append_steps("a", lease.token, steps).await.unwrap();
        let names: Vec<String> = store.steps("a").await.unwrap().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["echo", "echo", "only-a"]);
        {
            let state = store.lock("a");
            let stored = &state.runs.get("a").unwrap().steps;
            assert!(Arc::ptr_eq(&stored[0].name, &stored[1].name), "one copy of a name");
        }
        let refused = vec![step("k4", "refused"), step("k1", "echo")];
        assert!(matches!(store.append_steps("a", lease.token, refused).await, Err(StoreError::DuplicateKey { .. })));
        assert!(!store.lock("a").names.0.contains("refused"), "refused steps leave no name");
        assert!(store.delete_run("a").await.unwrap());
        assert!(store.lock("a").names.0.is_empty());
    }

    /// The merged writes are each one lock: a close refused for its run (a stale version, a
    /// lost fence) or for its answer (a journaled key) changes nothing, and one that lands
    /// journals the answer, writes the run and gives the lease up together; a run too large
    /// to create leaves no run and no lease held.
    #[tokio::test]
    async fn the_merged_writes_land_whole_or_not_at_all() {
        let store = MemoryStore::new().with_max_value_bytes(64);
        let ttl = Duration::from_secs(30);
        let (lease, there) = store.acquire_lease_and_create_run(record("a", 1), "me/turn", ttl).await.unwrap();
        assert!(there.is_none(), "created");
        let step = |key: &str| NewStep {
            key: key.into(),
            kind: StepKind::Model,
            name: "m".into(),
            epoch: 0,
            started_at_ms: 1,
        };
        store.append_steps("a", lease.token, vec![step("k1")]).await.unwrap();
        let last = |key: &str| FinishedStep {
            step: step(key),
            outcome: StepOutcome::Finished(JsonText::null()),
            finished_at_ms: 2,
        };
        let stale = RunRecord { version: 5, ..record("a", 2) };
        let oversized = FinishedStep {
            outcome: StepOutcome::Finished(JsonText::from(serde_json::json!("y".repeat(100)))),
            ..last("k2")
        };
        assert!(
            matches!(
                store.put_run_and_release_after(oversized, stale.clone(), lease.token).await,
                Err(StoreError::LimitExceeded(..))
            ),
            "sizes first, as on SQLite"
        );
        assert!(matches!(
            store.put_run_and_release_after(last("k2"), stale, lease.token).await,
            Err(StoreError::VersionConflict { .. })
        ));
        assert!(matches!(
            store.put_run_and_release_after(last("k2"), record("a", 2), lease.token + 1).await,
            Err(StoreError::Fenced { .. })
        ));
        assert!(matches!(
            store.put_run_and_release_after(last("k1"), record("a", 2), lease.token).await,
            Err(StoreError::DuplicateKey { .. })
        ));
        assert_eq!(store.steps("a").await.unwrap().len(), 1, "refused: nothing journaled");
        assert_eq!(store.get_run("a").await.unwrap().unwrap().version, 0, "refused: the run as it was");
        assert_eq!(store.current_lease("a").await.unwrap().map(|l| l.token), Some(lease.token), "refused: held");

        let done = RunRecord { status: RunStatus::Finished, ..record("a", 2) };
        assert_eq!(store.put_run_and_release_after(last("k2"), done, lease.token).await.unwrap(), (1, true));
        let steps = store.steps("a").await.unwrap();
        assert_eq!((steps.len(), steps[1].key.as_str(), steps[1].status), (2, "k2", StepStatus::Finished));
        assert_eq!(store.get_run("a").await.unwrap().unwrap().status, RunStatus::Finished);
        assert_eq!(store.current_lease("a").await.unwrap(), None, "given up");

        let again = store.acquire_lease("a", "me/turn", ttl).await.unwrap();
        let read = store.get_run("a").await.unwrap().unwrap();
        assert_eq!(store.put_run_and_release(read, again.token).await.unwrap(), (2, true));
        assert_eq!(store.current_lease("a").await.unwrap(), None, "given up with the run");

        let large = RunRecord { state: JsonText::from(serde_json::json!("x".repeat(100))), ..record("b", 1) };
        assert!(matches!(
            store.acquire_lease_and_create_run(large, "me/turn", ttl).await,
            Err(StoreError::LimitExceeded(..))
        ));
        assert_eq!(store.get_run("b").await.unwrap(), None);
        assert_eq!(store.current_lease("b").await.unwrap(), None);
        let next = store.acquire_lease("b", "me/turn", ttl).await.unwrap();
        assert_eq!(next.token, 1, "refused before the lease was taken, as on SQLite and PostgreSQL");
    }

    /// A new run's journal takes its room with its first steps, not at its creation: 10,000
    /// runs started at once touched 816 bytes each of it before their first model call.
    #[tokio::test]
    async fn a_runs_journal_takes_its_room_with_its_first_step() {
        let store = MemoryStore::new();
        let lease = store.acquire_lease("a", "me/turn", Duration::from_secs(30)).await.unwrap();
        store.create_run(record("a", 1), lease.token).await.unwrap();
        let room = |store: &MemoryStore| {
            let state = store.lock("a");
            let entry = state.runs.get("a").unwrap();
            (entry.steps.capacity(), entry.keys.capacity())
        };
        assert_eq!(room(&store), (0, 0));
        let step = NewStep { key: "k1".into(), kind: StepKind::Tool, name: "echo".into(), epoch: 0, started_at_ms: 1 };
        store.append_steps("a", lease.token, vec![step]).await.unwrap();
        let (steps, keys) = room(&store);
        assert!(steps >= FIRST_STEPS && keys >= FIRST_STEPS, "room for a short run at once: {steps}, {keys}");
    }

    /// Runs land in every shard; listing and taking back see all of them, in one order.
    #[tokio::test]
    async fn listing_and_taking_back_span_every_shard() {
        let store = MemoryStore::new();
        // Enough that a shard left empty by the random hash is out of the question (16 × (15/16)^512).
        let runs = 32 * SHARDS;
        for i in 0..runs {
            let id = format!("run-{i}");
            let owner = if i % 2 == 0 { "me/turn" } else { "other/turn" };
            let lease = store.acquire_lease(&id, owner, Duration::from_secs(30)).await.unwrap();
            store.create_run(record(&id, i as i64), lease.token).await.unwrap();
        }
        let used = store.inner.shards.iter().filter(|s| !lock(s).runs.is_empty()).count();
        assert_eq!(used, SHARDS, "{runs} runs spread over every shard");

        let listed = store.list_runs(RunFilter::default()).await.unwrap();
        let expected: Vec<String> = (0..runs).rev().map(|i| format!("run-{i}")).collect();
        assert_eq!(listed.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(), expected, "newest first");
        let top = store.list_runs(RunFilter { status: None, limit: Some(3) }).await.unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].run_id, format!("run-{}", runs - 1));

        let mut taken = store.take_back_now("me/");
        let mut mine: Vec<String> = (0..runs).step_by(2).map(|i| format!("run-{i}")).collect();
        mine.sort();
        taken.sort();
        assert_eq!(taken, mine, "exactly the prefix's leases, from every shard");
        assert!(store.take_back_now("me/").is_empty());
    }
}
