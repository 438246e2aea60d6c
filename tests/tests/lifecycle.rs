//! Run lifecycle from outside the turn: cancel (in process, from another runtime on the same
//! store), retry of a failed run, and fork of a run at a step.

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicUsize, Ordering},
};
use std::time::Duration;

use kuralle::stores::{MemoryStore, SqliteStore};
use kuralle::{
    AgentDef, RunError, RunRequest, RunStatus, RunStore, Runtime, StepStatus,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::FnTool;
use serde_json::json;
use tokio::sync::Notify;

const HOUR: Duration = Duration::from_secs(3600);

/// A tool that counts its runs and waits for its cancellation token, noting that it saw it.
fn waits_for_cancel(count: &Arc<AtomicUsize>, saw_cancel: &Arc<AtomicBool>) -> FnTool {
    let (count, saw_cancel) = (count.clone(), saw_cancel.clone());
    FnTool::new("charge", move |_, ctx| {
        let (count, saw_cancel) = (count.clone(), saw_cancel.clone());
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            ctx.cancellation().cancelled().await;
            saw_cancel.store(true, Ordering::SeqCst);
            Err(kuralle::ToolError::Cancelled { tool: "charge".into() })
        }
    })
}

fn shop(store: Arc<dyn RunStore>, tool: FnTool, ttl: Duration) -> Runtime {
    Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(tool))
        .model(ScriptedModel::by_transcript([Turn::tool_calls([("c1", "charge", "{}")]), Turn::text("Paid.")]))
        .store_arc(store)
        .lease_ttl(ttl)
        .build()
        .unwrap()
}

async fn until(count: &AtomicUsize, n: usize) {
    for _ in 0..10_000 {
        if count.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the tool never started");
}

#[tokio::test(start_paused = true)]
async fn cancel_stops_a_running_turn_in_process_and_cancels_its_calls() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let (count, saw_cancel) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let runtime = shop(Arc::clone(&store), waits_for_cancel(&count, &saw_cancel), HOUR);
    let handle = runtime.run(RunRequest::new("Pay").run_id("r1"));
    until(&count, 1).await;

    assert_eq!(runtime.cancel("r1").await.unwrap(), RunStatus::Running);
    let out = handle.await.expect("a cancelled turn ends Ok");
    assert_eq!(out.status, RunStatus::Cancelled);
    assert!(saw_cancel.load(Ordering::SeqCst), "the interruptible call was cancelled");
    assert_eq!(store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Cancelled);
    // Nothing more was journaled: the call's intent stays unfinished, no second model step.
    let journal = store.steps("r1").await.unwrap();
    assert_eq!(journal.len(), 2, "{journal:?}");
    assert_eq!(journal[1].status, StepStatus::Running);

    // Not resumed, not claimed, not cancelled twice.
    assert_eq!(runtime.resume("r1").await.unwrap().status, RunStatus::Cancelled);
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert!(store.claim_runnable("worker", HOUR, 10).await.unwrap().is_empty());
    let again = runtime.cancel("r1").await.unwrap_err();
    assert!(matches!(again, RunError::WrongStatus { status: RunStatus::Cancelled, .. }), "{again}");
    assert!(matches!(runtime.cancel("nope").await, Err(RunError::RunNotFound(_))));
}

/// Another runtime (as another process would) cancels through the store: the owner learns of
/// it from its next lease renewal, which is fenced, and cancels its waiting call then.
#[tokio::test(start_paused = true)]
async fn an_owner_elsewhere_sees_the_cancel_at_its_next_renewal() {
    let store = MemoryStore::new();
    let (count, saw_cancel) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let ttl = Duration::from_secs(3);
    let owner = shop(Arc::new(store.clone()), waits_for_cancel(&count, &saw_cancel), ttl);
    let operator = shop(Arc::new(store.clone()), waits_for_cancel(&Arc::default(), &Arc::default()), ttl);
    let handle = owner.run(RunRequest::new("Pay").run_id("r1"));
    until(&count, 1).await;

    assert_eq!(operator.cancel("r1").await.unwrap(), RunStatus::Running);
    assert!(!saw_cancel.load(Ordering::SeqCst), "the owner reads nothing per step: it learns at its renewal");
    let out = handle.await.expect("a cancelled turn ends Ok");
    assert_eq!(out.status, RunStatus::Cancelled);
    assert!(saw_cancel.load(Ordering::SeqCst));
    assert_eq!(store.steps("r1").await.unwrap().len(), 2);
}

/// An uninterruptible `charge` that counts its runs and then waits for `gate`: its outcome
/// write comes only when the test lets it.
fn gated_charge() -> (Arc<AtomicUsize>, Arc<Notify>, FnTool) {
    let (count, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let (c, g) = (count.clone(), gate.clone());
    let tool = FnTool::new("charge", move |_, _| {
        let (count, gate) = (c.clone(), g.clone());
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            gate.notified().await;
            Ok(json!("charged"))
        }
    })
    .uninterruptible();
    (count, gate, tool)
}

