//! Run limits end to end (issue 25 part 2), on `MemoryStore` and `SqliteStore`: each cap stops
//! the run before the request or batch that would pass it, a refused batch runs none of its
//! calls, the run ends `limit_exceeded` with an event naming the cap, request limits tighten
//! agent limits, a dollar cap needs a price at `build()`, and a resumed run (in a second
//! runtime on the same SQLite file) keeps what it spent instead of starting on a fresh budget.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Amount, Event, Limit, Pricing, RunError, RunLimits, RunRequest, RunStatus, RunStore, Runtime, StepKind,
    stores::{MemoryStore, SqliteStore},
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::FnTool;
use serde_json::json;

/// A parallel-safe tool that counts how many times its body ran.
fn counted(name: &str, ran: &Arc<AtomicUsize>) -> FnTool {
    let ran = Arc::clone(ran);
    FnTool::new(name, move |_, _| {
        let ran = Arc::clone(&ran);
        async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"ok": true}))
        }
    })
    .parallel()
}

/// A fresh store of each kind; the temp dir keeps the SQLite file alive.
fn stores() -> Vec<(&'static str, Arc<dyn RunStore>, tempfile::TempDir)> {
    let memory = tempfile::tempdir().unwrap();
    let sqlite = tempfile::tempdir().unwrap();
    let file = SqliteStore::open(sqlite.path().join("runs.db")).unwrap();
    vec![("memory", Arc::new(MemoryStore::new()), memory), ("sqlite", Arc::new(file), sqlite)]
}

/// What a run that a limit stopped left behind.
struct Stopped {
    error: RunError,
    events: Vec<Event>,
    status: RunStatus,
    tool_steps: usize,
    model_steps: usize,
}

impl Stopped {
    /// The one `LimitExceeded` event: (limit, used, max).
    fn exceeded(&self) -> (Limit, Amount, Amount) {
        let found: Vec<_> = self
            .events
            .iter()
            .filter_map(|e| match e {
                Event::LimitExceeded { limit, used, max, .. } => Some((*limit, *used, *max)),
                _ => None,
            })
            .collect();
        assert_eq!(found.len(), 1, "one LimitExceeded event: {:?}", self.events);
        found[0]
    }
}

async fn run_to_limit(runtime: &Runtime, req: RunRequest) -> Stopped {
    let run_id = "run-1";
    let mut handle = runtime.run(req.run_id(run_id));
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    let error = handle.await.expect_err("the run should be stopped by a limit");
    let status = runtime.get_run(run_id).await.unwrap().unwrap().status;
    let journal = runtime.journal(run_id).await.unwrap();
    let count = |k: StepKind| journal.iter().filter(|s| s.kind == k).count();
    Stopped { error, events, status, tool_steps: count(StepKind::Tool), model_steps: count(StepKind::Model) }
}

/// A journaled step's result as JSON.
fn result_of(step: &kuralle::StepRecord) -> serde_json::Value {
    step.result.as_ref().expect("a finished step").decode().unwrap()
}

/// Two batches of two calls, then an answer.
fn two_batches() -> Vec<Turn> {
    vec![
        Turn::tool_calls([("a", "work", "{}"), ("b", "work", "{}")]),
        Turn::tool_calls([("c", "work", "{}"), ("d", "work", "{}")]),
        Turn::text("done"),
    ]
}

fn runtime(store: &Arc<dyn RunStore>, agent: AgentDef, turns: Vec<Turn>) -> Runtime {
    Runtime::builder().agent(agent).model(ScriptedModel::new(turns)).store_arc(Arc::clone(store)).build().unwrap()
}

