//! The `RunStore` conformance suite: the same cases run against every store.
//!
//! A store's test file instantiates every case as its own test with
//! [`store_conformance!`](crate::store_conformance), giving it a function that returns a fresh
//! store and a guard kept alive for the test (for example the store's temp dir):
//!
//! ```ignore
//! mod memory {
//!     kuralle_tests::store_conformance!(|| (kuralle::stores::MemoryStore::new(), ()));
//! }
//! ```
//!
//! [`run_all`] runs every case in sequence instead. The cases use only the `RunStore` trait, so
//! new stores (PostgreSQL) join by adding one line.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kuralle::stores::DEFAULT_MAX_VALUE_BYTES;
use kuralle::{
    FinishedStep, FinishedWithIntents, Lease, NewStep, RunFilter, RunRecord, RunStatus, RunStore, RunSummary, StepKind,
    StepOutcome, StepRecord, StepStatus, StoreError,
};
use serde_json::{Value, json};

/// A run record with the given id, status and update time; version 0.
pub fn run(run_id: &str, status: RunStatus, updated_at_ms: i64) -> RunRecord {
    RunRecord {
        run_id: run_id.to_owned(),
        agent_id: "support".to_owned(),
        status,
        epoch: 0,
        version: 0,
        state: json!({"transcript": [], "turn": 0}).into(),
        created_at_ms: updated_at_ms,
        updated_at_ms,
    }
}

/// A tool intent with the given key.
pub fn step(key: &str) -> NewStep {
    NewStep { key: key.to_owned(), kind: StepKind::Tool, name: "echo".to_owned(), epoch: 0, started_at_ms: 1_000 }
}

/// A store whose writes take (once per run) and carry the run's lease, so the cases about runs
/// and journals read as before leases existed. The lease cases use the store itself.
pub struct Owned<S> {
    store: S,
    tokens: Mutex<HashMap<String, u64>>,
}

impl<S: RunStore> Owned<S> {
    /// Wraps `store`.
    pub fn new(store: S) -> Self {
        Self { store, tokens: Mutex::default() }
    }

    /// The token of this test's lease on `run_id`, acquired on first use.
    pub async fn fence(&self, run_id: &str) -> u64 {
        if let Some(token) = self.tokens.lock().unwrap().get(run_id) {
            return *token;
        }
        let lease = self.store.acquire_lease(run_id, "conformance", Duration::from_secs(3600)).await.unwrap();
        *self.tokens.lock().unwrap().entry(run_id.to_owned()).or_insert(lease.token)
    }

    /// `create_run` under the run's lease.
    pub async fn create_run(&self, run: RunRecord) -> Result<(), StoreError> {
        let fence = self.fence(&run.run_id).await;
        self.store.create_run(run, fence).await
    }

    /// `put_run` under the run's lease.
    pub async fn put_run(&self, run: RunRecord) -> Result<u64, StoreError> {
        let fence = self.fence(&run.run_id).await;
        self.store.put_run(run, fence).await
    }

    /// `append_steps` under the run's lease.
    pub async fn append_steps(&self, run_id: &str, steps: Vec<NewStep>) -> Result<Vec<u64>, StoreError> {
        let fence = self.fence(run_id).await;
        self.store.append_steps(run_id, fence, steps).await
    }

    /// `finish_step` under the run's lease.
    pub async fn finish_step(
        &self,
        run_id: &str,
        ordinal: u64,
        outcome: StepOutcome,
        at: i64,
    ) -> Result<(), StoreError> {
        let fence = self.fence(run_id).await;
        self.store.finish_step(run_id, fence, ordinal, outcome, at).await
    }

    /// `append_finished_with_intents` under the run's lease.
    pub async fn append_finished_with_intents(
        &self,
        run_id: &str,
        finished: NewStep,
        outcome: StepOutcome,
        at: i64,
        intents: Vec<NewStep>,
    ) -> Result<Vec<u64>, StoreError> {
        let fence = self.fence(run_id).await;
        let write = FinishedWithIntents { finished, outcome, finished_at_ms: at, intents };
        self.store.append_finished_with_intents(run_id, fence, write).await
    }

    /// `get_run`.
    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.store.get_run(run_id).await
    }

    /// `list_runs`.
    pub async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.store.list_runs(filter).await
    }

    /// `delete_run`.
    pub async fn delete_run(&self, run_id: &str) -> Result<bool, StoreError> {
        self.store.delete_run(run_id).await
    }

    /// `steps`.
    pub async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.store.steps(run_id).await
    }
}

/// Calls `callback!(args; case, case, …)` with every conformance case's name: the one
/// list of cases, shared by [`run_all`] and [`store_conformance!`](crate::store_conformance).
#[macro_export]
macro_rules! with_conformance_cases {
    (($($callback:tt)+) $($args:tt)*) => {
        $($callback)+!($($args)*;
            run_create_get_put,
            put_run_and_release_writes_then_gives_the_lease_up,
            put_run_and_release_after_journals_the_last_step_with_the_run,
            run_list_filter_order_limit,
            run_delete,
            journal_round_trip,
            journal_duplicate_key_rejected,
            journal_finish_non_running_rejected,
            journal_finished_with_intents,
            run_not_found,
            value_size_limit,
            reservation_under_64_concurrent_reservers,
            version_check_with_16_concurrent_writers,
            lease_16_concurrent_acquirers,
            lease_takeover_fences_the_old_token,
            lease_release_gives_a_higher_token,
            lease_with_the_run_read_under_it,
            lease_with_the_run_created_under_it,
            leases_renewed_in_one_batch_keep_their_own_outcomes,
            a_lease_renews_and_releases_as_granted,
            queue_claims_each_runnable_run_once,
            instance_lock_takes_back_only_its_own_leases,
            cancel_closes_running_and_paused_runs_and_fences_their_owner,
        );
    };
}

/// Runs every case against stores made by `make` (one fresh store per case).
pub async fn run_all<S: RunStore, G>(make: impl Fn() -> (S, G)) {
    macro_rules! each {
        ($make:ident; $($case:ident),* $(,)?) => {$(
            let (store, guard) = $make();
            $case(store).await;
            drop(guard);
        )*};
    }
    crate::with_conformance_cases!((each) make);
}

/// Instantiates every conformance case as a `#[tokio::test]` in the calling module.
///
/// `$make` is an expression callable as `() -> (impl RunStore, Guard)`; the guard (a temp dir,
/// or `()`) is dropped after the case.
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        $crate::with_conformance_cases!(($crate::store_conformance) @cases ($make));
    };
    (@cases ($make:expr); $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            // `$make` returns `(store, guard)`, or `Option` of it for stores that may be absent.
            let Some((store, guard)) = $crate::conformance::Made::made(($make)()) else { return };
            $crate::conformance::$case(store).await;
            drop(guard);
        }
    )*};
}

/// What a store factory returns: `(store, guard)`, or `None` when the store is not available
/// here (the factory prints why, and the case passes without running).
pub trait Made<S, G> {
    /// The store and its guard, if available.
    fn made(self) -> Option<(S, G)>;
}

impl<S: RunStore, G> Made<S, G> for (S, G) {
    fn made(self) -> Option<(S, G)> {
        Some(self)
    }
}

impl<S: RunStore, G> Made<S, G> for Option<(S, G)> {
    fn made(self) -> Option<(S, G)> {
        self
    }
}