/// Two runtimes on one SQLite file; the owner's call is not waiting for cancellation but for
/// a gate: its outcome write is the next step, and the store refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_on_another_sqlite_handle_stops_at_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let (count, gate, tool) = gated_charge();
    let owner = shop(Arc::new(SqliteStore::open(&path).unwrap()), tool, HOUR);
    let operator_store = SqliteStore::open(&path).unwrap();
    let handle = owner.run(RunRequest::new("Pay").run_id("r1"));
    until(&count, 1).await;

    let was = operator_store.cancel_run("r1").await.unwrap();
    assert_eq!(was, Some(RunStatus::Running));
    gate.notify_one();
    let out = handle.await.expect("a cancelled turn ends Ok");
    assert_eq!(out.status, RunStatus::Cancelled);
    let journal = operator_store.steps("r1").await.unwrap();
    assert_eq!(journal.len(), 2, "no second model step: {journal:?}");
    assert_eq!(journal[1].status, StepStatus::Running, "the fenced outcome was not written");
    assert_eq!(operator_store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn cancel_closes_a_paused_run_that_nobody_owns() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let ran = Arc::new(AtomicUsize::new(0));
    let tool = {
        let ran = ran.clone();
        FnTool::new("charge", move |_, _| {
            let ran = ran.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(json!("charged"))
            }
        })
        .needs_approval()
    };
    let runtime = shop(Arc::clone(&store), tool, HOUR);
    let out = runtime.run(RunRequest::new("Pay").run_id("r1")).await.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    assert_eq!(runtime.cancel("r1").await.unwrap(), RunStatus::Paused);
    let late = runtime.deliver("r1", kuralle::Decision::approve("alice")).await;
    assert!(matches!(late, Err(RunError::NotPending { .. })), "a decision on a cancelled run is refused: {late:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a cancelled run's pending call never runs");
    assert_eq!(store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Cancelled);
}

fn counting(name: &str, count: &Arc<AtomicUsize>) -> FnTool {
    let count = count.clone();
    FnTool::new(name, move |args, _| {
        let count = count.clone();
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"done": args}))
        }
    })
}

fn two_calls_then(text: &str) -> ScriptedModel {
    ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "charge", r#"{"n":1}"#)]),
        Turn::tool_calls([("c2", "charge", r#"{"n":2}"#)]),
        Turn::text(text),
    ])
}

#[tokio::test]
async fn retry_continues_a_failed_run_from_its_journal() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let agent = || AgentDef::new("shop", "Take payment.").tool(counting("charge", &count));
    // A journal limit too small for the turn fails the run.
    let small = Runtime::builder()
        .agent(agent())
        .model(two_calls_then("Paid."))
        .store_arc(Arc::clone(&store))
        .max_journal_entries(3)
        .build()
        .unwrap();
    let failed = small.run(RunRequest::new("Pay twice").run_id("r1")).await.unwrap_err();
    assert!(matches!(failed, RunError::StepLimit { .. }), "{failed}");
    assert_eq!(store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Failed);
    let journaled = store.steps("r1").await.unwrap();
    let ran = count.load(Ordering::SeqCst);
    assert!(ran >= 1, "a call ran before the limit: {journaled:?}");

    // Retried with a larger limit: the finished steps replay, the rest runs.
    let model = two_calls_then("Paid.");
    let roomy = Runtime::builder().agent(agent()).model(model.clone()).store_arc(Arc::clone(&store)).build().unwrap();
    let out = roomy.retry("r1").await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Paid."));
    assert_eq!(count.load(Ordering::SeqCst), 2, "each call ran once in all");
    let finished_models =
        journaled.iter().filter(|s| s.kind == kuralle::StepKind::Model && s.status == StepStatus::Finished).count();
    assert_eq!(model.requests().len(), 3 - finished_models, "journaled model responses are not asked for again");
    let again = roomy.retry("r1").await.unwrap_err();
    assert!(matches!(again, RunError::WrongStatus { status: RunStatus::Finished, .. }), "{again}");
}

