//! Instance ids: a process restarted with its predecessor's instance id takes the runs that
//! process held back at once (with proof that it is gone, never by waiting for their one-hour
//! leases), a second live process with one id is refused, nothing is taken without proof, and
//! `resume` can wait for a lease. Real processes: `src/bin/instance_child.rs`.

use std::{
    collections::HashMap,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use kuralle::{
    AgentDef, ResumeRequest, RunError, RunRequest, RunStatus, RunStore, Runtime, StepStatus,
    stores::{MemoryStore, SqliteStore},
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::{FnTool, lines_of};
use serde_json::{Value, json};
use tokio::sync::Notify;

const HOUR: Duration = Duration::from_secs(3600);

/// An id no other test (here or in another process sharing the PostgreSQL server) uses.
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn child(store: &str, instance: &str, run_id: &str, effects: &Path, mode: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_instance_child"));
    cmd.env("STORE", store)
        .env("INSTANCE_ID", instance)
        .env("RUN_ID", run_id)
        .env("EFFECTS", effects)
        .env("MODE", mode)
        .env_remove("BLOCK")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// The first line that is `mark` or JSON (an error), within a minute.
fn wait_for(lines: &mpsc::Receiver<String>, mark: &str) -> Result<(), Value> {
    loop {
        let line = lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no `{mark}` in time"));
        if line == mark {
            return Ok(());
        }
        if line.starts_with('{') {
            return Err(serde_json::from_str(&line).unwrap());
        }
    }
}

/// Runs a child to its end (within a minute); its last stdout line as JSON.
fn finish(mut proc: Child) -> Value {
    let lines = lines_of(&mut proc);
    let mut last = None;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) {
        last = Some(line);
    }
    let status = proc.wait().unwrap();
    assert!(status.success(), "child failed: {status:?}");
    serde_json::from_str(&last.expect("an output line")).expect("JSON output")
}

fn effects(path: &Path) -> HashMap<String, usize> {
    let mut map = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        *map.entry(line.split('\t').next().unwrap().to_owned()).or_insert(0) += 1;
    }
    map
}

/// The restart: a child runs `run_id` until its second tool blocks, is SIGKILLed holding a
/// one-hour lease, and a second child with the same instance id recovers it to the end.
async fn killed_then_recovered(spec: &str, store: &dyn RunStore) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    let instance = unique("app-1");
    let run_id = unique("order");

    let mut first = child(spec, &instance, &run_id, &log, "run").env("BLOCK", "1").spawn().unwrap();
    let lines = lines_of(&mut first);
    wait_for(&lines, "MARK blocked").expect("the first process reaches the blocking step");
    first.kill().unwrap(); // SIGKILL: no destructors, nothing released
    first.wait().unwrap();

    let lease = store.current_lease(&run_id).await.unwrap().expect("the killed process still holds the run");
    assert!(lease.owner.starts_with(&format!("{instance}/")), "{lease:?}");
    let left_ms = lease.expires_at_ms - kuralle_now_ms();
    assert!(left_ms > 3_000_000, "the lease has most of an hour to go ({left_ms} ms)");

    let out = finish(child(spec, &instance, &run_id, &log, "recover").spawn().unwrap());
    assert_eq!(out["taken_back"], json!([run_id]), "{out}");
    assert_eq!(out["resumed"], json!([{"run_id": run_id, "status": "finished", "text": "Done."}]), "{out}");

    // The journal's semantics: the finished step is replayed, the step in flight runs again.
    let ran = effects(&log);
    assert_eq!(ran.get("step_one"), Some(&1), "a finished step is not re-run: {ran:?}");
    assert_eq!(ran.get("block"), Some(&2), "the step in flight when the process died runs again: {ran:?}");
    let steps = store.steps(&run_id).await.unwrap();
    assert!(steps.iter().all(|s| s.status != StepStatus::Running), "{steps:#?}");
    assert_eq!(store.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Finished);
    assert_eq!(store.current_lease(&run_id).await.unwrap(), None, "released at the end of the turn");
}