/// create / get / put: a created run reads back as given; creating it again is `RunExists`;
/// `put_run` is a compare-and-swap that bumps the version and keeps `created_at_ms`.
pub async fn run_create_get_put<S: RunStore>(store: S) {
    let store = Owned::new(store);
    let original = run("run-1", RunStatus::Running, 10);
    store.create_run(original.clone()).await.unwrap();
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(original.clone()));
    assert_eq!(store.get_run("run-2").await.unwrap(), None);

    let again = store.create_run(run("run-1", RunStatus::Paused, 11)).await.unwrap_err();
    assert_eq!(again, StoreError::RunExists("run-1".into()));
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(original.clone()), "a refused create changes nothing");

    let mut next = original.clone();
    next.status = RunStatus::Paused;
    next.epoch = 3;
    next.agent_id = "billing".into();
    next.state = json!({"turn": 1, "note": "naïve café ☕ — 日本語 🚀", "nested": {"a": [1, 2.5, null, true]}}).into();
    next.updated_at_ms = 20;
    next.created_at_ms = 999; // ignored: the stored creation time stays
    assert_eq!(store.put_run(next.clone()).await.unwrap(), 1);
    let stored = store.get_run("run-1").await.unwrap().unwrap();
    assert_eq!(stored, RunRecord { version: 1, created_at_ms: 10, ..next.clone() });

    // A stale writer loses and changes nothing.
    let mut stale = original.clone();
    stale.state = json!("stale").into();
    let lost = store.put_run(stale).await.unwrap_err();
    assert_eq!(lost, StoreError::VersionConflict { run_id: "run-1".into(), expected: 0, actual: 1 });
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(stored.clone()));

    // The winner of the next round continues from the stored version.
    assert_eq!(store.put_run(stored.clone()).await.unwrap(), 2);
    assert_eq!(store.get_run("run-1").await.unwrap().unwrap().version, 2);

    // A run may be created at any version.
    let mut late = run("run-late", RunStatus::Finished, 5);
    late.version = 7;
    late.epoch = 2;
    store.create_run(late.clone()).await.unwrap();
    assert_eq!(store.get_run("run-late").await.unwrap(), Some(late.clone()));
    assert_eq!(store.put_run(late).await.unwrap(), 8);
}

/// `put_run_and_release`: writes the run as `put_run` does; when it says the lease was given
/// up, the lease is released (no current lease, the token fenced, the next holder a higher
/// token), else it is still held. A refused write (a version conflict, a stale token) writes
/// nothing and keeps the lease.
pub async fn put_run_and_release_writes_then_gives_the_lease_up<S: RunStore>(store: S) {
    let lease = store.acquire_lease("run-1", "a", HOUR).await.unwrap();
    let original = run("run-1", RunStatus::Running, 10);
    store.create_run(original.clone(), lease.token).await.unwrap();

    let mut stale = original.clone();
    stale.version = 5;
    let conflict = store.put_run_and_release(stale, lease.token).await.unwrap_err();
    assert_eq!(conflict, StoreError::VersionConflict { run_id: "run-1".into(), expected: 5, actual: 0 });
    assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(lease.token), "still held");
    let fenced = StoreError::Fenced { run_id: "run-1".into(), token: lease.token + 1 };
    assert_eq!(store.put_run_and_release(original.clone(), lease.token + 1).await.unwrap_err(), fenced);
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(original.clone()), "refused writes change nothing");

    let mut done = original.clone();
    done.status = RunStatus::Finished;
    done.state = json!({"answer": 42}).into();
    done.updated_at_ms = 20;
    let (version, released) = store.put_run_and_release(done.clone(), lease.token).await.unwrap();
    assert_eq!(version, 1);
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(RunRecord { version: 1, ..done }));
    if released {
        assert_eq!(store.current_lease("run-1").await.unwrap(), None);
        let fenced = StoreError::Fenced { run_id: "run-1".into(), token: lease.token };
        assert_eq!(store.append_steps("run-1", lease.token, vec![step("a")]).await.unwrap_err(), fenced);
        assert_eq!(store.release_lease(&lease).await.unwrap_err(), fenced, "released once");
    } else {
        assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(lease.token));
        store.release_lease(&lease).await.unwrap();
    }
    assert_eq!(store.acquire_lease("run-1", "b", HOUR).await.unwrap().token, lease.token + 1);
}

/// `put_run_and_release_after`: the last step appended finished at the journal's next
/// ordinal, with the run written and the lease given up as `put_run_and_release` does. A stale
/// token writes nothing. A refused run leaves the run and the lease as they were; a store that
/// does both in one transaction leaves the journal so too, one that does them apart (the
/// provided implementation) holds the step, refuses it again as a duplicate, and takes the
/// run alone.
pub async fn put_run_and_release_after_journals_the_last_step_with_the_run<S: RunStore>(store: S) {
    let lease = store.acquire_lease("run-1", "a", HOUR).await.unwrap();
    let original = run("run-1", RunStatus::Running, 10);
    store.create_run(original.clone(), lease.token).await.unwrap();
    assert_eq!(store.append_steps("run-1", lease.token, vec![step("call")]).await.unwrap(), [0]);
    store.finish_step("run-1", lease.token, 0, StepOutcome::Finished(json!("ok").into()), 1_500).await.unwrap();
    let last = FinishedStep {
        step: NewStep {
            key: "model:1".into(),
            kind: StepKind::Model,
            name: "model".into(),
            epoch: 0,
            started_at_ms: 1_600,
        },
        outcome: StepOutcome::Finished(json!({"text": "done"}).into()),
        finished_at_ms: 1_700,
    };
    let mut done = original.clone();
    done.status = RunStatus::Finished;
    done.state = json!({"answer": "done"}).into();
    done.updated_at_ms = 20;

    let fenced = StoreError::Fenced { run_id: "run-1".into(), token: lease.token + 1 };
    let refused = store.put_run_and_release_after(last.clone(), done.clone(), lease.token + 1).await.unwrap_err();
    assert_eq!(refused, fenced);
    assert_eq!(store.steps("run-1").await.unwrap().len(), 1, "a stale token journals nothing");
    let mut stale = done.clone();
    stale.version = 5;
    let conflict = store.put_run_and_release_after(last.clone(), stale, lease.token).await.unwrap_err();
    assert_eq!(conflict, StoreError::VersionConflict { run_id: "run-1".into(), expected: 5, actual: 0 });
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(original.clone()), "a refused run is as it was");
    assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(lease.token), "still held");
    let kept = store.steps("run-1").await.unwrap().len() == 2;

    let (version, released) = if kept {
        let again = store.put_run_and_release_after(last.clone(), done.clone(), lease.token).await.unwrap_err();
        assert_eq!(again, StoreError::DuplicateKey { run_id: "run-1".into(), key: "model:1".into() });
        store.put_run_and_release(done.clone(), lease.token).await.unwrap()
    } else {
        store.put_run_and_release_after(last.clone(), done.clone(), lease.token).await.unwrap()
    };
    assert_eq!(version, 1);
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(RunRecord { version: 1, ..done }));
    let journal = store.steps("run-1").await.unwrap();
    assert_eq!(journal.len(), 2);
    let step = &journal[1];
    assert_eq!(
        (step.ordinal, step.key.as_str(), step.kind, step.name.as_str()),
        (1, "model:1", StepKind::Model, "model")
    );
    assert_eq!((step.status, step.started_at_ms, step.finished_at_ms), (StepStatus::Finished, 1_600, Some(1_700)));
    assert_eq!(step.result.as_ref().map(|r| r.to_value()), Some(json!({"text": "done"})));
    assert_eq!(step.error, None);
    if released {
        assert_eq!(store.current_lease("run-1").await.unwrap(), None);
    } else {
        assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(lease.token));
        store.release_lease(&lease).await.unwrap();
    }
    assert_eq!(store.acquire_lease("run-1", "b", HOUR).await.unwrap().token, lease.token + 1);
}

