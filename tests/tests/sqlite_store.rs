//! `SqliteStore`-specific behaviour: durability across reopen, corrupt and foreign files,
//! locks held by other processes, write failures (read-only file, full disk), group commit.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kuralle::stores::{SqliteOptions, SqliteStore};
use kuralle::{FinishedWithIntents, RunFilter, RunRecord, RunStatus, RunStore, StepOutcome, StepStatus, StoreError};
use kuralle_tests::conformance::{run, step};
use serde_json::json;

/// Takes `run_id`'s lease for the test (its first token, 1; the lease outlives the test).
async fn own(store: &SqliteStore, run_id: &str) -> u64 {
    store.acquire_lease(run_id, "test", Duration::from_secs(3600)).await.unwrap().token
}

fn db_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    (dir, path)
}

/// Runs a Python snippet against the database file in another process; returns its stdout.
fn python(path: &Path, code: &str) -> String {
    let output = Command::new("python3").arg("-c").arg(code).arg(path).output().expect("python3 runs");
    assert!(output.status.success(), "python failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

fn assert_full(error: &StoreError) {
    match error {
        StoreError::StorageFull(message) => assert!(message.contains("max_size_bytes"), "{message:?}"),
        other => panic!("expected StorageFull, got {other:?}"),
    }
    assert!(error.is_retryable());
}

fn assert_unavailable(error: &StoreError, needle: &str) {
    match error {
        StoreError::Unavailable(message) => assert!(message.contains(needle), "{message:?} lacks {needle:?}"),
        other => panic!("expected Unavailable({needle}…), got {other:?}"),
    }
    assert!(error.is_retryable());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_after_drop_keeps_everything() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 10), own(&store, "run-1").await).await.unwrap();
    store.create_run(run("run-2", RunStatus::Finished, 20), own(&store, "run-2").await).await.unwrap();
    store.append_steps("run-1", 1, vec![step("a"), step("b"), step("c")]).await.unwrap();
    store
        .finish_step("run-1", 1, 0, StepOutcome::Finished(kuralle::JsonText::from(json!({"ok": "✓ déjà vu"}))), 11)
        .await
        .unwrap();
    store
        .finish_step("run-1", 1, 1, StepOutcome::Failed(kuralle::JsonText::from(json!({"kind": "timeout"}))), 12)
        .await
        .unwrap();
    let mut updated = store.get_run("run-1").await.unwrap().unwrap();
    updated.state = json!({"turn": 2}).into();
    updated.status = RunStatus::Paused;
    updated.updated_at_ms = 30;
    store.put_run(updated, 1).await.unwrap();

    let run_1 = store.get_run("run-1").await.unwrap();
    let run_2 = store.get_run("run-2").await.unwrap();
    let steps = store.steps("run-1").await.unwrap();
    let list = store.list_runs(RunFilter::default()).await.unwrap();
    drop(store);

    // Another process sees the committed rows.
    let counted = python(
        &path,
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
         print(c.execute('select count(*) from steps').fetchone()[0], \
               c.execute(\"select status from steps where ordinal = 1\").fetchone()[0])",
    );
    assert_eq!(counted.trim(), "3 failed");

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.get_run("run-1").await.unwrap(), run_1);
    assert_eq!(store.get_run("run-2").await.unwrap(), run_2);
    assert_eq!(store.steps("run-1").await.unwrap(), steps);
    assert_eq!(store.list_runs(RunFilter::default()).await.unwrap(), list);
    assert_eq!(run_1.unwrap().version, 1);
    assert_eq!(steps[2].status, StepStatus::Running);
    // The ordinal counter survived too.
    assert_eq!(store.append_steps("run-1", 1, vec![step("d")]).await.unwrap(), [3]);
}

#[test]
fn a_file_that_is_not_sqlite_is_corrupt_at_open() {
    let (dir, _) = db_path();
    let noise = dir.path().join("noise.db");
    // Deterministic pseudo-random bytes.
    let mut x: u32 = 0x2545_f491;
    let bytes: Vec<u8> = (0..8192)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    std::fs::write(&noise, bytes).unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "These are my notes, not a database.\n".repeat(200)).unwrap();

    for path in [noise, text] {
        let error = SqliteStore::open(&path).unwrap_err();
        let StoreError::Corrupt(message) = &error else { panic!("expected Corrupt, got {error:?}") };
        assert!(message.contains("not a SQLite database"), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(!error.is_retryable());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_with_other_tables_gets_our_schema_added() {
    let (_dir, path) = db_path();
    python(
        &path,
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
         c.execute('create table notes (body text)'); c.execute(\"insert into notes values ('keep me')\"); c.commit()",
    );
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), own(&store, "run-1").await).await.unwrap();
    assert_eq!(store.append_steps("run-1", 1, vec![step("a")]).await.unwrap(), [0]);
    drop(store);
    let notes = python(
        &path,
        "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('select body from notes').fetchone()[0])",
    );
    assert_eq!(notes.trim(), "keep me");
    assert!(SqliteStore::open(&path).is_ok(), "reopening finds the schema");
}

#[test]
fn foreign_runs_table_and_newer_schema_are_clear_errors() {
    let (dir, foreign) = db_path();
    python(
        &foreign,
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('create table runs (id integer)'); c.commit()",
    );
    let error = SqliteStore::open(&foreign).unwrap_err();
    let StoreError::Corrupt(message) = &error else { panic!("expected Corrupt, got {error:?}") };
    assert!(message.contains("`runs`") && message.contains("not kuralle's"), "{message}");

    let newer = dir.path().join("newer.db");
    drop(SqliteStore::open(&newer).unwrap());
    python(
        &newer,
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('update kuralle_schema set version = 99'); c.commit()",
    );
    let error = SqliteStore::open(&newer).unwrap_err();
    let StoreError::Corrupt(message) = &error else { panic!("expected Corrupt, got {error:?}") };
    assert!(message.contains("version 99") && message.contains("upgrade kuralle"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_another_process_gives_unavailable_after_busy_timeout() {
    let (_dir, path) = db_path();
    let options = SqliteOptions { busy_timeout: Duration::from_millis(300), ..SqliteOptions::default() };
    let store = SqliteStore::open_with(&path, options).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), own(&store, "run-1").await).await.unwrap();

    let mut holder = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys, time\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('BEGIN EXCLUSIVE')\n\
             print('locked', flush=True)\n\
             sys.stdin.readline()\n\
             c.execute('COMMIT')\n",
        )
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");

    // The holder keeps the lock until told to let go, so the write can only end by giving up
    // after `busy_timeout` (how long that takes is SQLite's business, not timed here).
    let error = store.append_steps("run-1", 1, vec![step("a")]).await.unwrap_err();
    assert_unavailable(&error, "locked by another process");
    assert!(error.to_string().contains("300 ms"), "{error}");
    // WAL readers are not blocked by the writer lock.
    assert!(store.get_run("run-1").await.unwrap().is_some());

    holder.stdin.take().unwrap().write_all(b"release\n").unwrap();
    assert!(holder.wait().unwrap().success());
    // Once the lock is gone the same write succeeds, and the failed attempt used no ordinal.
    assert_eq!(store.append_steps("run-1", 1, vec![step("a")]).await.unwrap(), [0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_retryable_storage_full_and_loses_nothing_acknowledged() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), own(&store, "run-1").await).await.unwrap();
    drop(store);

    // A size limit below the current size holds the file at its current size: it cannot grow.
    let options = SqliteOptions { max_size_bytes: Some(1), ..SqliteOptions::default() };
    let store = SqliteStore::open_with(&path, options).unwrap();
    let mut acknowledged = Vec::new();
    let mut full = None;
    for i in 0..200 {
        let key = format!("{i:04}-{}", "k".repeat(1500));
        match store.append_steps("run-1", 1, vec![step(&key)]).await {
            Ok(ordinals) => acknowledged.push((ordinals[0], key)),
            Err(error) => {
                full = Some(error);
                break;
            }
        }
    }
    let error = full.expect("the capped database fills up");
    assert_full(&error);
    // A large result cannot be written either; the step stays running.
    let big = json!("r".repeat(64 * 1024));
    if let Some((ordinal, _)) = acknowledged.first() {
        let error = store
            .finish_step("run-1", 1, *ordinal, StepOutcome::Finished(kuralle::JsonText::from(big.clone())), 2)
            .await
            .unwrap_err();
        assert_full(&error);
    }
    // Reads still work, and show exactly the acknowledged writes.
    let steps = store.steps("run-1").await.unwrap();
    let keys: Vec<(u64, String)> = steps.iter().map(|s| (s.ordinal, s.key.clone())).collect();
    assert_eq!(keys, acknowledged);
    drop(store);

    // Space "freed": reopen without the cap. Everything acknowledged is there, writes work.
    let store = SqliteStore::open(&path).unwrap();
    let keys: Vec<(u64, String)> =
        store.steps("run-1").await.unwrap().into_iter().map(|s| (s.ordinal, s.key)).collect();
    assert_eq!(keys, acknowledged);
    let next = acknowledged.len() as u64;
    assert_eq!(store.append_steps("run-1", 1, vec![step("after")]).await.unwrap(), [next]);
    store.finish_step("run-1", 1, next, StepOutcome::Finished(kuralle::JsonText::from(big.clone())), 3).await.unwrap();
    assert_eq!(
        store.steps("run-1").await.unwrap()[next as usize].result.as_ref().map(kuralle::JsonText::to_value),
        Some(big)
    );
}

/// Makes files immutable (`chattr +i`, which stops writes even for root) until dropped.
struct Immutable(Vec<PathBuf>);

impl Immutable {
    fn set(paths: Vec<PathBuf>) -> Option<Self> {
        let ok = Command::new("chattr").arg("+i").args(&paths).status().is_ok_and(|status| status.success());
        let guard = Self(paths);
        ok.then_some(guard)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").args(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_cannot_be_written_is_retryable_and_loses_nothing_acknowledged() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), own(&store, "run-1").await).await.unwrap();
    assert_eq!(store.append_steps("run-1", 1, vec![step("a")]).await.unwrap(), [0]);

    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let Some(guard) = Immutable::set(vec![path.clone(), wal]) else {
        eprintln!("skipped: `chattr +i` is not available here");
        return;
    };
    let error = store.append_steps("run-1", 1, vec![step("b")]).await.unwrap_err();
    assert_unavailable(&error, "I/O error");
    let error = store
        .finish_step("run-1", 1, 0, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 2)
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    drop(guard);

    // Writable again: the store keeps working and nothing acknowledged was lost.
    store.finish_step("run-1", 1, 0, StepOutcome::Finished(kuralle::JsonText::from(json!(1))), 3).await.unwrap();
    assert_eq!(store.append_steps("run-1", 1, vec![step("b")]).await.unwrap(), [1]);
    drop(store);
    let store = SqliteStore::open(&path).unwrap();
    let steps = store.steps("run-1").await.unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].result.as_ref().map(kuralle::JsonText::to_value), Some(json!(1)));
}

/// A session's later turns carry the conversation in the run's state. Journaling a call must
/// not write that state again: SQLite rewrites a whole row to change one column, and a counter
/// kept in the run's row made every append rewrite it (measured by what the WAL grows by, so
/// no clock is involved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journaling_a_call_does_not_rewrite_a_large_run_state() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    let fence = own(&store, "long").await;
    let mut record = run("long", RunStatus::Running, 1);
    let message = json!({"role": "user", "content": "x".repeat(1000)});
    record.state = json!({"transcript": vec![message; 1024]}).into();
    let state_len = record.state.len();
    store.create_run(record, fence).await.unwrap();
    let wal = path.with_extension("db-wal");
    let before = std::fs::metadata(&wal).unwrap().len();
    for i in 0..4 {
        let ordinals = store.append_steps("long", fence, vec![step(&format!("k{i}"))]).await.unwrap();
        assert_eq!(ordinals, [i]);
        store.finish_step("long", fence, ordinals[0], StepOutcome::Finished(json!(i).into()), 2).await.unwrap();
    }
    let grown = std::fs::metadata(&wal).unwrap().len() - before;
    // Eight commits of a few 4 KiB pages each, against 1 MiB of state per rewrite.
    assert!(grown < 256 * 1024, "the WAL grew by {grown} bytes for four journaled calls");
    assert_eq!(store.get_run("long").await.unwrap().unwrap().state.len(), state_len);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_commits() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), own(&store, "run-1").await).await.unwrap();

    let before = store.commit_count();
    let keys: Vec<String> = (0..64).map(|i| format!("call-{i}")).collect();
    let calls = keys.iter().map(|key| store.append_steps("run-1", 1, vec![step(key)]));
    let results = futures::future::join_all(calls).await;
    let commits = store.commit_count() - before;

    let mut ordinals: Vec<u64> = results.into_iter().map(|r| r.unwrap()[0]).collect();
    ordinals.sort_unstable();
    assert_eq!(ordinals, (0..64).collect::<Vec<_>>());
    assert!(commits <= 8, "64 concurrent appends took {commits} commits");
    eprintln!("64 concurrent appends: {commits} commits");

    // The same through spawned tasks on several threads.
    let store = std::sync::Arc::new(store);
    let before = store.commit_count();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.append_steps("run-1", 1, vec![step(&format!("task-{i}"))]).await.unwrap() })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let commits = store.commit_count() - before;
    assert!(commits < 64 / 2, "64 spawned appends took {commits} commits");
    eprintln!("64 spawned appends: {commits} commits");
    assert_eq!(store.steps("run-1").await.unwrap().len(), 128);
}

