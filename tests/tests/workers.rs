//! The durable work queue in one process: `submit` records, `serve` claims and drives,
//! orphans are recovered after their lease expires, a decision makes a paused run runnable
//! for any worker, and shutdown hands in-flight turns back. Multi-process and PostgreSQL
//! cases are in `worker_processes.rs`.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};
use std::time::Duration;

use kuralle::stores::MemoryStore;
use kuralle::{
    AgentDef, Decision, RunError, RunRequest, RunStatus, RunStore, Runtime, WorkerOptions,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::serving::Serving;
use kuralle_tests::{FnTool, Probe};
use serde_json::json;

fn counting_tool(name: &str, count: &Arc<AtomicUsize>) -> FnTool {
    let count = count.clone();
    FnTool::new(name, move |args, _| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"paid": args["amount"]}))
        }
    })
}

fn runtime(store: Arc<dyn RunStore>, tool: FnTool) -> Runtime {
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", tool_name(&tool), r#"{"amount":5}"#)]),
        Turn::text("Paid."),
    ]);
    Runtime::builder()
        .agent(AgentDef::new("shop", "x").tool(tool))
        .model(model)
        .store_arc(store)
        .lease_ttl(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// [`runtime`] on a `FlakyStore` over a `MemoryStore`: the runtime, the wrapper (to fail
/// writes) and the memory store behind it (to read what landed).
fn flaky_runtime(tool: FnTool) -> (Runtime, kuralle_tests::FlakyStore, Arc<dyn RunStore>) {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = kuralle_tests::FlakyStore::new(Arc::clone(&memory));
    (runtime(Arc::new(flaky.clone()), tool), flaky, memory)
}

fn tool_name(tool: &FnTool) -> String {
    use kuralle::Tool;
    tool.name().to_owned()
}

fn fast() -> WorkerOptions {
    WorkerOptions { max_concurrent_runs: 4, poll_interval: Duration::from_millis(20), ..WorkerOptions::default() }
}

async fn wait_for(runtime: &Runtime, run_id: &str, status: RunStatus) {
    loop {
        if runtime.get_run(run_id).await.unwrap().map(|r| r.status) == Some(status) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// 20 submitted runs, one worker with 4 slots: every run finishes once, each payment once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitted_runs_are_served() {
    let count = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone(), counting_tool("pay", &count));
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(rt.submit(RunRequest::new(format!("order {i}"))).await.unwrap());
    }
    assert_eq!(count.load(Ordering::SeqCst), 0, "submit runs nothing");
    for id in &ids {
        assert_eq!(rt.get_run(id).await.unwrap().unwrap().status, RunStatus::Running);
        assert_eq!(store.current_lease(id).await.unwrap(), None, "a submitted run holds no lease");
    }
    let serving = Serving::start(&rt, fast());
    for id in &ids {
        wait_for(&rt, id, RunStatus::Finished).await;
    }
    let report = serving.stop().await;
    assert_eq!((report.claimed, report.completed, report.handed_back), (20, 20, 0), "{report:?}");
    assert_eq!(count.load(Ordering::SeqCst), 20);
    // A second submit with the same idempotency key changes nothing.
    let again = rt.submit(RunRequest::new("order 0").run_id(&ids[0]).idempotency_key("k")).await.unwrap();
    assert_eq!(again, ids[0]);
}