/// `acquire_lease_and_create_run`: a run that is not there is created under the new lease,
/// as given; one that is there is read and left as it was. A lease held by another owner is
/// `LeaseHeld` and creates nothing; a run the store refuses (too large) leaves neither a run
/// nor a lease held.
pub async fn lease_with_the_run_created_under_it<S: RunStore>(store: S) {
    let new = run("run-1", RunStatus::Running, 10);
    let (lease, there) = store.acquire_lease_and_create_run(new.clone(), "a", HOUR).await.unwrap();
    assert_eq!(there, None, "created");
    assert_eq!((lease.run_id.as_str(), lease.owner.as_str()), ("run-1", "a"));
    assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(lease.token));
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(new.clone()));
    assert_eq!(store.append_steps("run-1", lease.token, vec![step("a")]).await.unwrap(), [0], "writable under it");

    let other = run("run-2", RunStatus::Running, 20);
    let held = store.acquire_lease("run-2", "b", HOUR).await.unwrap();
    let busy = store.acquire_lease_and_create_run(other, "a", HOUR).await.unwrap_err();
    assert!(matches!(busy, StoreError::LeaseHeld { ref owner, .. } if owner == "b"), "{busy:?}");
    assert_eq!(store.get_run("run-2").await.unwrap(), None, "a held lease creates nothing");
    assert_eq!(store.current_lease("run-2").await.unwrap().map(|l| l.token), Some(held.token));

    store.release_lease(&lease).await.unwrap();
    let mut again = run("run-1", RunStatus::Paused, 30);
    again.agent_id = "sales".into();
    let (second, there) = store.acquire_lease_and_create_run(again, "c", HOUR).await.unwrap();
    assert_eq!(there, Some(new.clone()), "the run that was there");
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(new), "left as it was");
    assert_eq!(second.token, lease.token + 1);
    assert_eq!(store.steps("run-1").await.unwrap().len(), 1);

    let mut big = run("big", RunStatus::Running, 1);
    big.state = Value::String("x".repeat(DEFAULT_MAX_VALUE_BYTES)).into();
    let refused = store.acquire_lease_and_create_run(big, "a", HOUR).await.unwrap_err();
    assert!(matches!(refused, StoreError::LimitExceeded(_)), "{refused:?}");
    assert_eq!(store.get_run("big").await.unwrap(), None);
    assert_eq!(store.current_lease("big").await.unwrap(), None, "no lease left held");
}

/// `list_runs`: most recently updated first (ties by run id), filtered by status, limited.
pub async fn run_list_filter_order_limit<S: RunStore>(store: S) {
    let store = Owned::new(store);
    assert!(store.list_runs(RunFilter::default()).await.unwrap().is_empty());
    let runs = [
        ("a", RunStatus::Finished, 30),
        ("b", RunStatus::Running, 50),
        ("c", RunStatus::Paused, 10),
        ("d", RunStatus::Running, 40),
        ("e", RunStatus::Running, 20),
        ("f", RunStatus::Failed, 40),
    ];
    for (id, status, at) in runs {
        store.create_run(run(id, status, at)).await.unwrap();
    }
    let ids = |list: Vec<kuralle::RunSummary>| list.into_iter().map(|r| r.run_id).collect::<Vec<_>>();

    let all = store.list_runs(RunFilter::default()).await.unwrap();
    assert_eq!(ids(all.clone()), ["b", "d", "f", "a", "e", "c"]);
    assert_eq!(all[0].agent_id, "support");
    assert_eq!(all[0].status, RunStatus::Running);
    assert_eq!(all[0].updated_at_ms, 50);

    let running = RunFilter { status: Some(RunStatus::Running), limit: None };
    assert_eq!(ids(store.list_runs(running).await.unwrap()), ["b", "d", "e"]);
    let top_running = RunFilter { status: Some(RunStatus::Running), limit: Some(2) };
    assert_eq!(ids(store.list_runs(top_running).await.unwrap()), ["b", "d"]);
    assert_eq!(ids(store.list_runs(RunFilter { status: None, limit: Some(3) }).await.unwrap()), ["b", "d", "f"]);
    assert!(store.list_runs(RunFilter { status: None, limit: Some(0) }).await.unwrap().is_empty());
    let none = RunFilter { status: Some(RunStatus::MaxSteps), limit: None };
    assert!(store.list_runs(none).await.unwrap().is_empty());
    assert_eq!(store.list_runs(RunFilter { status: None, limit: Some(100) }).await.unwrap().len(), 6);

    // An update moves a run to the front and into its new status.
    let mut c = store.get_run("c").await.unwrap().unwrap();
    c.status = RunStatus::Running;
    c.updated_at_ms = 60;
    store.put_run(c).await.unwrap();
    let running = RunFilter { status: Some(RunStatus::Running), limit: None };
    assert_eq!(ids(store.list_runs(running).await.unwrap()), ["c", "b", "d", "e"]);
    let paused = RunFilter { status: Some(RunStatus::Paused), limit: None };
    assert!(store.list_runs(paused).await.unwrap().is_empty());
}

/// `delete_run` removes the run and its journal; the id can be reused with a fresh journal.
pub async fn run_delete<S: RunStore>(store: S) {
    let store = Owned::new(store);
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    store.create_run(run("run-2", RunStatus::Running, 2)).await.unwrap();
    store.append_steps("run-1", vec![step("a"), step("b")]).await.unwrap();
    store.append_steps("run-2", vec![step("a")]).await.unwrap();

    assert!(store.delete_run("run-1").await.unwrap());
    assert_eq!(store.get_run("run-1").await.unwrap(), None);
    assert!(store.steps("run-1").await.unwrap().is_empty());
    assert!(!store.delete_run("run-1").await.unwrap());
    assert_eq!(store.list_runs(RunFilter::default()).await.unwrap().len(), 1);
    assert_eq!(store.steps("run-2").await.unwrap().len(), 1, "other runs are untouched");

    store.create_run(run("run-1", RunStatus::Running, 3)).await.unwrap();
    assert_eq!(store.append_steps("run-1", vec![step("a")]).await.unwrap(), [0], "a fresh journal");
}

