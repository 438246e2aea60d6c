//! `needs_approval`: the run pauses durably before execution until a human decides.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Decision, Event, Message, RunError, RunRequest, RunStatus, Runtime,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::FnTool;
use serde_json::json;

fn transfer(count: &Arc<AtomicUsize>) -> FnTool {
    let c = count.clone();
    FnTool::new("transfer", move |args, _| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"sent": args["amount"]}))
        }
    })
    .needs_approval()
    .parallel()
}

async fn drain(mut handle: kuralle::RunHandle) -> (Vec<Event>, Result<kuralle::RunOutput, RunError>) {
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await)
}

#[tokio::test]
async fn a_call_waits_for_approval_then_runs_once() {
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "transfer", r#"{"amount":500}"#)]),
        Turn::text("Sent."),
    ]);
    let rt = Runtime::builder().agent(AgentDef::new("bank", "x").tool(transfer(&count))).model(model).build().unwrap();
    let (events, out) = drain(rt.run(RunRequest::new("send 500").run_id("r"))).await;
    let out = out.unwrap();
    assert_eq!(out.status, RunStatus::Paused);
    assert_eq!(count.load(Ordering::SeqCst), 0);
    let pending = events
        .iter()
        .find_map(|e| match e {
            Event::Paused { pending, .. } => Some(pending.clone()),
            _ => None,
        })
        .expect("a paused event");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].args, json!({"amount": 500}));
    assert!(pending[0].request_id.starts_with("approval-"));
    assert_eq!(rt.get_run("r").await.unwrap().unwrap().status, RunStatus::Paused);

    let out = rt.deliver("r", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(out.text, "Sent.");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    // A second delivery finds nothing pending.
    let err = rt.deliver("r", Decision::approve("alice")).await.unwrap_err();
    assert!(matches!(err, RunError::NotPending { .. }), "{err:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_denied_call_never_runs_and_the_model_is_told_why() {
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "transfer", r#"{"amount":9000}"#)]),
        Turn::text("Declined."),
    ]);
    let seen = model.clone();
    let rt = Runtime::builder().agent(AgentDef::new("bank", "x").tool(transfer(&count))).model(model).build().unwrap();
    rt.run(RunRequest::new("send 9000").run_id("r")).await.unwrap();
    let out = rt.deliver("r", Decision::deny("bob", "over the limit")).await.unwrap();
    assert_eq!(out.text, "Declined.");
    assert_eq!(count.load(Ordering::SeqCst), 0);
    let last = seen.requests().pop().unwrap();
    let Some(Message::Tool { content, .. }) = last.messages.last() else { panic!("a tool result") };
    assert_eq!(content["__denied"], true);
    assert_eq!(content["toolName"], "transfer");
    // Told that a person declined, and why; never who.
    assert_eq!(content["deniedBy"], "human");
    assert!(content["message"].as_str().unwrap().contains("Reason: over the limit."));
    assert!(!content.to_string().contains("bob"), "{content}");
}

#[tokio::test]
async fn several_pending_approvals_in_one_batch_are_all_kept() {
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("a", "transfer", r#"{"amount":1}"#), ("b", "transfer", r#"{"amount":2}"#)]),
        Turn::text("Both done."),
    ]);
    let rt = Runtime::builder().agent(AgentDef::new("bank", "x").tool(transfer(&count))).model(model).build().unwrap();
    let (events, _) = drain(rt.run(RunRequest::new("two").run_id("r"))).await;
    let pending = events
        .iter()
        .find_map(|e| match e {
            Event::Paused { pending, .. } => Some(pending.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(pending.len(), 2);
    let first = rt.deliver("r", Decision::approve("alice").for_request(&pending[0].request_id)).await.unwrap();
    assert_eq!(first.status, RunStatus::Paused, "one decision still missing");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the approved call ran while the other waits");
    let done = rt.deliver("r", Decision::approve("alice").for_request(&pending[1].request_id)).await.unwrap();
    assert_eq!(done.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 2, "each approved call ran exactly once");
}

#[tokio::test]
async fn a_decision_is_audited_with_who_when_and_from_where() {
    let count = Arc::new(AtomicUsize::new(0));
    let model = ScriptedModel::by_transcript([Turn::tool_calls([("c1", "transfer", r#"{"amount":5}"#)])]);
    let rt = Runtime::builder().agent(AgentDef::new("bank", "x").tool(transfer(&count))).model(model).build().unwrap();
    rt.run(RunRequest::new("send 5").run_id("r")).await.unwrap();
    let store = rt.store().as_ref();
    let before =
        i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
    let decision = Decision::deny("carol", "not today").via("console", "203.0.113.7");
    kuralle::record_decision(store, "r", &decision).await.unwrap();
    let record = store.get_run("r").await.unwrap().unwrap();
    let decided = kuralle::inspect::recorded_decisions(&record, &store.steps("r").await.unwrap());
    let d = decided.values().next().expect("one decision");
    assert_eq!((d.by.as_str(), d.reason.as_deref()), ("carol", Some("not today")));
    assert_eq!((d.channel.as_deref(), d.origin.as_deref()), (Some("console"), Some("203.0.113.7")));
    assert_eq!(d.clock, Some(kuralle::inspect::DecisionClock::Store));
    assert!(d.at_ms.unwrap() >= before - 1000, "{d:?}");
}