/// The journal's writes run without a savepoint of their own: the ones refused in a shared
/// commit (a duplicate key, also among a response's intents, a stale token, a lost
/// compare-and-swap, a finished step) fail alone, change nothing, and the batch's other writes
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_writes_in_a_shared_commit_fail_alone() {
    let (_dir, path) = db_path();
    let options = SqliteOptions { commit_delay: Duration::from_millis(300), ..SqliteOptions::default() };
    let store = std::sync::Arc::new(SqliteStore::open_with(&path, options).unwrap());
    let fence = own(&store, "run-1").await;
    let original = run("run-1", RunStatus::Running, 1);
    store.create_run(original.clone(), fence).await.unwrap();
    assert_eq!(store.append_steps("run-1", fence, vec![step("done")]).await.unwrap(), [0]);
    store.finish_step("run-1", fence, 0, StepOutcome::Finished(json!(0).into()), 2).await.unwrap();

    // The writer commits the first write alone, for 300 ms; the others queue behind it and
    // share the next commit.
    let before = store.commit_count();
    let first = tokio::spawn({
        let store = store.clone();
        async move { store.append_steps("run-1", fence, vec![step("x")]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut stale = original.clone();
    stale.version = 9;
    let response = |key: &str, intents: &[&str]| FinishedWithIntents {
        finished: step(key),
        outcome: StepOutcome::Finished(json!("response").into()),
        finished_at_ms: 3,
        intents: intents.iter().map(|key| step(key)).collect(),
    };
    let (a, b, duplicate, fenced, conflict, not_running, c) = tokio::join!(
        store.append_steps("run-1", fence, vec![step("a")]),
        store.append_steps("run-1", fence, vec![step("b")]),
        store.append_steps("run-1", fence, vec![step("a")]),
        store.append_steps("run-1", fence + 1, vec![step("f")]),
        store.put_run(stale.clone(), fence),
        store.finish_step("run-1", fence, 0, StepOutcome::Finished(json!(1).into()), 3),
        store.append_steps("run-1", fence, vec![step("c")]),
    );
    assert_eq!(store.commit_count() - before, 2, "the refused writes shared one commit with the others");
    // These share at most two commits (the writer may take the first alone).
    let before = store.commit_count();
    let (taken_intent, repeated_intent, taken_in_many, kept_lease, d) = tokio::join!(
        store.append_finished_with_intents("run-1", fence, response("m1", &["i1", "b"])),
        store.append_finished_with_intents("run-1", fence, response("m2", &["i2", "m2"])),
        store.append_steps("run-1", fence, vec![step("i3"), step("c")]),
        store.put_run_and_release(stale, fence),
        store.append_finished_with_intents("run-1", fence, response("m3", &["i4"])),
    );
    assert!(store.commit_count() - before <= 2);
    assert_eq!(first.await.unwrap().unwrap(), [1]);
    assert_eq!((a.unwrap(), b.unwrap(), c.unwrap()), (vec![2], vec![3], vec![4]));
    assert_eq!(duplicate.unwrap_err(), StoreError::DuplicateKey { run_id: "run-1".into(), key: "a".into() });
    assert_eq!(fenced.unwrap_err(), StoreError::Fenced { run_id: "run-1".into(), token: fence + 1 });
    assert_eq!(conflict.unwrap_err(), StoreError::VersionConflict { run_id: "run-1".into(), expected: 9, actual: 0 });
    assert_eq!(not_running.unwrap_err(), StoreError::StepNotRunning { run_id: "run-1".into(), ordinal: 0 });
    let duplicate = |key: &str| StoreError::DuplicateKey { run_id: "run-1".into(), key: key.into() };
    assert_eq!(taken_intent.unwrap_err(), duplicate("b"));
    assert_eq!(repeated_intent.unwrap_err(), duplicate("m2"));
    assert_eq!(taken_in_many.unwrap_err(), duplicate("c"));
    assert_eq!(kept_lease.unwrap_err(), StoreError::VersionConflict { run_id: "run-1".into(), expected: 9, actual: 0 });
    assert_eq!(d.unwrap(), [5, 6]);
    assert_eq!(store.current_lease("run-1").await.unwrap().map(|l| l.token), Some(fence));

    let steps = store.steps("run-1").await.unwrap();
    let keys: Vec<(u64, &str)> = steps.iter().map(|s| (s.ordinal, s.key.as_str())).collect();
    assert_eq!(keys, [(0, "done"), (1, "x"), (2, "a"), (3, "b"), (4, "c"), (5, "m3"), (6, "i4")]);
    assert_eq!(steps[0].result.as_ref().map(kuralle::JsonText::to_value), Some(json!(0)));
    assert_eq!(store.get_run("run-1").await.unwrap(), Some(original));
}

#[test]
fn dropping_the_last_clone_stops_the_writer_after_queued_writes() {
    let (_dir, path) = db_path();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let store = SqliteStore::open(&path).unwrap();
    let clone = store.clone();
    runtime.block_on(async {
        clone.create_run(run("run-1", RunStatus::Running, 1), own(&clone, "run-1").await).await.unwrap();
    });
    drop(store);
    // The clone still works: the writer runs until the last clone is gone.
    runtime.block_on(async {
        clone.append_steps("run-1", 1, vec![step("a")]).await.unwrap();
    });
    // Dropping the last clone joins the writer thread (a hang here is the failure).
    drop(clone);
    // The file is closed cleanly: no WAL left behind after the last connection closed.
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    assert!(!wal.exists() || std::fs::metadata(&wal).unwrap().len() == 0, "WAL was checkpointed at close");
    let store = SqliteStore::open(&path).unwrap();
    let run: Option<RunRecord> = runtime.block_on(store.get_run("run-1")).unwrap();
    assert!(run.is_some());
}

/// A store written by the schema-1 release (`tests/fixtures/v1-store.db`: a run whose charge
/// finished, whose lookup failed, and whose second model step was left running) opens, is
/// migrated in place, and its run resumes: finished and failed steps replay, nothing re-runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_from_the_previous_release_is_migrated_and_its_run_resumes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kuralle::testing::{ScriptedModel, Turn};
    use kuralle::{AgentDef, Runtime, StepKind};
    use kuralle_tests::FnTool;

    let (_dir, path) = db_path();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/v1-store.db"), &path).unwrap();
    let version = || {
        python(
            &path,
            "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('select version from kuralle_schema').fetchone()[0])",
        )
    };
    assert_eq!(version().trim(), "1", "the fixture is a schema-1 file");

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(version().trim(), "4", "opening migrated it");
    let before = store.steps("order-1").await.unwrap();
    let kinds: Vec<(StepKind, StepStatus)> = before.iter().map(|s| (s.kind, s.status)).collect();
    assert_eq!(
        kinds,
        [
            (StepKind::Model, StepStatus::Finished),
            (StepKind::Tool, StepStatus::Finished),
            (StepKind::Tool, StepStatus::Failed),
            (StepKind::Model, StepStatus::Running),
        ]
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let counted = |name: &str| {
        let runs = runs.clone();
        FnTool::new(name, move |_, _| {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok(json!("ran again")) }
        })
    };
    let model = ScriptedModel::new([Turn::text("Paid; the order was not found.")]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(counted("charge")).tool(counted("lookup")))
        .model(model.clone())
        .store(store.clone())
        .build()
        .unwrap();
    let out = runtime.resume("order-1").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(out.text, "Paid; the order was not found.");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "finished and failed steps replay");
    let transcript = serde_json::to_string(&model.requests()[0].messages).unwrap();
    assert!(transcript.contains("no such order"), "the failed lookup replays its typed error: {transcript}");
    let after = store.steps("order-1").await.unwrap();
    assert_eq!(after.len(), 4);
    assert!(after.iter().all(|s| s.status != StepStatus::Running));
    assert_eq!(store.current_lease("order-1").await.unwrap(), None, "the turn gave its lease back");
    drop(store);
    assert_eq!(version().trim(), "4");
    assert!(SqliteStore::open(&path).is_ok(), "a migrated store reopens");
}

/// A run that cannot be read (its state is not JSON) fails `acquire_lease_and_get_run` with
/// `Corrupt`, and the lease the same job took is given back: the run is not left busy for a
/// lease's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_unreadable_under_its_new_lease_gives_the_lease_back() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-1", RunStatus::Running, 1), own(&store, "run-1").await).await.unwrap();
    store.release_lease(&store.current_lease("run-1").await.unwrap().unwrap()).await.unwrap();
    python(
        &path,
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
         c.execute(\"update runs set state = 'not json' where run_id = 'run-1'\"); c.commit()",
    );
    let error = store.acquire_lease_and_get_run("run-1", "b", Duration::from_secs(3600)).await.unwrap_err();
    assert!(matches!(&error, StoreError::Corrupt(m) if m.contains("runs.state")), "{error:?}");
    assert_eq!(store.current_lease("run-1").await.unwrap(), None, "the lease went back");
    let again = store.acquire_lease("run-1", "c", Duration::from_secs(3600)).await.unwrap();
    assert_eq!(again.token, 3, "taken and given back once in between");
}

/// A one-call run is four commits: its lease with its row, the response with the call's
/// intent, the call's outcome, and its answer with the run's end. The answer's model response
/// is journaled in the write that closes the run, and the lease is given up in it. A run its
/// caller names and one whose id the runtime makes cost the same (the caller's was five, its
/// lease and its row two, before 09dc0e3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_call_run_is_four_commits_and_its_answer_lands_with_its_end() {
    use kuralle::testing::{ScriptedModel, Turn};
    use kuralle::{AgentDef, RunRequest, Runtime, StepKind};
    use kuralle_tests::FnTool;

    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    let call = || Turn::tool_calls([("c1", "charge", r#"{"amount":1}"#)]);
    let model =
        ScriptedModel::new([call(), Turn::text("Paid."), call(), Turn::text("Paid."), call(), Turn::text("Paid.")]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(FnTool::new("charge", |_, _| async { Ok(json!("ok")) })))
        .model(model)
        .store(store.clone())
        .build()
        .unwrap();
    let before = store.commit_count();
    let out = runtime.run(RunRequest::new("pay").run_id("r")).await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
    assert_eq!(store.commit_count() - before, 4);
    let journal: Vec<(StepKind, StepStatus)> =
        store.steps("r").await.unwrap().iter().map(|s| (s.kind, s.status)).collect();
    assert_eq!(
        journal,
        [
            (StepKind::Model, StepStatus::Finished),
            (StepKind::Tool, StepStatus::Finished),
            (StepKind::Model, StepStatus::Finished)
        ]
    );
    let answer = store.steps("r").await.unwrap().pop().unwrap();
    assert!(answer.result.unwrap().as_str().contains("Paid."), "the answer is journaled");
    assert_eq!(store.get_run("r").await.unwrap().unwrap().status, RunStatus::Finished);
    assert_eq!(store.current_lease("r").await.unwrap(), None, "the closing write gave the lease up");

    // A run id the runtime makes: the lease request creates the run, as for the caller's.
    let before = store.commit_count();
    let out = runtime.run(RunRequest::new("pay again")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(store.commit_count() - before, 4);
    let run = store.get_run(&out.run_id).await.unwrap().unwrap();
    assert_eq!((run.status, run.agent_id.as_str()), (RunStatus::Finished, "shop"));
    assert_eq!(store.steps(&out.run_id).await.unwrap().len(), 3);

    // The caller's run's next turn finds it there: its lease and the read are one commit, as
    // they were before a caller's run started with the create request, and the new turn's
    // start is written to the run's row (five in all); no run key is taken (an insert that
    // conflicted took one, and rewrote the key counter on the writer).
    let keys = || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let seq: i64 =
            conn.query_row("SELECT seq FROM sqlite_sequence WHERE name = 'runs'", [], |row| row.get(0)).unwrap();
        seq
    };
    let (before, keys_before) = (store.commit_count(), keys());
    let out = runtime.run(RunRequest::new("pay once more").run_id("r")).await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
    assert_eq!(store.commit_count() - before, 5);
    assert_eq!(keys(), keys_before, "no key taken by a run that was there");
    assert_eq!(store.steps("r").await.unwrap().len(), 6, "the second turn's steps follow the first's");
}

/// An outcome SQLite refuses (larger than the store takes): its write is queued when the call
/// ends and the run goes on to ask the model (unless the writer answered before the run went
/// on, which a busy machine allows); either way the model's answer is not journaled, and the
/// run is marked failed (a limit is not an outage) in spite of the outcome it lost.
/// `journal.rs`'s `a_run_ended_by_a_lost_outcome_is_marked_failed` makes the same case
/// deterministic.
#[tokio::test]
async fn an_outcome_too_large_for_sqlite_fails_the_run() {
    use kuralle::testing::{ScriptedModel, Turn};
    let (_dir, path) = db_path();
    let options = SqliteOptions { max_value_bytes: 2_048, ..Default::default() };
    let store = std::sync::Arc::new(SqliteStore::open_with(&path, options).unwrap());
    assert!(store.finishes_without_polling());
    let big = kuralle_tests::FnTool::new("big", |_, _| async { Ok(json!("x".repeat(4_096))) });
    let model = ScriptedModel::by_transcript([Turn::tool_calls([("1", "big", "{}")]), Turn::text("Done.")]);
    let runtime = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("a", "x").tool(big))
        .model(model.clone())
        .store_arc(store.clone())
        .build()
        .unwrap();
    let err = runtime.run(kuralle::RunRequest::new("go").run_id("r")).await.unwrap_err();
    assert!(matches!(err, kuralle::RunError::Store(StoreError::LimitExceeded(_))), "{err:?}");
    assert!(model.requests().len() <= 2);
    let steps = store.steps("r").await.unwrap();
    let journaled: Vec<_> = steps.iter().map(|s| (s.name.as_str(), s.status)).collect();
    assert_eq!(journaled, [("model", StepStatus::Finished), ("big", StepStatus::Running)]);
    assert_eq!(store.get_run("r").await.unwrap().unwrap().status, RunStatus::Failed);
}

/// A run's row deleted behind kuralle's back (the `sqlite3` shell does not enforce the
/// journal's foreign key) leaves its steps behind, and no later run reads them as its own:
/// a run's key in the file is never handed out again, even the last one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_deleted_behind_the_stores_back_leaves_its_steps_to_no_other_run() {
    let (_dir, path) = db_path();
    let store = SqliteStore::open(&path).unwrap();
    store.create_run(run("run-a", RunStatus::Running, 1), own(&store, "run-a").await).await.unwrap();
    store.append_steps("run-a", 1, vec![step("secret-of-a"), step("more-of-a")]).await.unwrap();
    // As the `sqlite3` shell does by default (rusqlite's bundled SQLite enforces foreign keys).
    let shell = rusqlite::Connection::open(&path).unwrap();
    shell.pragma_update(None, "foreign_keys", "OFF").unwrap();
    let deleted = shell.execute("DELETE FROM runs WHERE run_id = 'run-a'", []).unwrap();
    let left: i64 = shell.query_row("SELECT count(*) FROM steps", [], |row| row.get(0)).unwrap();
    assert_eq!(left, 2, "the steps are left behind");
    assert_eq!(deleted, 1);

    store.create_run(run("run-b", RunStatus::Running, 2), own(&store, "run-b").await).await.unwrap();
    assert_eq!(store.steps("run-b").await.unwrap(), [], "the new run's journal is its own");
    assert_eq!(store.append_steps("run-b", 1, vec![step("secret-of-a")]).await.unwrap(), [0]);
    store.finish_step("run-b", 1, 0, StepOutcome::Finished(kuralle::JsonText::from(json!("b"))), 3).await.unwrap();
    let steps = store.steps("run-b").await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!((steps[0].key.as_str(), steps[0].status), ("secret-of-a", StepStatus::Finished));
    assert_eq!(store.steps("run-a").await.unwrap(), [], "a run that is gone reads no journal");

    // The last run deleted through the store, then another made: its key is new too, and
    // the writer's knowledge of the deleted run is gone with it.
    assert!(store.delete_run("run-b").await.unwrap());
    store.create_run(run("run-c", RunStatus::Running, 4), own(&store, "run-c").await).await.unwrap();
    assert_eq!(store.append_steps("run-c", 1, vec![step("c")]).await.unwrap(), [0]);
    store.finish_step("run-c", 1, 0, StepOutcome::Finished(kuralle::JsonText::from(json!("c"))), 5).await.unwrap();
    let keys: Vec<String> = store.steps("run-c").await.unwrap().into_iter().map(|step| step.key).collect();
    assert_eq!(keys, ["c"]);
    let run_keys: Vec<i64> = rusqlite::Connection::open(&path)
        .unwrap()
        .prepare("SELECT run_key FROM runs")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(run_keys, [3], "keys 1 and 2 are not handed out again");
}