/// append / finish / steps round trip, including `Failed` outcomes and unicode JSON.
pub async fn journal_round_trip<S: RunStore>(store: S) {
    let store = Owned::new(store);
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    assert!(store.steps("run-1").await.unwrap().is_empty());

    let intents = vec![
        NewStep { key: "k-model".into(), kind: StepKind::Model, name: "model".into(), epoch: 2, started_at_ms: 100 },
        NewStep { key: "k-tool".into(), kind: StepKind::Tool, name: "charge".into(), epoch: 2, started_at_ms: 101 },
        NewStep { key: "k-now".into(), kind: StepKind::Now, name: "now".into(), epoch: 2, started_at_ms: 102 },
        NewStep { key: "k-uuid".into(), kind: StepKind::Uuid, name: "uuid".into(), epoch: 2, started_at_ms: 103 },
        NewStep { key: "k-ok".into(), kind: StepKind::Approval, name: "charge".into(), epoch: 2, started_at_ms: 104 },
    ];
    assert_eq!(store.append_steps("run-1", intents.clone()).await.unwrap(), [0, 1, 2, 3, 4]);
    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(steps.len(), 5);
    for (i, (record, intent)) in steps.iter().zip(&intents).enumerate() {
        assert_eq!(record.ordinal, i as u64);
        assert_eq!(record.key, intent.key);
        assert_eq!(record.kind, intent.kind);
        assert_eq!(record.name, intent.name);
        assert_eq!(record.epoch, 2);
        assert_eq!(record.status, StepStatus::Running);
        assert_eq!(record.result, None);
        assert_eq!(record.error, None);
        assert_eq!(record.started_at_ms, intent.started_at_ms);
        assert_eq!(record.finished_at_ms, None);
    }

    let result = json!({
        "text": "Grüße aus Köln — 你好 — مرحبا — 🚀\u{0}\"quoted\"\n",
        "numbers": [0, -1, 1.5, 1e300, u64::MAX, i64::MIN],
        "empty": {}, "list": [], "null": null, "bool": false,
    });
    let error = json!({"kind": "tool_error", "message": "carte refusée ❌", "retryable": false});
    store.finish_step("run-1", 1, StepOutcome::Finished(kuralle::JsonText::from(result.clone())), 200).await.unwrap();
    store.finish_step("run-1", 2, StepOutcome::Failed(kuralle::JsonText::from(error.clone())), 201).await.unwrap();
    store
        .finish_step("run-1", 0, StepOutcome::Finished(kuralle::JsonText::from(Value::String(String::new()))), 202)
        .await
        .unwrap();

    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(steps[1].status, StepStatus::Finished);
    assert_eq!(tree(&steps[1].result), Some(result));
    assert_eq!(steps[1].error, None);
    assert_eq!(steps[1].finished_at_ms, Some(200));
    assert_eq!(steps[2].status, StepStatus::Failed);
    assert_eq!(steps[2].result, None);
    assert_eq!(tree(&steps[2].error), Some(error));
    assert_eq!(steps[2].finished_at_ms, Some(201));
    assert_eq!(steps[0].status, StepStatus::Finished);
    assert_eq!(tree(&steps[0].result), Some(json!("")));
    assert_eq!(steps[3].status, StepStatus::Running, "untouched step stays running");

    // Later appends continue the sequence; an empty append reserves nothing.
    assert_eq!(store.append_steps("run-1", vec![]).await.unwrap(), Vec::<u64>::new());
    assert_eq!(store.append_steps("run-1", vec![step("k-5"), step("k-6")]).await.unwrap(), [5, 6]);
    assert_eq!(store.append_steps("run-1", vec![step("k-7")]).await.unwrap(), [7]);
    let ordinals: Vec<u64> = store.steps("run-1").await.unwrap().iter().map(|s| s.ordinal).collect();
    assert_eq!(ordinals, (0..8).collect::<Vec<_>>());

    // Journals are per run: another run starts at 0 and may reuse keys.
    store.create_run(run("run-2", RunStatus::Running, 1)).await.unwrap();
    assert_eq!(store.append_steps("run-2", vec![step("k-tool")]).await.unwrap(), [0]);
}

/// A key already in the run's journal (or twice in one call) is `DuplicateKey`, and the whole
/// call has no effect: no row, no ordinal consumed.
pub async fn journal_duplicate_key_rejected<S: RunStore>(store: S) {
    let store = Owned::new(store);
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    assert_eq!(store.append_steps("run-1", vec![step("a")]).await.unwrap(), [0]);

    let duplicate = store.append_steps("run-1", vec![step("a")]).await.unwrap_err();
    assert_eq!(duplicate, StoreError::DuplicateKey { run_id: "run-1".into(), key: "a".into() });

    let partly = store.append_steps("run-1", vec![step("b"), step("a"), step("c")]).await.unwrap_err();
    assert_eq!(partly, StoreError::DuplicateKey { run_id: "run-1".into(), key: "a".into() });

    let twice = store.append_steps("run-1", vec![step("d"), step("d")]).await.unwrap_err();
    assert_eq!(twice, StoreError::DuplicateKey { run_id: "run-1".into(), key: "d".into() });

    let keys: Vec<String> = store.steps("run-1").await.unwrap().into_iter().map(|s| s.key).collect();
    assert_eq!(keys, ["a"], "refused calls leave nothing behind");
    assert_eq!(store.append_steps("run-1", vec![step("b"), step("d")]).await.unwrap(), [1, 2], "no ordinal was used");
}

/// `finish_step` only finalizes a `Running` step, once.
pub async fn journal_finish_non_running_rejected<S: RunStore>(store: S) {
    let store = Owned::new(store);
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    store.append_steps("run-1", vec![step("a"), step("b")]).await.unwrap();
    store.finish_step("run-1", 0, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 5).await.unwrap();

    let not_running = |ordinal| StoreError::StepNotRunning { run_id: "run-1".into(), ordinal };
    let again =
        store.finish_step("run-1", 0, StepOutcome::Finished(kuralle::JsonText::from(json!(2))), 6).await.unwrap_err();
    assert_eq!(again, not_running(0));
    let again = store
        .finish_step("run-1", 0, StepOutcome::Failed(kuralle::JsonText::from(json!("late"))), 6)
        .await
        .unwrap_err();
    assert_eq!(again, not_running(0));
    assert_eq!(
        store.finish_step("run-1", 2, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 6).await.unwrap_err(),
        not_running(2)
    );
    let huge = store
        .finish_step("run-1", u64::MAX, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 6)
        .await
        .unwrap_err();
    assert_eq!(huge, not_running(u64::MAX));

    store.finish_step("run-1", 1, StepOutcome::Failed(kuralle::JsonText::from(json!({"e": 1}))), 7).await.unwrap();
    let again =
        store.finish_step("run-1", 1, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 8).await.unwrap_err();
    assert_eq!(again, not_running(1));

    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(
        (steps[0].status, tree(&steps[0].result), steps[0].finished_at_ms),
        (StepStatus::Finished, Some(json!(1)), Some(5))
    );
    assert_eq!(
        (steps[1].status, tree(&steps[1].error), steps[1].finished_at_ms),
        (StepStatus::Failed, Some(json!({"e": 1})), Some(7))
    );
}

