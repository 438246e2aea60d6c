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

/// Two runtimes on one SQLite file; the owner's call is not waiting for cancellation but for
/// a gate: its outcome write is the next step, and the store refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_on_another_sqlite_handle_stops_at_its_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let (count, gate) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let tool = {
        let (count, gate) = (count.clone(), gate.clone());
        FnTool::new("charge", move |_, _| {
            let (count, gate) = (count.clone(), gate.clone());
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                gate.notified().await;
                Ok(json!("charged"))
            }
        })
        .uninterruptible()
    };
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
    assert!(late.is_err() || late.as_ref().is_ok_and(|o| o.status == RunStatus::Cancelled), "{late:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a cancelled run's pending call never runs");
    assert_eq!(store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Cancelled);
}