/// A run whose owner died mid-turn (its lease is never renewed or released) is claimed once
/// the lease expires and resumed from the journal: the finished payment is not made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_recovered_after_their_lease_expires() {
    let count = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone(), counting_tool("pay", &count));
    // A turn that journals the payment and then dies before the model's answer: a model
    // that fails after the tool step leaves the run running, and the lease we take after it
    // stands for the dead owner's.
    let dying = Runtime::builder()
        .agent(AgentDef::new("shop", "x").tool(counting_tool("pay", &count)))
        .model(ScriptedModel::new([Turn::tool_calls([("c1", "pay", r#"{"amount":5}"#)]), Turn::error("died")]))
        .store_arc(store.clone())
        .build()
        .unwrap();
    let err = dying.run(RunRequest::new("order").run_id("orphan")).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let dead = store.acquire_lease("orphan", "dead-process/turn", Duration::from_millis(300)).await.unwrap();

    let serving = Serving::start(&rt, fast());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rt.get_run("orphan").await.unwrap().unwrap().status, RunStatus::Running, "the lease is live");
    wait_for(&rt, "orphan", RunStatus::Finished).await;
    let report = serving.stop().await;
    assert_eq!(report.claimed, 1);
    assert_eq!(count.load(Ordering::SeqCst), 1, "the finished payment replayed from the journal");
    let err = store.append_steps("orphan", dead.token, vec![kuralle_tests::conformance::step("late")]).await;
    assert!(matches!(err, Err(kuralle::StoreError::Fenced { .. })), "the dead owner is fenced: {err:?}");
}

/// A paused run becomes runnable when a decision is recorded (from any process, without
/// resuming): a worker picks it up and the approved call runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_decision_makes_a_paused_run_runnable() {
    decision_makes_runnable(Arc::new(MemoryStore::new())).await;
}

/// The same on PostgreSQL (`DATABASE_URL`; skipped without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_decision_makes_a_paused_run_runnable_on_postgres() {
    let Some((store, _guard)) = kuralle_tests::postgres::store("decision on postgres").await else { return };
    decision_makes_runnable(Arc::new(store)).await;
}

async fn decision_makes_runnable(store: Arc<dyn RunStore>) {
    let count = Arc::new(AtomicUsize::new(0));
    let rt = runtime(store.clone(), counting_tool("pay", &count).needs_approval());
    let run_id = rt.submit(RunRequest::new("order").run_id("needs-ok")).await.unwrap();
    let serving = Serving::start(&rt, fast());
    wait_for(&rt, &run_id, RunStatus::Paused).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Paused, "a paused run is not claimed");
    assert_eq!(count.load(Ordering::SeqCst), 0);

    kuralle::record_decision(store.as_ref(), &run_id, &Decision::approve("alice")).await.unwrap();
    wait_for(&rt, &run_id, RunStatus::Finished).await;
    let report = serving.stop().await;
    assert_eq!(report.claimed, 2, "claimed once to pause, once after the decision");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// Shutdown with a turn stuck in a tool: after the grace period the turn is stopped and
/// handed back (lease released at once), and another worker finishes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_in_flight_turns() {
    let started = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let calls = started.clone();
    let slow = FnTool::new("pay", move |_, _| {
        let calls = calls.clone();
        async move {
            // The first execution hangs (the worker is shut down under it); the re-run after
            // the hand-back returns.
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            Ok(json!({"paid": 5}))
        }
    });
    let rt = runtime(store.clone(), slow);
    let run_id = rt.submit("order").await.unwrap();
    let serving = Serving::start(&rt, WorkerOptions { shutdown_grace: Duration::from_millis(50), ..fast() });
    while started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = serving.stop().await;
    assert_eq!((report.claimed, report.handed_back, report.completed), (1, 1, 0));
    assert_eq!(store.current_lease(&run_id).await.unwrap(), None, "handed back: no lease to wait out");
    assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Running);

    let report = rt.serve_with(wait_then_stop(&rt, &run_id), fast()).await.unwrap();
    assert_eq!(report.claimed, 1);
    assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Finished);
    assert_eq!(started.load(Ordering::SeqCst), 2, "the cut-off call re-ran once (at-least-once)");
}

/// Shutdown under a parallel batch whose calls run in tasks of their own: when `serve`
/// returns, no call of the handed-back turn is still running (before, the turn was aborted and
/// its call tasks ran on, detached, after the lease was released and another worker could
/// claim the run and run them again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_leaves_no_call_running_behind_the_lease() {
    let probe = Probe::default();
    let calls = probe.clone();
    let slow = FnTool::new("fetch", move |args, _| {
        let calls = calls.clone();
        async move {
            let _running = calls.enter(args["page"].as_str().unwrap_or("?"));
            // Long enough to outlive the grace; cancellation reaches it at an await.
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(json!("fetched"))
        }
    })
    .parallel();
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "fetch", r#"{"page":"a"}"#), ("c2", "fetch", r#"{"page":"b"}"#)]),
        Turn::text("Fetched."),
    ]);
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let rt = Runtime::builder()
        .agent(AgentDef::new("shop", "x").tool(slow))
        .model(model)
        .store_arc(store.clone())
        .build()
        .unwrap();
    let run_id = rt.submit("fetch both").await.unwrap();
    let serving = Serving::start(&rt, WorkerOptions { shutdown_grace: Duration::from_millis(50), ..fast() });
    while probe.active() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = serving.stop().await;
    assert_eq!(report.handed_back, 1);
    assert_eq!(probe.active(), 0, "no call of the handed-back turn outlives it: {:?}", probe.log());
    assert_eq!(store.current_lease(&run_id).await.unwrap(), None, "handed back: no lease to wait out");
    assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Running);
}