fn agent(ran: &Arc<AtomicUsize>) -> AgentDef {
    AgentDef::new("worker", "Work.").tool(counted("work", ran))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_would_pass_the_tool_call_limit_runs_no_call() {
    for (name, store, _dir) in stores() {
        let ran = Arc::new(AtomicUsize::new(0));
        let rt = runtime(&store, agent(&ran).limits(RunLimits::new().max_tool_calls(3)), two_batches());
        let stopped = run_to_limit(&rt, RunRequest::new("go")).await;
        // The first batch (2 calls) fits; the second (2 more, 4 > 3) does not start at all.
        assert_eq!(ran.load(Ordering::SeqCst), 2, "{name}: no call of the refused batch ran");
        assert_eq!(stopped.tool_steps, 2, "{name}: no intent was journaled for the refused batch");
        assert_eq!(stopped.exceeded(), (Limit::ToolCalls, 2u64.into(), 3u64.into()), "{name}");
        assert_eq!(stopped.status, RunStatus::LimitExceeded, "{name}");
        assert!(
            matches!(stopped.error, RunError::LimitExceeded { limit: Limit::ToolCalls, .. }),
            "{name}: {:?}",
            stopped.error
        );
        // The refused batch was never announced.
        let announced: Vec<_> = stopped
            .events
            .iter()
            .filter_map(|e| match e {
                Event::ToolCall { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(announced, ["a", "b"], "{name}");
        // Its model response was spent, so it is journaled.
        assert_eq!(stopped.model_steps, 2, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_limit_refuses_the_request_past_it() {
    for (name, store, _dir) in stores() {
        let ran = Arc::new(AtomicUsize::new(0));
        let rt = runtime(&store, agent(&ran).limits(RunLimits::new().max_requests(1)), two_batches());
        let stopped = run_to_limit(&rt, RunRequest::new("go")).await;
        assert_eq!(stopped.exceeded(), (Limit::Requests, 1u64.into(), 1u64.into()), "{name}");
        assert_eq!(stopped.status, RunStatus::LimitExceeded, "{name}");
        assert_eq!(stopped.model_steps, 1, "{name}");
        assert_eq!(ran.load(Ordering::SeqCst), 2, "{name}: the first batch ran");
    }
}

/// Each token cap: reached by the first response, it refuses the second request, and the
/// event's `used` is what the journaled first response spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_token_limit_stops_the_run_once_reached() {
    let caps: [(Limit, RunLimits); 3] = [
        (Limit::TotalTokens, RunLimits::new().max_total_tokens(1)),
        (Limit::InputTokens, RunLimits::new().max_input_tokens(1)),
        (Limit::OutputTokens, RunLimits::new().max_output_tokens(1)),
    ];
    for (name, store, _dir) in stores() {
        for (i, (limit, caps)) in caps.iter().enumerate() {
            let ran = Arc::new(AtomicUsize::new(0));
            let rt = runtime(&store, agent(&ran), two_batches());
            let run_id = format!("tokens-{i}");
            let mut handle = rt.run(RunRequest::new("go").run_id(&run_id).limits(*caps));
            let mut seen = None;
            while let Some(e) = handle.next().await {
                if let Event::LimitExceeded { limit, used, max, .. } = e {
                    seen = Some((limit, used, max));
                }
            }
            assert!(matches!(handle.await, Err(RunError::LimitExceeded { .. })), "{name} {limit}");
            let journal = rt.journal(&run_id).await.unwrap();
            let models: Vec<_> = journal.iter().filter(|s| s.kind == StepKind::Model).collect();
            assert_eq!(models.len(), 1, "{name} {limit}: the second request was never sent");
            let usage = &result_of(models[0])["usage"];
            let (input, output) = (usage["input_tokens"].as_u64().unwrap(), usage["output_tokens"].as_u64().unwrap());
            let spent = match limit {
                Limit::TotalTokens => input + output,
                Limit::InputTokens => input,
                _ => output,
            };
            assert!(spent > 1, "{name} {limit}: the scripted response spent tokens");
            assert_eq!(seen, Some((*limit, spent.into(), 1u64.into())), "{name}");
            assert_eq!(rt.get_run(&run_id).await.unwrap().unwrap().status, RunStatus::LimitExceeded);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_limit_stops_the_run_with_the_priced_spend() {
    for (name, store, _dir) in stores() {
        let ran = Arc::new(AtomicUsize::new(0));
        // A dollar per input token: the first response alone passes 50 cents.
        let rt = Runtime::builder()
            .agent(agent(&ran).limits(RunLimits::new().max_cost_usd(0.5)))
            .model(ScriptedModel::new(two_batches()))
            .pricing("scripted", Pricing::new(1_000_000.0, 0.0))
            .store_arc(Arc::clone(&store))
            .build()
            .unwrap();
        let stopped = run_to_limit(&rt, RunRequest::new("go")).await;
        let (limit, used, max) = stopped.exceeded();
        assert_eq!((limit, max), (Limit::CostUsd, 0.5.into()), "{name}");
        let journal = rt.journal("run-1").await.unwrap();
        let first = journal.iter().find(|s| s.kind == StepKind::Model).unwrap();
        let result = result_of(first);
        // The journaled cost is the input tokens at a dollar each.
        assert_eq!(result["cost_usd"].as_f64(), result["usage"]["input_tokens"].as_f64(), "{name}");
        assert_eq!(used.value(), result["cost_usd"].as_f64().unwrap(), "{name}");
        assert_eq!(stopped.model_steps, 1, "{name}");
        assert_eq!(stopped.status, RunStatus::LimitExceeded, "{name}");
    }
}

#[test]
fn a_cost_limit_on_a_model_without_a_price_is_a_config_error_at_build() {
    let ran = Arc::new(AtomicUsize::new(0));
    let build = |pricing: Option<(&str, Pricing)>| {
        let mut b = Runtime::builder()
            .agent(agent(&ran).limits(RunLimits::new().max_cost_usd(1.0)))
            .model(ScriptedModel::new([]));
        if let Some((model, price)) = pricing {
            b = b.pricing(model, price);
        }
        b.build()
    };
    let Err(RunError::Config(message)) = build(None) else { panic!("expected a config error") };
    assert!(message.contains("max_cost_usd") && message.contains("scripted"), "{message}");
    // A price for another model does not count.
    assert!(matches!(build(Some(("gpt-4o", Pricing::new(1.0, 1.0)))), Err(RunError::Config(_))));
    assert!(matches!(build(Some(("scripted", Pricing::new(-1.0, 1.0)))), Err(RunError::Config(_))));
    assert!(build(Some(("scripted", Pricing::new(1.0, 1.0)))).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cost_limit_on_an_unpriced_model_records_nothing() {
    let ran = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let rt = runtime(&store, agent(&ran), two_batches());
    let result = rt.run(RunRequest::new("go").run_id("r").limits(RunLimits::new().max_cost_usd(1.0))).await;
    assert!(matches!(result, Err(RunError::Config(_))), "{result:?}");
    assert!(rt.get_run("r").await.unwrap().is_none(), "refused before the run was recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_tighten_agent_limits_and_never_loosen_them() {
    for (name, store, _dir) in stores() {
        let ran = Arc::new(AtomicUsize::new(0));
        // The request's cap is tighter than the agent's.
        let rt = runtime(&store, agent(&ran).limits(RunLimits::new().max_requests(5)), two_batches());
        let stopped = run_to_limit(&rt, RunRequest::new("go").limits(RunLimits::new().max_requests(1))).await;
        assert_eq!(stopped.exceeded(), (Limit::Requests, 1u64.into(), 1u64.into()), "{name}");

        // The request's cap is looser: the agent's still holds.
        let (_, store, _dir) = stores().swap_remove(if name == "memory" { 0 } else { 1 });
        let rt = runtime(&store, agent(&ran).limits(RunLimits::new().max_tool_calls(3)), two_batches());
        let stopped = run_to_limit(&rt, RunRequest::new("go").limits(RunLimits::new().max_tool_calls(100))).await;
        assert_eq!(stopped.exceeded(), (Limit::ToolCalls, 2u64.into(), 3u64.into()), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_within_their_limits_finish() {
    for (name, store, _dir) in stores() {
        let ran = Arc::new(AtomicUsize::new(0));
        let limits = RunLimits::new().max_requests(3).max_tool_calls(4).max_total_tokens(1_000_000);
        let rt = runtime(&store, agent(&ran).limits(limits), two_batches());
        let out = rt.run(RunRequest::new("go")).await.unwrap();
        assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "done"), "{name}");
        assert_eq!(ran.load(Ordering::SeqCst), 4, "{name}");
    }
}

/// The deadline, on tokio's paused clock: a tool that takes ten (virtual) seconds puts the
/// run past its five-second deadline, so the next request is refused.
#[tokio::test(start_paused = true)]
async fn the_deadline_stops_the_run_on_a_paused_clock() {
    let slow = FnTool::new("work", |_, _| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok(json!({"ok": true}))
    });
    let agent = AgentDef::new("worker", "Work.").tool(slow).limits(RunLimits::new().deadline(Duration::from_secs(5)));
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let rt = runtime(&store, agent, vec![Turn::tool_calls([("a", "work", "{}")]), Turn::text("done")]);
    let stopped = run_to_limit(&rt, RunRequest::new("go")).await;
    let (limit, used, max) = stopped.exceeded();
    assert_eq!((limit, max), (Limit::Deadline, 5u64.into()));
    assert!(used.value() >= 10.0, "{used}");
    assert_eq!(stopped.status, RunStatus::LimitExceeded);
    assert_eq!(stopped.model_steps, 1);
}

/// A run stopped by a model failure, then resumed by a second runtime on the same SQLite file
/// (as a restarted process would): its journal says two tool calls were spent, so a batch of
/// two more passes its cap of three, though a fresh budget would have let it run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_keeps_what_it_spent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let ran = Arc::new(AtomicUsize::new(0));

    let first = Runtime::builder()
        .agent(agent(&ran))
        .model(ScriptedModel::new([
            Turn::tool_calls([("a", "work", "{}"), ("b", "work", "{}")]),
            Turn::error("overloaded"),
        ]))
        .store(SqliteStore::open(&path).unwrap())
        .build()
        .unwrap();
    let req = RunRequest::new("go").run_id("run-1").limits(RunLimits::new().max_tool_calls(3));
    let failed = first.run(req).await;
    assert!(matches!(failed, Err(RunError::Model(_))), "{failed:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert_eq!(first.get_run("run-1").await.unwrap().unwrap().status, RunStatus::Running);
    drop(first);

    // A second runtime: the limits were kept with the run, and its journal holds the spend.
    let second = Runtime::builder()
        .agent(agent(&ran))
        .model(ScriptedModel::by_transcript(two_batches()))
        .store(SqliteStore::open(&path).unwrap())
        .build()
        .unwrap();
    let mut handle = second.resume("run-1");
    let mut exceeded = None;
    while let Some(e) = handle.next().await {
        if let Event::LimitExceeded { limit, used, max, .. } = e {
            exceeded = Some((limit, used, max));
        }
    }
    assert!(matches!(handle.await, Err(RunError::LimitExceeded { .. })));
    assert_eq!(exceeded, Some((Limit::ToolCalls, 2u64.into(), 3u64.into())));
    assert_eq!(ran.load(Ordering::SeqCst), 2, "the resumed run got no fresh budget");
    assert_eq!(second.get_run("run-1").await.unwrap().unwrap().status, RunStatus::LimitExceeded);
    // Resuming a stopped run gives its recorded outcome back and runs nothing.
    let again = second.resume("run-1").await.unwrap();
    assert_eq!(again.status, RunStatus::LimitExceeded, "a stopped run gives its outcome back");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}
