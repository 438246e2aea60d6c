//! One owner per run, in one process: the lease the runtime takes for `run`, `resume` and
//! `deliver`, what a second caller gets, what a holder that loses its lease does, and the
//! guards `replay = false` may not skip. (Real processes: `crash.rs`.)

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kuralle::testing::CountingStore;
use kuralle::{
    AgentDef, Decision, Event, RunError, RunRequest, RunStatus, RunStore, Runtime, StepKind, StepStatus,
    stores::MemoryStore,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::{FlakyStore, FnTool};
use serde_json::json;
use tokio::sync::Notify;

/// A charge that counts executions and, when `gate` is given, waits for it (cancellably).
fn charge(count: &Arc<AtomicUsize>, gate: Option<Arc<Notify>>) -> FnTool {
    let count = count.clone();
    FnTool::new("charge", move |args, ctx| {
        let (count, gate) = (count.clone(), gate.clone());
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = gate {
                tokio::select! {
                    () = gate.notified() => {}
                    () = ctx.cancellation().cancelled() => {
                        return Err(kuralle::ToolError::Cancelled { tool: "charge".into() });
                    }
                }
            }
            Ok(json!({"charged": args["amount"]}))
        }
    })
}

fn runtime(store: Arc<dyn RunStore>, tool: FnTool, model: ScriptedModel) -> Runtime {
    Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(tool))
        .model(model)
        .store_arc(store)
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap()
}

fn pay_then_done() -> ScriptedModel {
    // A caller that comes after the run finished starts a new turn, which the model answers
    // with text (one answer per such turn: up to eight callers race in these tests).
    let again = std::iter::repeat_n(Turn::text("Already paid."), 8);
    ScriptedModel::by_transcript(
        [Turn::tool_calls([("c1", "charge", r#"{"amount":100}"#)]), Turn::text("Paid.")].into_iter().chain(again),
    )
}

async fn drain(mut handle: kuralle::RunHandle) -> (Vec<Event>, Result<kuralle::RunOutput, RunError>) {
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await)
}

/// Waits (on the paused clock) until `f` holds.
async fn until(mut f: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("condition never held");
}

#[tokio::test(start_paused = true)]
async fn a_second_caller_gets_busy_at_once_and_nothing_executes() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let rt = runtime(store.clone(), charge(&count, Some(gate.clone())), pay_then_done());
    let first = rt.run(RunRequest::new("pay").run_id("r"));
    until(|| count.load(Ordering::SeqCst) == 1).await;
    let holder = store.current_lease("r").await.unwrap().expect("the first turn holds the lease");

    // Two fresh starts and a resume of the same run: each ends at once, before anything runs.
    for handle in
        [rt.run(RunRequest::new("pay").run_id("r")), rt.resume("r"), rt.run(RunRequest::new("pay").run_id("r"))]
    {
        let (events, out) = drain(handle).await;
        match out.unwrap_err() {
            RunError::Busy { run_id, owner, expires_at_ms } => {
                assert_eq!((run_id.as_str(), owner.as_str()), ("r", holder.owner.as_str()));
                assert!(expires_at_ms > 0);
            }
            other => panic!("expected Busy, got {other:?}"),
        }
        assert!(matches!(events.as_slice(), [Event::Error { .. }]), "no RunStarted, no tool call: {events:?}");
    }
    assert_eq!(count.load(Ordering::SeqCst), 1, "the losers executed nothing");
    assert!(RunError::Busy { run_id: "r".into(), owner: "o".into(), expires_at_ms: 0 }.is_retryable());

    gate.notify_one();
    let out = first.await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(store.current_lease("r").await.unwrap(), None, "a closed turn holds no lease");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_for_lease_waits_for_the_holder_then_runs() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Notify::new());
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "charge", r#"{"amount":100}"#)]),
        Turn::text("Paid."),
        Turn::text("Anything else?"),
    ]);
    let rt = runtime(store.clone(), charge(&count, Some(gate.clone())), model);
    let first = rt.run(RunRequest::new("pay").run_id("r"));
    until(|| count.load(Ordering::SeqCst) == 1).await;

    let patient = rt.run(RunRequest::new("thanks").run_id("r").wait_for_lease(Duration::from_secs(60)));
    tokio::time::sleep(Duration::from_secs(5)).await;
    gate.notify_one();
    assert_eq!(first.await.unwrap().status, RunStatus::Finished);
    let out = patient.await.unwrap();
    assert_eq!(out.text, "Anything else?", "the waiter ran its turn after the holder let go");

    // Waiting is bounded.
    let gate2 = Arc::new(Notify::new());
    let rt = runtime(Arc::new(MemoryStore::new()), charge(&count, Some(gate2.clone())), pay_then_done());
    let holder = rt.run(RunRequest::new("pay").run_id("s"));
    until(|| count.load(Ordering::SeqCst) == 2).await;
    let err = rt.run(RunRequest::new("pay").run_id("s").wait_for_lease(Duration::from_secs(2))).await.unwrap_err();
    assert!(matches!(err, RunError::Busy { .. }), "{err:?}");
    gate2.notify_one();
    holder.await.unwrap();
}