/// A finished step and the intents after it are journaled together, all or nothing: a
/// duplicate key or a stale fence leaves nothing behind and uses no ordinal.
pub async fn journal_finished_with_intents<S: RunStore>(store: S) {
    let store = Owned::new(store);
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    assert_eq!(store.append_steps("run-1", vec![step("a")]).await.unwrap(), [0]);

    let model = |key: &str| NewStep {
        key: key.to_owned(),
        kind: StepKind::Model,
        name: "model".to_owned(),
        epoch: 0,
        started_at_ms: 90,
    };
    let response = json!({"text": "ça va ✓", "tool_calls": [{"name": "echo", "arguments": "{}"}]});
    let ordinals = store
        .append_finished_with_intents(
            "run-1",
            model("m1"),
            StepOutcome::Finished(kuralle::JsonText::from(response.clone())),
            95,
            vec![step("b"), step("c")],
        )
        .await
        .unwrap();
    assert_eq!(ordinals, [1, 2, 3]);
    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(steps.len(), 4);
    let m = &steps[1];
    assert_eq!((m.key.as_str(), m.kind, m.status), ("m1", StepKind::Model, StepStatus::Finished));
    assert_eq!((tree(&m.result), tree(&m.error)), (Some(response), None));
    assert_eq!((m.started_at_ms, m.finished_at_ms), (90, Some(95)));
    for s in &steps[2..] {
        assert_eq!((s.status, s.result.as_ref(), s.finished_at_ms), (StepStatus::Running, None, None), "{}", s.key);
    }
    assert_eq!(steps[0].status, StepStatus::Running, "earlier steps are untouched");

    // No intents: the finished step alone. A failed outcome is stored as an error.
    let failed = json!({"kind": "failed"});
    let alone = store
        .append_finished_with_intents(
            "run-1",
            model("m2"),
            StepOutcome::Failed(kuralle::JsonText::from(failed.clone())),
            96,
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(alone, [4]);
    let m2 = &store.steps("run-1").await.unwrap()[4];
    assert_eq!((m2.status, tree(&m2.result), tree(&m2.error)), (StepStatus::Failed, None, Some(failed)));

    // A duplicate key, in the finished step or in an intent, refuses the whole call.
    let finished = || StepOutcome::Finished(kuralle::JsonText::from(json!(1)));
    let dup = store.append_finished_with_intents("run-1", model("a"), finished(), 97, vec![step("x")]).await;
    assert_eq!(dup.unwrap_err(), StoreError::DuplicateKey { run_id: "run-1".into(), key: "a".into() });
    let dup = store.append_finished_with_intents("run-1", model("m3"), finished(), 97, vec![step("b")]).await;
    assert_eq!(dup.unwrap_err(), StoreError::DuplicateKey { run_id: "run-1".into(), key: "b".into() });

    // A stale fence writes nothing either.
    let stale = store.fence("run-1").await.wrapping_sub(1);
    let write = FinishedWithIntents {
        finished: model("m3"),
        outcome: finished(),
        finished_at_ms: 97,
        intents: vec![step("y")],
    };
    let fenced = store.store.append_finished_with_intents("run-1", stale, write).await;
    assert!(matches!(fenced, Err(StoreError::Fenced { .. })), "{fenced:?}");

    let keys: Vec<String> = store.steps("run-1").await.unwrap().into_iter().map(|s| s.key).collect();
    assert_eq!(keys, ["a", "m1", "b", "c", "m2"], "refused calls leave nothing behind");
    assert_eq!(store.append_steps("run-1", vec![step("z")]).await.unwrap(), [5], "no ordinal was used");
}

/// Operations on an unknown run.
pub async fn run_not_found<S: RunStore>(store: S) {
    let store = Owned::new(store);
    let missing = || StoreError::RunNotFound("ghost".into());
    assert_eq!(store.get_run("ghost").await.unwrap(), None);
    assert_eq!(store.put_run(run("ghost", RunStatus::Running, 1)).await.unwrap_err(), missing());
    assert_eq!(store.append_steps("ghost", vec![step("a")]).await.unwrap_err(), missing());
    assert_eq!(store.append_steps("ghost", vec![]).await.unwrap_err(), missing());
    assert_eq!(
        store.finish_step("ghost", 0, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 1).await.unwrap_err(),
        missing()
    );
    assert!(store.steps("ghost").await.unwrap().is_empty());
    assert!(!store.delete_run("ghost").await.unwrap());
    assert!(store.list_runs(RunFilter::default()).await.unwrap().is_empty(), "nothing was created");
    assert!(!missing().is_retryable());
}

/// A value over [`DEFAULT_MAX_VALUE_BYTES`] is `LimitExceeded` and writes nothing, whatever
/// else is wrong with the write (a stale token); the run goes on.
pub async fn value_size_limit<S: RunStore>(store: S) {
    let store = Owned::new(store);
    // Compact JSON of a string is its text plus two quotes.
    let at_limit = Value::String("x".repeat(DEFAULT_MAX_VALUE_BYTES - 2));
    let over = Value::String("x".repeat(DEFAULT_MAX_VALUE_BYTES - 1));

    let mut big = run("big", RunStatus::Running, 1);
    big.state = (&over).into();
    assert!(matches!(store.create_run(big).await.unwrap_err(), StoreError::LimitExceeded(_)));
    assert_eq!(store.get_run("big").await.unwrap(), None);

    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    store.append_steps("run-1", vec![step("a"), step("b")]).await.unwrap();
    // The size is refused before the fence is read, on every store: under a stale token too.
    let stale = store.fence("run-1").await + 1;
    let mut big = run("run-1", RunStatus::Running, 1);
    big.state = (&over).into();
    let err = store.store.put_run(big, stale).await.unwrap_err();
    assert!(matches!(err, StoreError::LimitExceeded(_)), "{err:?}");
    let too_big = StepOutcome::Failed(kuralle::JsonText::from(over.clone()));
    let err = store.store.finish_step("run-1", stale, 0, too_big, 2).await.unwrap_err();
    assert!(matches!(err, StoreError::LimitExceeded(_)), "{err:?}");
    let err = store.finish_step("run-1", 0, StepOutcome::Failed(kuralle::JsonText::from(over)), 2).await.unwrap_err();
    assert!(matches!(err, StoreError::LimitExceeded(_)), "{err:?}");
    assert!(!err.is_retryable());
    let steps = store.steps("run-1").await.unwrap();
    assert!(steps.iter().all(|s| s.status == StepStatus::Running), "nothing was finalized");

    // At the limit is fine, and the run goes on.
    store.finish_step("run-1", 1, StepOutcome::Finished(kuralle::JsonText::from(at_limit)), 3).await.unwrap();
    store.finish_step("run-1", 0, StepOutcome::Failed(kuralle::JsonText::from(json!("too big"))), 3).await.unwrap();
    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(
        tree(&steps[1].result).as_ref().and_then(Value::as_str).map(str::len),
        Some(DEFAULT_MAX_VALUE_BYTES - 2)
    );
    assert_eq!(steps[0].status, StepStatus::Failed);
}

/// 64 tasks each append 1..=4 steps to one run at once: every ordinal is unique, the union
/// is exactly `0..n`, and each call's ordinals are contiguous and in its given order.
pub async fn reservation_under_64_concurrent_reservers<S: RunStore>(store: S) {
    let store = Arc::new(Owned::new(store));
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|task| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let count = task % 4 + 1;
                let keys: Vec<String> = (0..count).map(|i| format!("task-{task}-step-{i}")).collect();
                let steps = keys.iter().map(|key| step(key)).collect();
                barrier.wait().await;
                let ordinals = store.append_steps("run-1", steps).await.unwrap();
                (keys, ordinals)
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    let mut expected_total = 0;
    let mut calls = Vec::new();
    for task in tasks {
        let (keys, ordinals) = task.await.unwrap();
        assert_eq!(ordinals.len(), keys.len());
        assert!(ordinals.windows(2).all(|w| w[1] == w[0] + 1), "one call's ordinals are contiguous: {ordinals:?}");
        expected_total += ordinals.len();
        all.extend(ordinals.iter().copied());
        calls.push((keys, ordinals));
    }
    assert_eq!(expected_total, 64 / 4 * (1 + 2 + 3 + 4));
    assert_eq!(all.len(), expected_total, "ordinals are unique");
    assert_eq!(all, (0..expected_total as u64).collect::<BTreeSet<_>>(), "ordinals are gap-free from 0");

    let journal = store.steps("run-1").await.unwrap();
    assert_eq!(journal.len(), expected_total);
    for (keys, ordinals) in calls {
        for (key, ordinal) in keys.iter().zip(ordinals) {
            assert_eq!(&journal[ordinal as usize].key, key, "each step sits at the ordinal returned for it");
        }
    }
    // The next reservation follows on.
    assert_eq!(store.append_steps("run-1", vec![step("after")]).await.unwrap(), [expected_total as u64]);
}

/// 16 tasks `put_run` with the same expected version, 10 rounds: exactly one wins, 15 get
/// `VersionConflict` with the actual version, and the store holds version + 1 with the
/// winner's state.
pub async fn version_check_with_16_concurrent_writers<S: RunStore>(store: S) {
    let store = Arc::new(Owned::new(store));
    store.create_run(run("run-1", RunStatus::Running, 1)).await.unwrap();
    for round in 0..10u64 {
        let base = store.get_run("run-1").await.unwrap().unwrap();
        assert_eq!(base.version, round);
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|writer| {
                let store = store.clone();
                let barrier = barrier.clone();
                let mut mine = base.clone();
                mine.state = json!({"round": round, "writer": writer, "text": format!("écrit par {writer} ✍")}).into();
                mine.updated_at_ms = 100 + writer;
                tokio::spawn(async move {
                    barrier.wait().await;
                    (mine.clone(), store.put_run(mine).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut losers = 0;
        for task in tasks {
            let (mine, result) = task.await.unwrap();
            match result {
                Ok(version) => {
                    assert_eq!(version, round + 1);
                    winners.push(mine);
                }
                Err(StoreError::VersionConflict { run_id, expected, actual }) => {
                    assert_eq!((run_id.as_str(), expected, actual), ("run-1", round, round + 1));
                    losers += 1;
                }
                Err(other) => panic!("unexpected error {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: exactly one writer wins");
        assert_eq!(losers, 15);
        let stored = store.get_run("run-1").await.unwrap().unwrap();
        let winner = winners.pop().unwrap();
        assert_eq!(stored, RunRecord { version: round + 1, created_at_ms: 1, ..winner }, "round {round}");
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// 16 tasks acquire one run's lease at once (the run need not exist): exactly one holds it
/// (token 1); the others get `LeaseHeld` naming the holder.
pub async fn lease_16_concurrent_acquirers<S: RunStore>(store: S) {
    let store = Arc::new(store);
    assert_eq!(store.current_lease("run-1").await.unwrap(), None);
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.acquire_lease("run-1", &format!("owner-{i}"), HOUR).await
            })
        })
        .collect();
    let mut winners: Vec<Lease> = Vec::new();
    let mut held = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(lease) => winners.push(lease),
            Err(StoreError::LeaseHeld { run_id, owner, expires_at_ms }) => held.push((run_id, owner, expires_at_ms)),
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one holder: {winners:?}");
    let winner = winners.pop().unwrap();
    assert_eq!((winner.run_id.as_str(), winner.token), ("run-1", 1));
    assert_eq!(held.len(), 15);
    for (run_id, owner, expires_at_ms) in held {
        assert_eq!(
            (run_id.as_str(), owner.as_str(), expires_at_ms),
            ("run-1", winner.owner.as_str(), winner.expires_at_ms)
        );
    }
    assert_eq!(store.current_lease("run-1").await.unwrap(), Some(winner.clone()));
    // The holder's writes go through; nobody else's do.
    store.create_run(run("run-1", RunStatus::Running, 1), winner.token).await.unwrap();
    let other = store.create_run(run("run-1", RunStatus::Running, 1), winner.token + 1).await.unwrap_err();
    assert_eq!(other, StoreError::Fenced { run_id: "run-1".into(), token: winner.token + 1 });
    // Leases are per run.
    assert_eq!(store.acquire_lease("run-2", "owner-x", HOUR).await.unwrap().token, 1);
}

/// After the holder's lease expires another owner takes over with a higher token; every
/// write and renewal under the old token then fails `Fenced` and changes nothing (a fenced
/// write never reports `RunExists`, `VersionConflict`, `DuplicateKey` or `StepNotRunning`).
/// Expiry alone does not fence: a holder nobody replaced may still write and renew.
pub async fn lease_takeover_fences_the_old_token<S: RunStore>(store: S) {
    let ttl = Duration::from_millis(100);
    let old = store.acquire_lease("run-1", "zombie", ttl).await.unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), old.token).await.unwrap();
    store.append_steps("run-1", old.token, vec![step("a"), step("b")]).await.unwrap();
    store
        .finish_step("run-1", old.token, 0, StepOutcome::Finished(kuralle::JsonText::from(json!("a"))), 2)
        .await
        .unwrap();
    let held = store.acquire_lease("run-1", "taker", ttl).await.unwrap_err();
    assert!(matches!(held, StoreError::LeaseHeld { ref owner, .. } if owner == "zombie"), "{held:?}");

    tokio::time::sleep(ttl * 3).await;
    // Expired, not yet taken over: the slow holder still writes and renews.
    assert_eq!(store.current_lease("run-1").await.unwrap(), None, "an expired lease is not current");
    store
        .finish_step("run-1", old.token, 1, StepOutcome::Finished(kuralle::JsonText::from(json!("b"))), 3)
        .await
        .unwrap();
    let old = store.renew_lease(&old, ttl).await.unwrap();
    assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(old.token));

    tokio::time::sleep(ttl * 3).await;
    let new = store.acquire_lease("run-1", "taker", HOUR).await.unwrap();
    assert!(new.token > old.token, "{new:?} after {old:?}");
    assert_eq!(new.owner, "taker");
    assert_eq!(store.current_lease("run-1").await.unwrap(), Some(new.clone()));
    let record = store.get_run("run-1").await.unwrap().unwrap();
    let steps = store.steps("run-1").await.unwrap();

    let fenced = StoreError::Fenced { run_id: "run-1".into(), token: old.token };
    assert_eq!(store.create_run(run("run-1", RunStatus::Paused, 9), old.token).await.unwrap_err(), fenced);
    assert_eq!(store.put_run(record.clone(), old.token).await.unwrap_err(), fenced);
    let mut stale = record.clone();
    stale.version += 5;
    assert_eq!(store.put_run(stale, old.token).await.unwrap_err(), fenced);
    assert_eq!(store.append_steps("run-1", old.token, vec![step("c")]).await.unwrap_err(), fenced);
    assert_eq!(store.append_steps("run-1", old.token, vec![step("a")]).await.unwrap_err(), fenced);
    assert_eq!(
        store
            .finish_step("run-1", old.token, 0, StepOutcome::Finished(kuralle::JsonText::from(json!(0))), 4)
            .await
            .unwrap_err(),
        fenced
    );
    assert_eq!(store.renew_lease(&old, HOUR).await.unwrap_err(), fenced);
    assert_eq!(store.release_lease(&old).await.unwrap_err(), fenced);
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(record.clone()), "fenced writes change nothing");
    assert_eq!(store.steps("run-1").await.unwrap(), steps);
    assert_eq!(store.current_lease("run-1").await.unwrap(), Some(new.clone()), "the new holder keeps it");

    // The new holder writes as usual.
    assert_eq!(store.append_steps("run-1", new.token, vec![step("c")]).await.unwrap(), [2]);
    assert_eq!(store.put_run(record, new.token).await.unwrap(), 1);
}

/// Release lets the next owner in at once with a higher token; the released token writes
/// nothing; tokens never go down, not even after the run is deleted.
pub async fn lease_release_gives_a_higher_token<S: RunStore>(store: S) {
    let none = store.append_steps("run-1", 1, vec![step("a")]).await.unwrap_err();
    assert_eq!(none, StoreError::Fenced { run_id: "run-1".into(), token: 1 }, "no lease, no write");
    let first = store.acquire_lease("run-1", "a", HOUR).await.unwrap();
    assert_eq!(first.token, 1);
    store.create_run(run("run-1", RunStatus::Running, 1), first.token).await.unwrap();
    store.release_lease(&first).await.unwrap();
    assert_eq!(store.current_lease("run-1").await.unwrap(), None);
    let fenced = StoreError::Fenced { run_id: "run-1".into(), token: first.token };
    assert_eq!(store.append_steps("run-1", first.token, vec![step("a")]).await.unwrap_err(), fenced);
    assert_eq!(store.renew_lease(&first, HOUR).await.unwrap_err(), fenced);
    assert_eq!(store.release_lease(&first).await.unwrap_err(), fenced, "released once");

    let second = store.acquire_lease("run-1", "b", HOUR).await.unwrap();
    assert_eq!(second.token, 2);
    assert_eq!(store.append_steps("run-1", second.token, vec![step("a")]).await.unwrap(), [0]);
    let renewed = store.renew_lease(&second, HOUR).await.unwrap();
    assert_eq!((renewed.token, renewed.owner.as_str()), (2, "b"));
    assert!(renewed.expires_at_ms >= second.expires_at_ms);

    assert!(store.delete_run("run-1").await.unwrap());
    store.release_lease(&renewed).await.unwrap();
    let third = store.acquire_lease("run-1", "c", HOUR).await.unwrap();
    assert_eq!(third.token, 3, "a deleted run's id never reuses a token");
    store.create_run(run("run-1", RunStatus::Running, 5), third.token).await.unwrap();
    assert_eq!(
        store.append_steps("run-1", second.token, vec![step("z")]).await.unwrap_err(),
        StoreError::Fenced { run_id: "run-1".into(), token: 2 }
    );
}

/// `acquire_lease_and_get_run`: the lease as `acquire_lease` grants it, with the run as
/// `get_run` reads it under that lease (none before the run is created); a held lease is
/// refused as `acquire_lease` refuses it, and nothing is read.
pub async fn lease_with_the_run_read_under_it<S: RunStore>(store: S) {
    let (first, none) = store.acquire_lease_and_get_run("run-1", "a", HOUR).await.unwrap();
    assert_eq!((first.token, first.owner.as_str(), none), (1, "a", None));
    assert_eq!(store.current_lease("run-1").await.unwrap(), Some(first.clone()));
    let refused = store.acquire_lease_and_get_run("run-1", "b", HOUR).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::LeaseHeld { run_id, owner, .. } if run_id == "run-1" && owner == "a"),
        "{refused:?}"
    );

    let record = run("run-1", RunStatus::Running, 1);
    store.create_run(record.clone(), first.token).await.unwrap();
    store.release_lease(&first).await.unwrap();
    let (second, read) = store.acquire_lease_and_get_run("run-1", "b", HOUR).await.unwrap();
    assert_eq!((second.token, second.owner.as_str()), (2, "b"));
    assert_eq!(read, Some(record.clone()));
    assert_eq!(store.put_run(record, second.token).await.unwrap(), 1, "the lease it granted writes");
    let stale = StoreError::Fenced { run_id: "run-1".into(), token: first.token };
    assert_eq!(store.append_steps("run-1", first.token, vec![step("a")]).await.unwrap_err(), stale);
}