fn kuralle_now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sqlite_process_recovers_its_runs_without_waiting_for_their_leases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let store = SqliteStore::open(&db).unwrap();
    killed_then_recovered(&format!("sqlite:{}", db.display()), &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_postgres_process_recovers_its_runs_without_waiting_for_their_leases() {
    let Some((store, guard)) = kuralle_tests::postgres::store("instance restart").await else { return };
    killed_then_recovered(&format!("postgres:{}", guard.schema), &store).await;
}

/// Two live processes with one instance id: the second is refused with the typed error, and
/// once the first dies the id is free at once.
fn second_live_process_is_refused(spec: &str) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("effects.log");
    let instance = unique("app-1");
    let hold = || child(spec, &instance, "unused", &log, "hold").spawn().unwrap();

    let mut first = hold();
    let first_lines = lines_of(&mut first);
    wait_for(&first_lines, "MARK claimed").expect("the first process claims the id");
    let mut second = hold();
    let second_lines = lines_of(&mut second);
    let refused = wait_for(&second_lines, "MARK claimed").expect_err("the second process must be refused");
    assert_eq!(refused["error"], "instance_in_use", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains(&instance) && message.contains("another live process"), "{message}");
    assert!(second.wait().unwrap().success());

    first.kill().unwrap();
    first.wait().unwrap();
    let mut third = hold();
    let third_lines = lines_of(&mut third);
    wait_for(&third_lines, "MARK claimed").expect("the id is free once its holder died");
    third.kill().unwrap();
    third.wait().unwrap();
}

#[test]
fn a_second_live_sqlite_process_with_the_same_instance_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    drop(SqliteStore::open(&db).unwrap());
    second_live_process_is_refused(&format!("sqlite:{}", db.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_postgres_process_with_the_same_instance_id_is_refused() {
    let Some((_store, guard)) = kuralle_tests::postgres::store("instance refusal").await else { return };
    let spec = format!("postgres:{}", guard.schema);
    tokio::task::spawn_blocking(move || second_live_process_is_refused(&spec)).await.unwrap();
}

/// A tool that counts executions and waits for `gate` (cancellably).
fn gated(count: &Arc<AtomicUsize>, gate: &Arc<Notify>) -> FnTool {
    let (count, gate) = (count.clone(), gate.clone());
    FnTool::new("charge", move |_, ctx| {
        let (count, gate) = (count.clone(), gate.clone());
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = gate.notified() => Ok(json!("charged")),
                () = ctx.cancellation().cancelled() => Err(kuralle::ToolError::Cancelled { tool: "charge".into() }),
            }
        }
    })
}

fn builder(store: Arc<dyn RunStore>, tool: FnTool) -> kuralle::RuntimeBuilder {
    Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(tool))
        .model(ScriptedModel::by_transcript([Turn::tool_calls([("c1", "charge", "{}")]), Turn::text("Paid.")]))
        .store_arc(store)
        .lease_ttl(HOUR)
}