/// A run its caller names with a turn's input starts as one the runtime names: its lease and
/// its row in one request (`RunStore::acquire_lease_and_create_run`), so the two take the same
/// writes. Its next turn finds the run there and goes on with it.
#[tokio::test(start_paused = true)]
async fn a_run_its_caller_names_is_created_with_its_lease() {
    let start = |run_id: Option<&'static str>| async move {
        let counting = CountingStore::new(Arc::new(MemoryStore::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let rt = runtime(Arc::new(counting.clone()), charge(&count, None), pay_then_done());
        let req = RunRequest::new("pay");
        let out = rt.run(run_id.map_or(req.clone(), |id| req.run_id(id))).await.unwrap();
        assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
        (counting.counts().writes, rt, out.run_id, count)
    };
    let (by_runtime, ..) = start(None).await;
    let (by_caller, rt, run_id, count) = start(Some("order-1")).await;
    assert_eq!(run_id, "order-1");
    assert_eq!(by_caller, by_runtime, "the caller's id costs no write more");

    let again = rt.run(RunRequest::new("and again?").run_id(run_id)).await.unwrap();
    assert_eq!((again.status, again.text.as_str()), (RunStatus::Finished, "Already paid."));
    assert_eq!(count.load(Ordering::SeqCst), 1, "the first turn's charge did not run again");
}

/// Where the request that would create a caller's run is refused before the store is asked,
/// or by the store for its size, the run that is there decides, as it did before such runs
/// started with the create request: an unknown agent names no agent of a run that has its
/// own, and a replayed request (its idempotency key seen) is answered with the run's output,
/// however large its input. For a run that is not there, the refusal stands, and leaves no run and no
/// lease behind.
#[tokio::test(start_paused = true)]
async fn a_callers_run_that_is_there_decides_what_a_new_run_would_refuse() {
    let store = Arc::new(MemoryStore::new().with_max_value_bytes(4096));
    let count = Arc::new(AtomicUsize::new(0));
    let rt = runtime(store.clone(), charge(&count, None), pay_then_done());
    let first = rt.run(RunRequest::new("pay").run_id("r").idempotency_key("k1")).await.unwrap();
    assert_eq!((first.status, first.text.as_str()), (RunStatus::Finished, "Paid."));

    let next = rt.run(RunRequest::new("and again?").run_id("r").agent("nobody")).await.unwrap();
    assert_eq!((next.status, next.text.as_str()), (RunStatus::Finished, "Already paid."), "the run's own agent");

    let large = "x".repeat(8192);
    let journaled = store.steps("r").await.unwrap().len();
    let replayed = rt.run(RunRequest::new(large.as_str()).run_id("r").idempotency_key("k1")).await.unwrap();
    assert_eq!((replayed.status, replayed.text.as_str()), (RunStatus::Finished, "Already paid."), "the run's output");
    assert_eq!(store.steps("r").await.unwrap().len(), journaled, "no new turn");

    let err = rt.run(RunRequest::new("pay").run_id("s").agent("nobody")).await.unwrap_err();
    assert!(matches!(err, RunError::UnknownAgent { .. }), "{err:?}");
    let err = rt.run(RunRequest::new(large.as_str()).run_id("t")).await.unwrap_err();
    assert!(matches!(err, RunError::Store(kuralle::StoreError::LimitExceeded(_))), "{err:?}");
    for id in ["s", "t"] {
        assert!(store.get_run(id).await.unwrap().is_none(), "{id}: no run made");
        assert_eq!(store.current_lease(id).await.unwrap(), None, "{id}: no lease left");
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_loses_its_lease_stops_and_journals_nothing_more() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "charge", r#"{"amount":100}"#), ("c2", "charge", r#"{"amount":200}"#)]),
        Turn::text("Paid."),
    ]);
    // Never released by the gate: only the lease loss ends the call.
    let rt = runtime(store.clone(), charge(&count, Some(Arc::new(Notify::new()))), model);
    let zombie = rt.run(RunRequest::new("pay").run_id("r"));
    until(|| count.load(Ordering::SeqCst) == 1).await;

    // Another owner takes the run over (as after an expiry): the zombie's next renewal is
    // fenced.
    let lease = store.current_lease("r").await.unwrap().unwrap();
    store.release_lease(&lease).await.unwrap();
    let thief = store.acquire_lease("r", "thief", Duration::from_secs(3600)).await.unwrap();
    assert!(thief.token > lease.token);
    let record = store.get_run("r").await.unwrap().unwrap();
    let steps = store.steps("r").await.unwrap();

    let (events, out) = drain(zombie).await;
    assert_eq!(out.unwrap_err(), RunError::LeaseLost { run_id: "r".into(), token: lease.token });
    assert!(matches!(events.last(), Some(Event::Error { .. })));
    assert_eq!(count.load(Ordering::SeqCst), 1, "the second call never started");
    assert_eq!(store.get_run("r").await.unwrap().unwrap(), record, "the zombie wrote nothing");
    assert_eq!(store.steps("r").await.unwrap(), steps, "no outcome, no new intent");
    assert_eq!(steps.last().map(|s| (s.kind, s.status)), Some((StepKind::Tool, StepStatus::Running)));
    assert_eq!(store.current_lease("r").await.unwrap(), Some(thief), "the new owner keeps its lease");
}