/// A lease renews and releases as it was granted: the runtime keeps the lease it was given and
/// sends it at every renewal, so after the first the expiry it carries is older than the
/// store's. A store renews and releases a lease by its run id and token.
pub async fn a_lease_renews_and_releases_as_granted<S: RunStore>(store: S) {
    let granted = store.acquire_lease("run-1", "a", HOUR).await.unwrap();
    let first = store.renew_lease(&granted, HOUR).await.unwrap();
    let again = store.renew_lease(&granted, HOUR).await.unwrap();
    assert_eq!((again.token, again.owner.as_str()), (granted.token, "a"));
    assert!(again.expires_at_ms >= first.expires_at_ms, "{again:?} after {first:?}");
    let batch = store.renew_leases(std::slice::from_ref(&granted), HOUR).await.unwrap();
    assert_eq!(batch[0].as_ref().map(|l| l.token), Ok(granted.token));
    store.release_lease(&granted).await.unwrap();
    assert_eq!(store.current_lease("run-1").await.unwrap(), None);
}

/// `renew_leases`: one call renews every current lease (a later expiry, the same token and
/// owner) and answers each lease at its index: a released one, one taken over (its old token)
/// and one of a run never leased are `Fenced`, and renewing them changes nothing; the batch
/// holds the same run twice (its current and an old token) and 1,200 leases in one call.
pub async fn leases_renewed_in_one_batch_keep_their_own_outcomes<S: RunStore>(store: S) {
    assert!(store.renew_leases(&[], HOUR).await.unwrap().is_empty(), "nothing to renew");
    let short = Duration::from_secs(60);
    let held = store.acquire_lease("held", "a", short).await.unwrap();
    let released = store.acquire_lease("released", "a", short).await.unwrap();
    store.release_lease(&released).await.unwrap();
    let old = store.acquire_lease("taken", "a", short).await.unwrap();
    store.release_lease(&old).await.unwrap();
    let taker = store.acquire_lease("taken", "b", short).await.unwrap();
    let never = Lease { run_id: "never".into(), owner: "a".into(), token: 1, expires_at_ms: 0 };
    let batch = [held.clone(), released.clone(), old.clone(), taker.clone(), never.clone()];

    let renewed = store.renew_leases(&batch, HOUR).await.unwrap();
    assert_eq!(renewed.len(), batch.len());
    for (i, current) in [(0, &held), (3, &taker)] {
        let lease = renewed[i].as_ref().unwrap_or_else(|e| panic!("lease {i} renewed: {e:?}"));
        assert_eq!((&lease.run_id, &lease.owner, lease.token), (&current.run_id, &current.owner, current.token));
        assert!(lease.expires_at_ms > current.expires_at_ms + 30_000, "renewed for an hour: {lease:?}");
    }
    for (i, lease) in [(1, &released), (2, &old), (4, &never)] {
        let fenced = StoreError::Fenced { run_id: lease.run_id.clone(), token: lease.token };
        assert_eq!(renewed[i].as_ref().unwrap_err(), &fenced, "lease {i}");
    }
    assert_eq!(store.current_lease("released").await.unwrap(), None, "a fenced renewal changes nothing");
    assert_eq!(store.current_lease("never").await.unwrap(), None);
    assert_eq!(store.current_lease("taken").await.unwrap().map(|l| l.owner), Some("b".to_owned()));
    let stolen = store.acquire_lease("held", "thief", short).await.unwrap_err();
    assert!(matches!(stolen, StoreError::LeaseHeld { .. }), "{stolen:?}");

    // Many leases in one call, each renewed.
    let mut many = Vec::new();
    for i in 0..1_200 {
        many.push(store.acquire_lease(&format!("many-{i}"), "a", short).await.unwrap());
    }
    let renewed = store.renew_leases(&many, HOUR).await.unwrap();
    assert_eq!(renewed.len(), many.len());
    for (lease, renewed) in many.iter().zip(&renewed) {
        let renewed = renewed.as_ref().unwrap();
        assert_eq!((&renewed.run_id, renewed.token), (&lease.run_id, lease.token));
        assert!(renewed.expires_at_ms > lease.expires_at_ms + 30_000);
    }
}