/// Waits until `run_id`'s tool started (its lease is held and the count moved).
async fn until_running(count: &AtomicUsize, n: usize) {
    for _ in 0..5_000 {
        if count.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the tool never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_proof_that_the_holder_is_gone_nothing_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("runs.db");
    let open = || -> Arc<dyn RunStore> { Arc::new(SqliteStore::open(&db).unwrap()) };
    let (count, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));

    // A live runtime of another instance, and a live runtime without an instance id, each in
    // the middle of a turn (their leases have an hour to go).
    let other = builder(open(), gated(&count, &gate)).instance_id("app-2").build().unwrap();
    let plain = builder(open(), gated(&count, &gate)).build().unwrap();
    let other_run = other.run(RunRequest::new("pay").run_id("r-other"));
    let plain_run = plain.run(RunRequest::new("pay").run_id("r-plain"));
    until_running(&count, 2).await;
    // A dead process's lease under a name that merely starts like ours.
    let store = open();
    store.acquire_lease("r-lookalike", "app-10/4d2c", HOUR).await.unwrap();

    let me = builder(open(), gated(&count, &gate)).instance_id("app-1").build().unwrap();
    let recovered = me.recover().await.unwrap();
    assert!(recovered.taken_back.is_empty() && recovered.resumed.is_empty(), "{recovered:?}");
    for run_id in ["r-other", "r-plain", "r-lookalike"] {
        let err = me.resume(run_id).await.unwrap_err();
        assert!(matches!(err, RunError::Busy { .. }), "{run_id}: {err}");
    }
    // The live instance keeps its id: a second runtime with it is refused.
    let twin = builder(open(), gated(&count, &gate)).instance_id("app-2").build().unwrap();
    let err = twin.resume("r-other").await.unwrap_err();
    assert!(matches!(&err, RunError::InstanceInUse { instance_id, .. } if instance_id == "app-2"), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 2, "nothing ran twice");

    gate.notify_waiters();
    assert_eq!(other_run.await.unwrap().text, "Paid.");
    assert_eq!(plain_run.await.unwrap().text, "Paid.");
}

#[tokio::test(start_paused = true)]
async fn resume_with_a_lease_wait_runs_once_the_holder_lets_go() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let (count, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let holder = builder(Arc::clone(&store), gated(&count, &gate)).build().unwrap();
    let waiter = builder(Arc::clone(&store), gated(&count, &gate)).build().unwrap();
    let held = holder.run(RunRequest::new("pay").run_id("r"));
    until_running(&count, 1).await;

    let err = waiter.resume("r").await.unwrap_err();
    assert!(matches!(err, RunError::Busy { .. }), "without a wait: at once, {err}");
    let waiting = waiter.resume(ResumeRequest::new("r").wait_for_lease(Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_secs(5)).await;
    gate.notify_waiters();
    assert_eq!(held.await.unwrap().text, "Paid.");
    let out = waiting.await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
    assert_eq!(count.load(Ordering::SeqCst), 1, "the waiter got the finished run's output; nothing ran again");

    // A wait that runs out is `Busy` too.
    let held = holder.run(RunRequest::new("again").run_id("r2"));
    until_running(&count, 2).await;
    let err = waiter.resume(ResumeRequest::new("r2").wait_for_lease(Duration::from_secs(2))).await.unwrap_err();
    assert!(matches!(err, RunError::Busy { .. }), "{err}");
    gate.notify_waiters();
    held.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_postgres_lock_session_stops_the_holders_turns_and_it_claims_the_id_back() {
    let Some((store, guard)) = kuralle_tests::postgres::store("instance lock loss").await else { return };
    let store: Arc<dyn RunStore> = Arc::new(store);
    let (count, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let instance = unique("app-1");
    let runtime = builder(Arc::clone(&store), gated(&count, &gate)).instance_id(&*instance).build().unwrap();
    let turn = runtime.run(RunRequest::new("pay").run_id("r"));
    until_running(&count, 1).await;

    // An operator (or a failover) ends the lock's session.
    let admin = kuralle_tests::postgres::connect(&guard.url).await.unwrap();
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&format!("kuralle instance {instance}")],
        )
        .await
        .unwrap();
    assert_eq!(killed.len(), 1, "one lock session");

    let err = tokio::time::timeout(Duration::from_secs(30), turn).await.expect("the turn stops").unwrap_err();
    assert!(matches!(err, RunError::LeaseLost { .. }), "{err}");
    // The runtime claims the id back by itself (taking back the run it stopped), so the run
    // resumes at once; the stopped call runs again.
    let out = tokio::time::timeout(Duration::from_secs(30), async {
        let resumed = runtime.resume(ResumeRequest::new("r").wait_for_lease(Duration::from_secs(20)));
        until_running(&count, 2).await;
        gate.notify_waiters();
        resumed.await
    })
    .await
    .expect("resumed in time")
    .unwrap();
    assert_eq!(out.text, "Paid.");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}