/// Renewals fail (the store is unreachable from this process, not from others): the holder
/// counts its lease lost at the local deadline, before the store lets anyone else take the run,
/// and cancels its interruptible call then. Before, only a `Fenced` answer stopped a turn: the
/// call ran on while another owner took the run over and ran it again.
#[tokio::test(start_paused = true)]
async fn failing_renewals_stop_the_holder_before_anyone_can_take_over() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let store = FlakyStore::new(memory.clone());
    let cancelled_at = Arc::new(std::sync::Mutex::new(None));
    let count = Arc::new(AtomicUsize::new(0));
    let (seen, calls) = (cancelled_at.clone(), count.clone());
    let fetch = FnTool::new("charge", move |_, ctx| {
        let (seen, calls) = (seen.clone(), calls.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(20)) => Ok(json!("done")),
                () = ctx.cancellation().cancelled() => {
                    *seen.lock().unwrap() = Some(tokio::time::Instant::now());
                    Err(kuralle::ToolError::Cancelled { tool: "charge".into() })
                }
            }
        }
    });
    let rt = runtime(Arc::new(store.clone()), fetch, pay_then_done());
    let started = tokio::time::Instant::now();
    let holder = rt.run(RunRequest::new("pay").run_id("r"));
    until(|| count.load(Ordering::SeqCst) == 1).await;
    store.fail_renew(true);

    // Another process, which still reaches the store, takes the run as soon as it may.
    let taken_at = loop {
        if memory.acquire_lease("r", "other process", Duration::from_secs(3)).await.is_ok() {
            break tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let cancelled_at = cancelled_at.lock().unwrap().expect("the holder cancelled its call");
    assert!(
        cancelled_at < taken_at,
        "cancelled {:?} after the start, taken over {:?} after it",
        cancelled_at - started,
        taken_at - started
    );
    let (_, out) = drain(holder).await;
    assert!(matches!(out, Err(RunError::LeaseLost { .. })), "{out:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// One run's renewal hangs (a stuck connection): the other leases of the process are still
/// renewed on time. Before, the renewing task waited on every renewal of a round together, so
/// one stuck request stalled them all and the others' leases lapsed.
#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_does_not_stall_the_others() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let store = FlakyStore::new(memory.clone());
    let count = Arc::new(AtomicUsize::new(0));
    let slow = slow_charge(&count, Duration::from_secs(10)).uninterruptible();
    let model =
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "charge", r#"{"amount":1}"#)]), Turn::text("Paid.")]);
    let rt = runtime(Arc::new(store.clone()), slow, model);
    store.hang_renew("stuck");
    let stuck = rt.run(RunRequest::new("pay").run_id("stuck"));
    let healthy = rt.run(RunRequest::new("pay").run_id("healthy"));
    until(|| count.load(Ordering::SeqCst) == 2).await;
    // Two TTLs in: the healthy run's lease has been renewed; the stuck one's is lost.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let taken = memory.acquire_lease("healthy", "other process", Duration::from_secs(3)).await;
    assert!(matches!(taken, Err(kuralle::StoreError::LeaseHeld { .. })), "still held: {taken:?}");
    assert_eq!(healthy.await.unwrap().status, RunStatus::Finished);
    assert!(matches!(stuck.await, Err(RunError::LeaseLost { .. })));
}

/// Leases held together are renewed together: eight runs in flight for three TTLs make one
/// renewal request per period carrying all eight leases (`RunStore::renew_leases`), not one
/// request per lease, and every lease stays held.
#[tokio::test(start_paused = true)]
async fn leases_held_together_are_renewed_in_one_request() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let counting = CountingStore::new(memory.clone());
    let count = Arc::new(AtomicUsize::new(0));
    let slow = slow_charge(&count, Duration::from_secs(9));
    let model =
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "charge", r#"{"amount":1}"#)]), Turn::text("Paid.")]);
    let rt = runtime(Arc::new(counting.clone()), slow, model);
    let runs: Vec<_> = (0..8).map(|i| rt.run(RunRequest::new("pay").run_id(format!("r{i}")))).collect();
    until(|| count.load(Ordering::SeqCst) == 8).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let counts = counting.counts();
    // 3 s TTL, renewed every second: at least five rounds of eight in six seconds.
    assert!(counts.renewals >= 5 * 8, "{counts:?}");
    assert!(counts.renewal_requests * 8 <= counts.renewals + 8, "one request a round: {counts:?}");
    for i in 0..8 {
        let taken = memory.acquire_lease(&format!("r{i}"), "other process", Duration::from_secs(3)).await;
        assert!(matches!(taken, Err(kuralle::StoreError::LeaseHeld { .. })), "r{i} still held: {taken:?}");
    }
    for run in runs {
        assert_eq!(run.await.unwrap().status, RunStatus::Finished);
    }
}

/// A release that fails while the store is down is tried again once it is back: the next
/// caller waits about the outage, not the lease's whole TTL.
#[tokio::test(start_paused = true)]
async fn a_failed_release_is_retried_once_the_store_is_back() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let store = FlakyStore::new(memory.clone());
    let count = Arc::new(AtomicUsize::new(0));
    let rt = runtime(Arc::new(store.clone()), charge(&count, None), pay_then_done());
    store.fail_release(true);
    assert_eq!(rt.run(RunRequest::new("pay").run_id("r")).await.unwrap().status, RunStatus::Finished);
    assert!(memory.current_lease("r").await.unwrap().is_some(), "the release failed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.fail_release(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(memory.current_lease("r").await.unwrap(), None, "released again, well before the 3 s TTL");
}

#[tokio::test(start_paused = true)]
async fn fresh_concurrent_starts_race_on_the_lease_not_on_create() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let rt = runtime(store.clone(), charge(&count, None), pay_then_done());
    let handles: Vec<_> = (0..8).map(|_| rt.run(RunRequest::new("pay").run_id("r"))).collect();
    let mut finished = 0;
    for handle in handles {
        match handle.await {
            Ok(out) => {
                assert_eq!(out.status, RunStatus::Finished);
                finished += 1;
            }
            // A loser either met the holder (Busy) or came after it finished (the same
            // input on a finished run starts a new turn; never an error from the store).
            Err(RunError::Busy { .. }) => {}
            Err(other) => panic!("a loser got {other:?}"),
        }
    }
    assert!(finished >= 1);
    let charges = store.steps("r").await.unwrap().iter().filter(|s| s.kind == StepKind::Tool).count();
    assert_eq!(count.load(Ordering::SeqCst), charges, "every execution is journaled by its owner");
}