/// The work queue: runnable runs (status running, no live lease) are claimed by 8 concurrent
/// claimers exactly once each, with a lease per run; runs that are paused, finished or leased
/// are never claimed; a released run is runnable again, a claimed one is not.
pub async fn queue_claims_each_runnable_run_once<S: RunStore>(store: S) {
    let store = Arc::new(store);
    let mut runnable = BTreeSet::new();
    for i in 0..12 {
        let id = format!("queued-{i:02}");
        let lease = store.acquire_lease(&id, "submitter", HOUR).await.unwrap();
        store.create_run(run(&id, RunStatus::Running, i), lease.token).await.unwrap();
        store.release_lease(&lease).await.unwrap();
        runnable.insert(id);
    }
    for (id, status) in [("paused", RunStatus::Paused), ("finished", RunStatus::Finished)] {
        let lease = store.acquire_lease(id, "submitter", HOUR).await.unwrap();
        store.create_run(run(id, status, 1), lease.token).await.unwrap();
        store.release_lease(&lease).await.unwrap();
    }
    let busy = store.acquire_lease("busy", "someone", HOUR).await.unwrap();
    store.create_run(run("busy", RunStatus::Running, 1), busy.token).await.unwrap();

    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let claimers: Vec<_> = (0..8)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let owner = format!("worker-{i}");
                let mut mine = Vec::new();
                // Each claims 2 at a time until the queue is empty.
                loop {
                    let claimed = store.claim_runnable(&owner, HOUR, 2).await.unwrap();
                    assert!(claimed.len() <= 2, "at most the limit");
                    if claimed.is_empty() {
                        return mine;
                    }
                    mine.extend(claimed.into_iter().map(|lease| (owner.clone(), lease)));
                }
            })
        })
        .collect();
    let mut claimed = BTreeSet::new();
    for claimer in claimers {
        for (owner, lease) in claimer.await.unwrap() {
            assert_eq!(lease.owner, format!("{owner}/{}", lease.run_id));
            assert_eq!(store.current_lease(&lease.run_id).await.unwrap(), Some(lease.clone()), "claimed = leased");
            assert!(claimed.insert(lease.run_id.clone()), "{} was claimed twice", lease.run_id);
        }
    }
    assert_eq!(claimed, runnable, "every runnable run, and only those, claimed once");
    assert!(store.claim_runnable("late", HOUR, 100).await.unwrap().is_empty(), "claimed runs are not runnable");
    assert!(store.claim_runnable("late", HOUR, 0).await.unwrap().is_empty());

    // Released: runnable again, with a higher token.
    let lease = store.current_lease("queued-03").await.unwrap().unwrap();
    store.release_lease(&lease).await.unwrap();
    let again = store.claim_runnable("next", HOUR, 100).await.unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].run_id.as_str(), again[0].token), ("queued-03", lease.token + 1));
    let next_lease = again[0].clone();
    // A hint is only a hint: it succeeds (or is a no-op) on every store.
    store.notify_runnable().await.unwrap();
    assert!(store.claim_runnable("next", HOUR, 100).await.unwrap().is_empty());
    store.release_lease(&next_lease).await.unwrap();
}