/// Shutdown under a call that cannot be interrupted: the turn keeps the run's lease (renewed
/// past its TTL) until the call ends, journals the outcome, and only then hands the run back;
/// the next worker replays the call instead of running it again.
#[tokio::test(start_paused = true)]
async fn shutdown_keeps_the_lease_until_an_uninterruptible_call_ends() {
    let count = Arc::new(AtomicUsize::new(0));
    let calls = count.clone();
    let charge = FnTool::new("pay", move |_, _| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            // Three lease TTLs: the lease must be renewed under it.
            tokio::time::sleep(Duration::from_secs(6)).await;
            Ok(json!({"paid": 5}))
        }
    })
    .uninterruptible();
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let rt = runtime(store.clone(), charge);
    let run_id = rt.submit("order").await.unwrap();
    let serving = Serving::start(&rt, WorkerOptions { shutdown_grace: Duration::from_millis(50), ..fast() });
    while count.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let task = serving.begin_shutdown();
    // Past the grace and past the TTL: the call still runs, and the run is still held.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!task.is_finished(), "shutdown waits for the call");
    let taken = store.acquire_lease(&run_id, "another worker", Duration::from_secs(2)).await;
    assert!(matches!(taken, Err(kuralle::StoreError::LeaseHeld { .. })), "the lease is kept: {taken:?}");
    let report = task.await.unwrap().unwrap();
    assert_eq!(report.handed_back, 1);
    assert_eq!(store.current_lease(&run_id).await.unwrap(), None, "released once the call ended");
    let journal = rt.journal(&run_id).await.unwrap();
    assert!(
        journal.iter().any(|s| s.name == "pay" && s.status == kuralle::StepStatus::Finished),
        "the outcome was journaled before the hand-back: {journal:?}"
    );

    let report = rt.serve_with(wait_then_stop(&rt, &run_id), fast()).await.unwrap();
    assert_eq!(report.claimed, 1);
    assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1, "the payment ran once");
}

async fn wait_then_stop(rt: &Runtime, run_id: &str) {
    wait_for(rt, run_id, RunStatus::Finished).await;
}

/// A run that its last turn closes between the queue's listing and its claim (the list is a
/// snapshot) is not claimed: a closed run never starts another turn.
#[tokio::test]
async fn a_run_closed_after_the_listing_is_not_claimed() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = kuralle_tests::FlakyStore::new(memory.clone());
    let lease = memory.acquire_lease("r", "submitter", Duration::from_secs(60)).await.unwrap();
    memory.create_run(kuralle_tests::conformance::run("r", RunStatus::Running, 1), lease.token).await.unwrap();
    memory.release_lease(&lease).await.unwrap();
    flaky.after_next_list(|store| {
        Box::pin(async move {
            // The run's last turn closes it and gives up its lease.
            let lease = store.acquire_lease("r", "turn", Duration::from_secs(60)).await.unwrap();
            let mut record = store.get_run("r").await.unwrap().unwrap();
            record.status = RunStatus::Finished;
            store.put_run(record, lease.token).await.unwrap();
            store.release_lease(&lease).await.unwrap();
        })
    });
    let claimed = flaky.claim_runnable("worker", Duration::from_secs(60), 4).await.unwrap();
    assert!(claimed.is_empty(), "a finished run was claimed: {claimed:?}");
    assert_eq!(memory.current_lease("r").await.unwrap(), None, "the claim let go of the run");
    assert_eq!(memory.get_run("r").await.unwrap().unwrap().status, RunStatus::Finished);
}