#[tokio::test]
async fn a_fork_replays_the_copied_steps_then_asks_its_new_model() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let new_model = ScriptedModel::by_transcript([
        Turn::text("unused: replayed"),
        Turn::text("unused: replayed"),
        Turn::text("Refunded instead."),
    ]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(counting("charge", &count)))
        .agent(
            AgentDef::new("shop-v2", "Take payment, kindly.").tool(counting("charge", &count)).model(new_model.clone()),
        )
        .model(two_calls_then("Paid."))
        .store_arc(Arc::clone(&store))
        .build()
        .unwrap();
    runtime.run(RunRequest::new("Pay twice").run_id("r1")).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let original = store.steps("r1").await.unwrap();
    let kinds: Vec<_> = original.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(kinds, ["model", "tool", "model", "tool", "model"]);

    // Fork before the last model step: both calls replay; the new agent's model answers.
    let options = kuralle::ForkOptions::new().run_id("r1-fork").agent("shop-v2").instructions("Refund, never pay.");
    let fork = runtime.fork("r1", 4, options).await.unwrap();
    assert_eq!(fork, "r1-fork");
    assert_eq!(store.steps("r1-fork").await.unwrap().len(), 4);
    let out = runtime.resume(&fork).await.unwrap();
    assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Refunded instead."));
    assert_eq!(count.load(Ordering::SeqCst), 2, "no copied call ran again");
    let asked = new_model.requests();
    assert_eq!(asked.len(), 1, "only the step after the fork point asks a model");
    assert_eq!(&*asked[0].system, "Refund, never pay.");
    assert_eq!(asked[0].messages.iter().filter(|m| matches!(m, kuralle::Message::Tool { .. })).count(), 2);
    // The original is untouched.
    assert_eq!(store.steps("r1").await.unwrap(), original);

    // A fork at step 2 runs the second call again (its result was not copied).
    let refork = runtime.fork("r1", 2, kuralle::ForkOptions::new().run_id("r1-early")).await.unwrap();
    runtime.resume(&refork).await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 3);
    let too_far = runtime.fork("r1", 6, kuralle::ForkOptions::new()).await.unwrap_err();
    assert!(matches!(too_far, RunError::ForkPoint { steps: 5, .. }), "{too_far}");
    let taken = runtime.fork("r1", 1, kuralle::ForkOptions::new().run_id("r1-fork")).await.unwrap_err();
    assert!(matches!(taken, RunError::Store(kuralle::StoreError::RunExists(_))), "{taken}");
}

/// Workers skip a cancelled run, and pick up a retried or forked one (both are left
/// `running` with no owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_skip_cancelled_runs_and_serve_forks() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let runtime = Runtime::builder()
        .agent(AgentDef::new("shop", "Take payment.").tool(counting("charge", &count)))
        .model(two_calls_then("Paid."))
        .store_arc(Arc::clone(&store))
        .build()
        .unwrap();
    let kept = runtime.submit(RunRequest::new("Pay twice").run_id("kept")).await.unwrap();
    let dropped = runtime.submit(RunRequest::new("Pay twice").run_id("dropped")).await.unwrap();
    assert_eq!(runtime.cancel(&dropped).await.unwrap(), RunStatus::Running);

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = runtime.clone();
    let options = kuralle::WorkerOptions { poll_interval: Duration::from_millis(10), ..Default::default() };
    let serving = tokio::spawn(async move {
        worker
            .serve_with(
                async {
                    let _ = stopped.await;
                },
                options,
            )
            .await
    });
    let until_finished = |id: String| {
        let store = Arc::clone(&store);
        async move {
            while store.get_run(&id).await.unwrap().unwrap().status != RunStatus::Finished {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until_finished(kept.clone()).await;
    // A fork after the first call: a worker replays it and makes only the second.
    let fork = runtime.fork(&kept, 2, kuralle::ForkOptions::new()).await.unwrap();
    until_finished(fork).await;
    stop.send(()).unwrap();
    let report = serving.await.unwrap().unwrap();
    assert_eq!((report.claimed, report.completed), (2, 2), "{report:?}");
    assert_eq!(count.load(Ordering::SeqCst), 3, "two calls for `kept`, one more for its fork");
    assert!(store.steps(&dropped).await.unwrap().is_empty(), "the cancelled run never ran");
    assert_eq!(store.get_run(&dropped).await.unwrap().unwrap().status, RunStatus::Cancelled);
}

/// The SQLite case on PostgreSQL: an operator's connection cancels, the owner's outcome write
/// is fenced. Skipped with a notice without `DATABASE_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_on_postgres_stops_at_its_next_write() {
    let Some((store, guard)) = kuralle_tests::postgres::store("lifecycle cancel").await else { return };
    let options = kuralle::stores::PostgresOptions { schema: guard.schema.clone(), ..Default::default() };
    let operator = kuralle::stores::PostgresStore::connect_with(&guard.url, options).await.unwrap();
    let (count, gate, tool) = gated_charge();
    let owner = shop(Arc::new(store), tool, HOUR);
    let handle = owner.run(RunRequest::new("Pay").run_id("r1"));
    until(&count, 1).await;

    assert_eq!(operator.cancel_run("r1").await.unwrap(), Some(RunStatus::Running));
    gate.notify_one();
    let out = handle.await.expect("a cancelled turn ends Ok");
    assert_eq!(out.status, RunStatus::Cancelled);
    let journal = operator.steps("r1").await.unwrap();
    assert_eq!(journal.len(), 2, "no second model step: {journal:?}");
    assert_eq!(journal[1].status, StepStatus::Running, "the fenced outcome was not written");
    drop(owner);
    drop(guard);
}