/// Instances: `lock_instance` proves one live holder per id (a second is `InstanceInUse`,
/// another id is independent, a dropped lock frees the id); `take_back` ends exactly the
/// unreleased leases whose owner starts with `"<id>/"` (expired ones included; not `app-10/…`,
/// not an owner equal to the bare id, not other instances' or released ones), like
/// `release_lease`: the next acquire gets a higher token and the old token is fenced.
pub async fn instance_lock_takes_back_only_its_own_leases<S: RunStore>(store: S) {
    // Unique ids: a PostgreSQL lock is per database, whatever schema the test store uses.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let id = format!("conf-{}-{nanos}", std::process::id());
    let lock = store.lock_instance(&id).await.unwrap().expect("this store proves that an instance is alive");
    assert_eq!(lock.instance_id(), id);
    match store.lock_instance(&id).await {
        Err(StoreError::InstanceInUse { instance_id, holder }) => {
            assert_eq!(instance_id, id);
            assert!(!holder.is_empty());
        }
        other => panic!("a second holder of one id must be refused, got {other:?}"),
    }
    let other_id = format!("{id}0");
    let other = store.lock_instance(&other_id).await.unwrap().expect("another id is independent");

    let mine = store.acquire_lease("mine", &format!("{id}/turn-1"), HOUR).await.unwrap();
    store.create_run(run("mine", RunStatus::Running, 1), mine.token).await.unwrap();
    let worker = store.acquire_lease("worker", &format!("{id}/w-1/worker"), HOUR).await.unwrap();
    let expired = store.acquire_lease("expired", &format!("{id}/turn-2"), Duration::from_millis(50)).await.unwrap();
    let released = store.acquire_lease("released", &format!("{id}/turn-3"), HOUR).await.unwrap();
    store.release_lease(&released).await.unwrap();
    let longer = store.acquire_lease("longer", &format!("{other_id}/turn"), HOUR).await.unwrap();
    let bare = store.acquire_lease("bare", &id, HOUR).await.unwrap();
    let stranger = store.acquire_lease("stranger", "9b1d-process/turn", HOUR).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;

    let mut taken = lock.take_back().await.unwrap();
    taken.sort();
    assert_eq!(taken, ["expired", "mine", "worker"]);
    assert!(lock.take_back().await.unwrap().is_empty(), "nothing left to take back");
    for lease in [&longer, &bare, &stranger] {
        assert_eq!(store.current_lease(&lease.run_id).await.unwrap().as_ref(), Some(lease), "not ours: untouched");
    }
    assert_eq!(store.current_lease("mine").await.unwrap(), None);
    let fenced = StoreError::Fenced { run_id: "mine".into(), token: mine.token };
    assert_eq!(store.append_steps("mine", mine.token, vec![step("late")]).await.unwrap_err(), fenced);
    assert_eq!(store.renew_lease(&mine, HOUR).await.unwrap_err(), fenced);
    let next = store.acquire_lease("mine", &format!("{id}/turn-4"), HOUR).await.unwrap();
    assert!(next.token > mine.token, "{next:?} after {mine:?}");
    assert!(store.acquire_lease("worker", "anyone", HOUR).await.unwrap().token > worker.token);
    assert!(store.acquire_lease("expired", "anyone", HOUR).await.unwrap().token > expired.token);
    // The other instance takes back its own, and leaves this one's new lease alone.
    assert_eq!(other.take_back().await.unwrap(), ["longer"]);
    assert_eq!(store.current_lease("mine").await.unwrap(), Some(next));

    drop(lock);
    drop(other);
    // Released with the process's proof (PostgreSQL: the session closing is asynchronous).
    let mut again = None;
    for _ in 0..100 {
        match store.lock_instance(&id).await {
            Ok(lock) => {
                again = lock;
                break;
            }
            Err(StoreError::InstanceInUse { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(again.is_some(), "a dropped lock frees its id");
}

/// A step's stored JSON text as a tree, for comparing with what was written (a store may give
/// the text back with other spacing or key order).
fn tree(text: &Option<kuralle::JsonText>) -> Option<Value> {
    text.as_ref().map(kuralle::JsonText::to_value)
}

/// `cancel_run`: a running run becomes `cancelled` (version bumped) and its owner's next
/// write and renewal are fenced; a paused run with no lease is closed the same way; a run that
/// ended is left as it was; an unknown run is `None`. A cancelled run is never claimed.
pub async fn cancel_closes_running_and_paused_runs_and_fences_their_owner<S: RunStore>(store: S) {
    let store = Owned::new(store);
    store.create_run(run("running", RunStatus::Running, 10)).await.unwrap();
    let fence = store.fence("running").await;
    assert_eq!(store.store.cancel_run("running").await.unwrap(), Some(RunStatus::Running));
    let cancelled = store.get_run("running").await.unwrap().unwrap();
    assert_eq!((cancelled.status, cancelled.version), (RunStatus::Cancelled, 1));
    let late = store.store.append_steps("running", fence, vec![step("k")]).await;
    assert!(matches!(late, Err(StoreError::Fenced { .. })), "{late:?}");
    let lease = Lease { run_id: "running".into(), owner: "conformance".into(), token: fence, expires_at_ms: 0 };
    let renewed = store.store.renew_lease(&lease, Duration::from_secs(60)).await;
    assert!(matches!(renewed, Err(StoreError::Fenced { .. })), "{renewed:?}");
    assert!(store.steps("running").await.unwrap().is_empty());

    // A paused run holds no lease: it is closed directly.
    store.create_run(run("paused", RunStatus::Paused, 20)).await.unwrap();
    let paused_lease = Lease {
        run_id: "paused".into(),
        owner: "conformance".into(),
        token: store.fence("paused").await,
        expires_at_ms: 0,
    };
    store.store.release_lease(&paused_lease).await.unwrap();
    assert_eq!(store.store.cancel_run("paused").await.unwrap(), Some(RunStatus::Paused));
    assert_eq!(store.get_run("paused").await.unwrap().unwrap().status, RunStatus::Cancelled);

    // Ended runs stay as they were.
    store.create_run(run("done", RunStatus::Finished, 30)).await.unwrap();
    assert_eq!(store.store.cancel_run("done").await.unwrap(), Some(RunStatus::Finished));
    let done = store.get_run("done").await.unwrap().unwrap();
    assert_eq!((done.status, done.version), (RunStatus::Finished, 0));
    assert_eq!(store.store.cancel_run("running").await.unwrap(), Some(RunStatus::Cancelled));
    assert_eq!(store.store.cancel_run("unknown").await.unwrap(), None);

    let listed = store.list_runs(RunFilter { status: Some(RunStatus::Cancelled), limit: None }).await.unwrap();
    let mut ids: Vec<&str> = listed.iter().map(|r| r.run_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["paused", "running"]);
    let claimed = store.store.claim_runnable("worker", Duration::from_secs(60), 10).await.unwrap();
    assert!(claimed.is_empty(), "a cancelled run is not runnable: {claimed:?}");
}