fn transfer(count: &Arc<AtomicUsize>) -> FnTool {
    let count = count.clone();
    FnTool::new("transfer", move |args, _| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(json!({"sent": args["amount"]}))
        }
    })
    .needs_approval()
}

fn paused_transfer(count: &Arc<AtomicUsize>, store: Arc<dyn RunStore>) -> Runtime {
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "transfer", r#"{"amount":500}"#)]),
        Turn::text("Sent."),
    ]);
    runtime(store, transfer(count), model)
}

#[tokio::test(start_paused = true)]
async fn concurrent_deliveries_execute_once_and_the_others_get_a_typed_answer() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let rt = paused_transfer(&count, store.clone());
    let (events, out) = drain(rt.run(RunRequest::new("send").run_id("r"))).await;
    assert_eq!(out.unwrap().status, RunStatus::Paused);
    assert_eq!(store.current_lease("r").await.unwrap(), None, "a paused run holds no lease");
    let request_id = events
        .iter()
        .find_map(|e| match e {
            Event::Paused { pending, .. } => Some(pending[0].request_id.clone()),
            _ => None,
        })
        .unwrap();

    let deliveries: Vec<_> =
        (0..3).map(|i| rt.deliver("r", Decision::approve(format!("op-{i}")).for_request(&request_id))).collect();
    let mut executed = 0;
    for delivery in deliveries {
        match delivery.await {
            Ok(out) => {
                assert_eq!(out.status, RunStatus::Finished);
                executed += 1;
            }
            Err(RunError::Busy { .. } | RunError::AlreadyDecided { .. }) => {}
            Err(other) => panic!("a concurrent delivery got {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(count.load(Ordering::SeqCst), 1, "the tool ran exactly once");

    // A late delivery of the same request is told it was decided.
    let late = rt.deliver("r", Decision::approve("late").for_request(&request_id)).await.unwrap_err();
    assert_eq!(late, RunError::AlreadyDecided { run_id: "r".into(), request_id: request_id.clone() });
    let deny = Decision::deny("late", "no").for_request(&request_id);
    let late = kuralle::record_decision(store.as_ref(), "r", &deny).await.unwrap_err();
    assert!(matches!(late, RunError::AlreadyDecided { .. }), "{late:?}");
}

#[tokio::test(start_paused = true)]
async fn record_decision_records_under_the_lease_and_a_resume_carries_it_out() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let rt = paused_transfer(&count, store.clone());
    assert_eq!(rt.run(RunRequest::new("send").run_id("r")).await.unwrap().status, RunStatus::Paused);

    // Someone else owns the run: the decision is refused with Busy, and nothing is recorded.
    let other = store.acquire_lease("r", "operator-console", Duration::from_secs(10)).await.unwrap();
    let busy = kuralle::record_decision(store.as_ref(), "r", &Decision::approve("alice")).await.unwrap_err();
    assert!(matches!(busy, RunError::Busy { ref owner, .. } if owner == "operator-console"), "{busy:?}");
    store.release_lease(&other).await.unwrap();

    kuralle::record_decision(store.as_ref(), "r", &Decision::approve("alice")).await.unwrap();
    assert_eq!(store.current_lease("r").await.unwrap(), None, "released after recording");
    let again = kuralle::record_decision(store.as_ref(), "r", &Decision::approve("bob")).await.unwrap_err();
    assert!(matches!(again, RunError::AlreadyDecided { .. }), "{again:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0, "recording executes nothing");

    let out = rt.resume("r").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

// Paused clock: the outcome's write is retried for as long as the lease is proven held.
#[tokio::test(start_paused = true)]
async fn needs_approval_with_replay_false_needs_an_approval_for_every_execution() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory);
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let wire = FnTool::new("wire", move |_, _| {
        let c = c.clone();
        async move { Ok(json!({"wired": c.fetch_add(1, Ordering::SeqCst) + 1})) }
    })
    .needs_approval()
    .no_replay();
    let model =
        ScriptedModel::by_transcript([Turn::tool_calls([("c1", "wire", r#"{"to":"acme"}"#)]), Turn::text("Done.")]);
    let rt = Runtime::builder()
        .agent(AgentDef::new("bank", "x").tool(wire))
        .model(model)
        .store(flaky.clone())
        .build()
        .unwrap();

    // Never executed without a recorded approval.
    let out = rt.run(RunRequest::new("wire it").run_id("r")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    assert_eq!(count.load(Ordering::SeqCst), 0);

    // Approved: it executes once; its outcome cannot be recorded (the store fails for longer
    // than the lease can be proven held), so the turn stops, resumable.
    flaky.fail_finish_from(1); // the approval is recorded; the call's outcome is not
    let err = rt.deliver("r", Decision::approve("alice")).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    flaky.fail_finish(false);

    // Resuming reaches the call again: never answered from the journal, it is a new
    // execution, and that needs an approval of its own.
    let out = rt.resume("r").await.unwrap();
    assert_eq!(out.status, RunStatus::Paused, "the first approval was spent on the first execution");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let out = rt.deliver("r", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let approvals = rt.journal("r").await.unwrap().iter().filter(|s| s.kind == StepKind::Approval).count();
    assert_eq!(approvals, 2, "one recorded approval per execution");
}

#[test]
fn at_most_once_with_replay_false_is_rejected_when_the_runtime_is_built() {
    let tool = FnTool::new("ship", |_, _| async { Ok(json!(1)) }).at_most_once().no_replay();
    let err = Runtime::builder()
        .agent(AgentDef::new("shop", "x").tool(tool))
        .model(ScriptedModel::new([Turn::text("x")]))
        .build()
        .unwrap_err();
    let RunError::Config(message) = &err else { panic!("expected Config, got {err:?}") };
    assert!(message.contains("`ship`") && message.contains("at_most_once") && message.contains("replay = false"));

    let err = Runtime::builder()
        .agent(AgentDef::new("shop", "x"))
        .model(ScriptedModel::new([Turn::text("x")]))
        .lease_ttl(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(err, RunError::Config(_)), "{err:?}");
}

/// A `charge` tool that counts its calls and takes `takes` (longer than the lease TTL, so the
/// lease must be renewed under it).
fn slow_charge(count: &Arc<AtomicUsize>, takes: Duration) -> FnTool {
    let calls = count.clone();
    FnTool::new("charge", move |_, _| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(takes).await;
            Ok(json!("charged"))
        }
    })
}

/// Run `r` paid once and finished: its response, the charge and its answer, each journaled
/// once and finished.
async fn assert_paid_once(store: &dyn RunStore) {
    let journal: Vec<_> = store.steps("r").await.unwrap().iter().map(|s| (s.kind, s.status)).collect();
    let finished = |kind| (kind, StepStatus::Finished);
    assert_eq!(journal, [finished(StepKind::Model), finished(StepKind::Tool), finished(StepKind::Model)]);
    assert_eq!(store.get_run("r").await.unwrap().unwrap().status, RunStatus::Finished);
}

/// A closing write answered by an outage after it journaled the answer's response (the
/// connection broke before the answer came back) does not fail the run: the response is found
/// journaled, as the journal finds any step after an outage, and the run closes with it once.
#[tokio::test(start_paused = true)]
async fn a_closing_write_lost_in_an_outage_finds_its_answer_journaled() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    let outage = flaky.clone();
    // The charge's outcome is the run's last write before its close: the close's append is next.
    let tool = FnTool::new("charge", move |_, _| {
        let outage = outage.clone();
        async move {
            outage.lose_append_answers(1);
            Ok(json!("charged"))
        }
    });
    let rt = runtime(Arc::new(flaky), tool, pay_then_done());
    let out = rt.run(RunRequest::new("pay").run_id("r")).await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
    assert_paid_once(memory.as_ref()).await;
    assert_eq!(memory.current_lease("r").await.unwrap(), None);
}

/// A closing write that landed whole (the run, its answer, the lease released in one
/// transaction) and whose answer an outage lost: the turn reads the run back, finds its write,
/// and finishes, not a lost lease. On a store whose close keeps the lease, the lease is then
/// released as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closing_write_that_landed_whole_finishes_the_run() {
    let sqlite: Arc<dyn RunStore> = Arc::new(kuralle::stores::SqliteStore::in_memory().unwrap());
    // The provided close keeps the lease: the runtime gives it up after the read-back.
    let provided: Arc<dyn RunStore> = Arc::new(kuralle_tests::provided::ProvidedStore::new());
    for inner in [sqlite, Arc::new(MemoryStore::new()) as Arc<dyn RunStore>, provided] {
        let flaky = FlakyStore::new(inner.clone());
        flaky.lose_close_answers(1);
        let count = Arc::new(AtomicUsize::new(0));
        let rt = runtime(Arc::new(flaky), charge(&count, None), pay_then_done());
        let out = rt.run(RunRequest::new("pay").run_id("r")).await.unwrap();
        assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
        assert_paid_once(inner.as_ref()).await;
        assert_eq!(inner.current_lease("r").await.unwrap(), None, "given up, once");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}

/// A run id the runtime made names, by the time its lease is asked for, a run another process
/// made (which UUIDs make all but impossible, and a store may still answer): the runtime
/// neither overwrites nor refuses that run, but opens it as any run it was asked to resume,
/// with the request's input as its next turn. Nothing of the earlier turn runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_run_id_found_taken_opens_the_run_that_is_there() {
    let sqlite: Arc<dyn RunStore> = Arc::new(kuralle::stores::SqliteStore::in_memory().unwrap());
    for inner in [sqlite, Arc::new(MemoryStore::new()) as Arc<dyn RunStore>] {
        let count = Arc::new(AtomicUsize::new(0));
        let flaky = FlakyStore::new(inner.clone());
        let (earlier_count, planted) = (count.clone(), Arc::new(std::sync::Mutex::new(None)));
        let planted_id = planted.clone();
        flaky.before_next_create(move |store, run_id| {
            Box::pin(async move {
                let other = runtime(store, charge(&earlier_count, None), pay_then_done());
                let out = other.run(RunRequest::new("pay").run_id(run_id.clone())).await.unwrap();
                assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
                *planted_id.lock().unwrap() = Some(run_id);
            })
        });
        let rt = runtime(Arc::new(flaky), charge(&count, None), pay_then_done());
        let out = rt.run(RunRequest::new("and again?")).await.unwrap();

        let planted = planted.lock().unwrap().clone().expect("the hook made a run");
        assert_eq!(out.run_id, planted, "the run that was there");
        assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Already paid."));
        assert_eq!(count.load(Ordering::SeqCst), 1, "the earlier turn's charge did not run again");
        let journal: Vec<_> = inner.steps(&planted).await.unwrap().iter().map(|s| (s.kind, s.status)).collect();
        let finished = |kind| (kind, StepStatus::Finished);
        assert_eq!(
            journal,
            [finished(StepKind::Model), finished(StepKind::Tool), finished(StepKind::Model), finished(StepKind::Model)],
            "the earlier turn's steps, then the new turn's answer"
        );
        let state = inner.get_run(&planted).await.unwrap().unwrap().state;
        let (first, second) = (state.as_str().find("\"pay\""), state.as_str().find("and again?"));
        assert!(first.is_some() && first < second, "both turns' inputs, in order: {}", state.as_str());
        assert_eq!(inner.current_lease(&planted).await.unwrap(), None, "given up");
    }
}