/// Claims that fail for 40 s (the store is down) are retried with a backoff that stops
/// doubling at 2 s, so a submitted run is claimed within about 2 s of the store being back,
/// not after a pause that grew with the outage (once up to 30 s).
#[tokio::test(start_paused = true)]
async fn claims_resume_within_two_seconds_of_a_long_outage_ending() {
    let count = Arc::new(AtomicUsize::new(0));
    let (rt, flaky, _) = flaky_runtime(counting_tool("pay", &count));
    let run_id = rt.submit(RunRequest::new("order")).await.unwrap();
    flaky.fail_claims(true);
    let options = WorkerOptions { poll_interval: Duration::from_millis(100), ..fast() };
    let serving = Serving::start(&rt, options);
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::Running);
    flaky.fail_claims(false);
    let back = tokio::time::Instant::now();
    wait_for(&rt, &run_id, RunStatus::Finished).await;
    let late = back.elapsed();
    assert!(late <= Duration::from_millis(2_100), "claimed {late:?} after the store was back");
    let report = serving.stop().await;
    assert_eq!((report.claimed, report.completed), (1, 1), "{report:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// A turn that fails because the store stays unavailable is not held for `retry_backoff` (5 s):
/// the run goes on one poll after the store is back. (A model outage still waits it out.)
#[tokio::test(start_paused = true)]
async fn a_turn_failed_by_a_store_outage_is_not_held_for_the_retry_backoff() {
    let count = Arc::new(AtomicUsize::new(0));
    let (rt, flaky, _) = flaky_runtime(counting_tool("pay", &count));
    let run_id = rt.submit(RunRequest::new("order")).await.unwrap();
    // The turn's first journal write (the model's response with the call's intent) fails.
    flaky.fail_append(true);
    let options = WorkerOptions { retry_backoff: Duration::from_secs(5), ..fast() };
    assert_eq!(options.poll_interval, Duration::from_millis(20));
    let serving = Serving::start(&rt, options);
    // Longer than the turn rides out (it retries the write while its 2 s lease is proven
    // held, 1.8 s): the turn ends, and the worker must not wait 5 s to try again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(count.load(Ordering::SeqCst), 0, "no call ran: its intent was never written");
    flaky.fail_append(false);
    let back = tokio::time::Instant::now();
    wait_for(&rt, &run_id, RunStatus::Finished).await;
    let late = back.elapsed();
    assert!(late < Duration::from_secs(1), "finished {late:?} after the store was back");
    let report = serving.stop().await;
    assert!(report.retried >= 1, "{report:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// A short outage on the intents' write does not end the turn: it writes them again while its
/// lease is proven held, and the run finishes in the same turn.
#[tokio::test(start_paused = true)]
async fn a_turn_rides_out_a_short_outage_on_its_intents() {
    let count = Arc::new(AtomicUsize::new(0));
    let (rt, flaky, _) = flaky_runtime(counting_tool("pay", &count));
    let run_id = rt.submit(RunRequest::new("order")).await.unwrap();
    flaky.fail_append(true);
    let serving = Serving::start(&rt, fast());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(count.load(Ordering::SeqCst), 0);
    flaky.fail_append(false);
    wait_for(&rt, &run_id, RunStatus::Finished).await;
    let report = serving.stop().await;
    assert_eq!((report.claimed, report.retried), (1, 0), "one turn did it all: {report:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// The append of an `at_most_once` call's intent commits, but its answer is lost (the
/// connection broke after the commit). The turn's retry finds the intent journaled under its
/// own fence, so it knows the call never started and runs it: once, not reported
/// indeterminate, as a later turn finding the intent `Running` would have to.
#[tokio::test(start_paused = true)]
async fn an_intent_whose_answer_was_lost_runs_its_at_most_once_call_once() {
    let count = Arc::new(AtomicUsize::new(0));
    let (rt, flaky, memory) = flaky_runtime(counting_tool("refund", &count).at_most_once());
    let run_id = rt.submit(RunRequest::new("order")).await.unwrap();
    flaky.lose_append_answers(1);
    let serving = Serving::start(&rt, fast());
    wait_for(&rt, &run_id, RunStatus::Finished).await;
    let report = serving.stop().await;
    assert_eq!((report.claimed, report.retried), (1, 0), "{report:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the call ran once");
    let steps = memory.steps(&run_id).await.unwrap();
    let call = steps.iter().find(|s| s.name == "refund").expect("the call is journaled");
    assert_eq!(call.status, kuralle::StepStatus::Finished, "{call:?}");
    assert_eq!(steps.iter().filter(|s| s.name == "refund").count(), 1, "one intent, not two");
}

/// A submission the runtime refuses records nothing and leaves no lease: an unknown agent, for
/// a run the runtime names (refused before its lease is taken) and for a caller's id (refused
/// once the run is read missing); a resume of no run.
#[tokio::test]
async fn a_refused_submission_records_nothing() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let runtime = runtime(Arc::clone(&store), counting_tool("t", &Arc::new(AtomicUsize::new(0))));
    let unknown = runtime.submit(RunRequest::new("go").agent("nobody")).await.unwrap_err();
    assert!(matches!(unknown, RunError::UnknownAgent { ref id, .. } if id == "nobody"), "{unknown:?}");
    let named = runtime.submit(RunRequest::new("go").agent("nobody").run_id("r1")).await.unwrap_err();
    assert!(matches!(named, RunError::UnknownAgent { .. }), "{named:?}");
    let resumed = runtime.submit(kuralle::ResumeRequest::new("r2")).await.unwrap_err();
    assert!(matches!(resumed, RunError::RunNotFound(ref id) if id == "r2"), "{resumed:?}");
    assert!(store.list_runs(Default::default()).await.unwrap().is_empty(), "no run recorded");
    for run_id in ["r1", "r2"] {
        assert_eq!(store.current_lease(run_id).await.unwrap(), None, "{run_id}: no lease left");
    }
}
