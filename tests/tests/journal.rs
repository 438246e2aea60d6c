//! Journal semantics through the public API: replay of finished and failed steps, re-run of
//! steps left running, at-most-once, `replay = false`, scoped override keys, epochs, durable
//! helpers, ordering, limits and store outages. Runtimes sharing one store stand in for a
//! process that died and a new one that resumes.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, RunError, RunRequest, RunStatus, RunStore, Runtime, StepKind, StepStatus, StoreError, ToolError,
    journal::override_key,
    stores::MemoryStore,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::{FlakyStore, FnTool};
use serde_json::{Value, json};

fn rt(agent: AgentDef, model: ScriptedModel, store: Arc<dyn RunStore>) -> Runtime {
    Runtime::builder().agent(agent).model(model).store_arc(store).build().unwrap()
}

async fn events_of(mut handle: kuralle::RunHandle) -> (Vec<Event>, Result<kuralle::RunOutput, RunError>) {
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await)
}

fn tool_results(events: &[Event]) -> Vec<(Value, bool, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::ToolResult { result, is_error, replayed, .. } => Some((result.clone(), *is_error, *replayed)),
            _ => None,
        })
        .collect()
}

fn counting(name: &str, count: &Arc<AtomicUsize>) -> FnTool {
    let c = count.clone();
    FnTool::new(name, move |args, _| {
        let c = c.clone();
        async move {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(json!({"charged": args["amount"], "execution": n}))
        }
    })
}

fn script() -> Vec<Turn> {
    vec![Turn::tool_calls([("call_1", "charge", r#"{"amount":100}"#)]), Turn::text("Charged.")]
}

#[tokio::test]
async fn a_resumed_run_replays_finished_steps_without_calling_the_tool() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    // First process: the model fails after the charge ran.
    let first = ScriptedModel::new([script()[0].clone(), Turn::error("connection reset")]);
    let err = rt(agent.clone(), first, store.clone()).run(RunRequest::new("pay").run_id("r1")).await.unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(store.get_run("r1").await.unwrap().unwrap().status, RunStatus::Running);

    // Second process: resume; the model response and the charge replay.
    let second = ScriptedModel::by_transcript(script());
    let (events, out) = events_of(rt(agent, second.clone(), store.clone()).resume("r1")).await;
    let out = out.unwrap();
    assert_eq!(out.text, "Charged.");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the charge must not run twice");
    assert_eq!(tool_results(&events), [(json!({"charged": 100, "execution": 1}), false, true)]);
    assert_eq!(second.requests().len(), 1, "the first model response was replayed");
    let steps = store.steps("r1").await.unwrap();
    let ordinals: Vec<u64> = steps.iter().map(|s| s.ordinal).collect();
    assert_eq!(ordinals, (0..steps.len() as u64).collect::<Vec<_>>(), "gap-free");
    assert!(steps.iter().all(|s| s.status == StepStatus::Finished));
}

#[tokio::test]
async fn a_failed_step_replays_as_the_same_typed_error() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let declined = FnTool::new("charge", move |_, _| {
        let c = c.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            Err(ToolError::failed("charge", "card declined"))
        }
    });
    let agent = AgentDef::new("pay", "x").tool(declined);
    let first = ScriptedModel::new([script()[0].clone(), Turn::error("boom")]);
    let (events1, _) = events_of(rt(agent.clone(), first, store.clone()).run(RunRequest::new("pay").run_id("r"))).await;
    let (events2, out) = events_of(rt(agent, ScriptedModel::by_transcript(script()), store).resume("r")).await;
    out.unwrap();
    let (first_err, second_err) = (&tool_results(&events1)[0], &tool_results(&events2)[0]);
    assert_eq!(first_err.0, second_err.0);
    assert_eq!(second_err.0["kind"], "failed");
    assert!(second_err.2, "replayed");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

// An outage that outlasts the lease's proof: the outcome is retried on the paused clock
// until then, and the turn ends resumable.
#[tokio::test(start_paused = true)]
async fn a_step_left_running_reruns_with_the_same_idempotency_key_and_outages_are_retryable() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    let keys = Arc::new(Mutex::new(Vec::new()));
    let k = keys.clone();
    let charge = FnTool::new("charge", move |_, ctx| {
        let k = k.clone();
        async move {
            k.lock().unwrap().push(ctx.idempotency_key().to_owned());
            Ok(json!("ok"))
        }
    });
    let agent = AgentDef::new("pay", "x").tool(charge);
    flaky.fail_finish_from(1); // the model response records; the charge runs, its result cannot
    let err = rt(agent.clone(), ScriptedModel::by_transcript(script()), Arc::new(flaky.clone()))
        .run(RunRequest::new("pay").run_id("r"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Store(StoreError::Unavailable(_))), "{err:?}");
    assert!(err.is_retryable());
    let steps = memory.steps("r").await.unwrap();
    assert_eq!(steps.iter().find(|s| s.kind == StepKind::Tool).unwrap().status, StepStatus::Running);

    flaky.fail_finish(false);
    let out = rt(agent, ScriptedModel::by_transcript(script()), Arc::new(flaky)).resume("r").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "at-least-once: re-run after the crash window");
    assert_eq!(keys[0], keys[1], "same idempotency key on the retry");
    let steps = memory.steps("r").await.unwrap();
    assert_eq!(steps.iter().filter(|s| s.kind == StepKind::Tool).count(), 1, "no second intent");
}

/// A store blip while a call's outcome is written: the outcome in hand is written once the
/// store is back (the lease is still proven held), so the turn goes on and the call never runs
/// again. Before, the turn failed at once and the resumed turn ran the call a second time.
#[tokio::test(start_paused = true)]
async fn an_outcome_in_hand_survives_a_store_blip() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    flaky.fail_finish_from(1); // the model response records; the charge's outcome cannot, for now
    let healer = flaky.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        healer.fail_finish(false);
    });
    let out = rt(agent, ScriptedModel::by_transcript(script()), Arc::new(flaky))
        .run(RunRequest::new("pay").run_id("r"))
        .await;
    assert_eq!(out.unwrap().status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 1, "the charge ran once");
    let steps = memory.steps("r").await.unwrap();
    assert_eq!(steps.iter().find(|s| s.kind == StepKind::Tool).unwrap().status, StepStatus::Finished);
}

// An outage that outlasts the lease's proof: the outcome is retried on the paused clock
// until then, and the turn ends resumable.
#[tokio::test(start_paused = true)]
async fn an_at_most_once_step_left_running_is_indeterminate_and_not_rerun() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count).at_most_once());
    flaky.fail_finish_from(1);
    rt(agent.clone(), ScriptedModel::by_transcript(script()), Arc::new(flaky.clone()))
        .run(RunRequest::new("pay").run_id("r"))
        .await
        .unwrap_err();
    flaky.fail_finish(false);
    let (events, out) =
        events_of(rt(agent.clone(), ScriptedModel::by_transcript(script()), Arc::new(flaky)).resume("r")).await;
    out.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let (result, is_error, _) = &tool_results(&events)[0];
    assert!(is_error);
    assert_eq!(result["kind"], "indeterminate");
    // And it stays that way on a later replay.
    let steps = memory.steps("r").await.unwrap();
    let step = steps.iter().find(|s| s.kind == StepKind::Tool).unwrap();
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(step.error.as_ref().unwrap().to_value()["kind"], "indeterminate");
}

#[tokio::test]
async fn replay_false_tools_run_again_on_resume() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count).no_replay());
    let first = ScriptedModel::new([script()[0].clone(), Turn::error("boom")]);
    rt(agent.clone(), first, store.clone()).run(RunRequest::new("pay").run_id("r")).await.unwrap_err();
    rt(agent, ScriptedModel::by_transcript(script()), store.clone()).resume("r").await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let tool_steps = store.steps("r").await.unwrap().into_iter().filter(|s| s.kind == StepKind::Tool).count();
    assert_eq!(tool_steps, 2, "still journaled, for the record");
}

#[tokio::test]
async fn override_keys_dedupe_on_the_identifying_field_and_are_scoped() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (c, s) = (count.clone(), seen.clone());
    let charge = FnTool::new("charge", move |_, ctx| {
        let (c, s) = (c.clone(), s.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            s.lock().unwrap().push(ctx.idempotency_key().to_owned());
            Ok(json!("charged"))
        }
    })
    .key(|args| format!("charge:{}", args["amount"]));
    let model = ScriptedModel::new([
        Turn::tool_calls([("a", "charge", r#"{"amount":5,"nonce":"x1"}"#)]),
        Turn::tool_calls([("b", "charge", r#"{"amount":5,"nonce":"x2"}"#)]),
        Turn::text("ok"),
    ]);
    let (events, _) =
        events_of(rt(AgentDef::new("p", "x").tool(charge), model, store).run(RunRequest::new("go").run_id("r"))).await;
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert!(tool_results(&events)[1].2, "second call replayed the first");
    assert_eq!(seen.lock().unwrap()[0], override_key("r", 0, "charge", "charge:5"));
}

#[tokio::test]
async fn a_new_user_turn_is_a_new_epoch_but_a_resumed_turn_replays() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    let model =
        ScriptedModel::new([script()[0].clone(), script()[1].clone(), script()[0].clone(), script()[1].clone()]);
    let runtime = rt(agent, model, store.clone());
    runtime.run(RunRequest::new("pay").run_id("conv")).await.unwrap();
    let out = runtime.run(RunRequest::new("pay again").run_id("conv")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(count.load(Ordering::SeqCst), 2, "same call, new turn: runs again");
    let record = store.get_run("conv").await.unwrap().unwrap();
    assert_eq!(record.epoch, 1);
    // A finished run resumed returns its output and runs nothing.
    let again = runtime.resume("conv").await.unwrap();
    assert_eq!(again.text, "Charged.");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn inbound_idempotency_keys_start_no_second_turn() {
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    let runtime = rt(agent, ScriptedModel::by_transcript(script()), Arc::new(MemoryStore::new()));
    let req = RunRequest::new("pay").run_id("r").idempotency_key("msg-1");
    let a = runtime.run(req.clone()).await.unwrap();
    let b = runtime.run(req).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

// An outage that outlasts the lease's proof: the outcome is retried on the paused clock
// until then, and the turn ends resumable.
#[tokio::test(start_paused = true)]
async fn durable_now_and_uuid_replay_their_first_values() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let stamp = FnTool::new("stamp", |_, ctx| async move {
        let now = ctx.now().await?;
        let id = ctx.uuid().await?;
        let ms = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        Ok(json!({"now": ms, "id": id}))
    });
    // The first process records the model response, `now` and `uuid`, then cannot record the
    // stamp's own result (finish calls: model 0, now 1, uuid 2, stamp 3).
    let memory = store.clone();
    let flaky = FlakyStore::new(memory.clone());
    let agent = AgentDef::new("s", "x").tool(stamp);
    let turns = vec![Turn::tool_calls([("1", "stamp", "{}")]), Turn::text("ok")];
    flaky.fail_finish_from(3);
    let first = rt(agent.clone(), ScriptedModel::by_transcript(turns.clone()), Arc::new(flaky));
    let out = first.run(RunRequest::new("go").run_id("r")).await;
    assert!(out.is_err());
    let steps = memory.steps("r").await.unwrap();
    let stamp = steps.iter().find(|s| s.kind == StepKind::Tool).unwrap();
    assert_eq!(stamp.status, StepStatus::Running, "the first attempt's result was not recorded");
    tokio::time::sleep(Duration::from_millis(5)).await;
    // The resumed run re-runs the stamp tool, whose `now` and `uuid` replay.
    let (e2, out) = events_of(rt(agent, ScriptedModel::by_transcript(turns), memory.clone()).resume("r")).await;
    out.unwrap();
    let (again, is_error, replayed) = tool_results(&e2)[0].clone();
    assert!(!is_error && !replayed, "the stamp tool itself ran again");
    let recorded: Vec<Value> = memory
        .steps("r")
        .await
        .unwrap()
        .iter()
        .filter(|s| s.kind != StepKind::Tool && s.kind != StepKind::Model)
        .map(|s| s.result.as_ref().unwrap().to_value())
        .collect();
    assert_eq!(recorded, [again["now"].clone(), again["id"].clone()]);
    let kinds: Vec<StepKind> = memory.steps("r").await.unwrap().iter().map(|s| s.kind).collect();
    assert!(kinds.contains(&StepKind::Now) && kinds.contains(&StepKind::Uuid));
}

#[tokio::test]
async fn parallel_calls_are_journaled_in_source_order() {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let tool = FnTool::new("read", |args, _| async move {
        let i = args["i"].as_u64().unwrap();
        tokio::time::sleep(Duration::from_millis(100 - 30 * i)).await; // finishes 3, 2, 1
        Ok(json!(i))
    })
    .parallel();
    let model = ScriptedModel::new([
        Turn::tool_calls([("a", "read", r#"{"i":1}"#), ("b", "read", r#"{"i":2}"#), ("c", "read", r#"{"i":3}"#)]),
        Turn::text("ok"),
    ]);
    rt(AgentDef::new("r", "x").tool(tool), model, store.clone()).run(RunRequest::new("go").run_id("r")).await.unwrap();
    let steps = store.steps("r").await.unwrap();
    let tools: Vec<_> =
        steps.iter().filter(|s| s.kind == StepKind::Tool).map(|s| s.result.as_ref().unwrap().to_value()).collect();
    assert_eq!(tools, [json!(1), json!(2), json!(3)]);
}

#[tokio::test]
async fn journal_and_result_limits_are_typed_errors() {
    let tool = FnTool::new("big", |_, _| async { Ok(Value::String("x".repeat(2000))) });
    let model = ScriptedModel::new([Turn::tool_calls([("1", "big", "{}")]), Turn::text("ok")]);
    let runtime = Runtime::builder()
        .agent(AgentDef::new("b", "x").tool(tool))
        .model(model)
        .max_value_bytes(1000)
        .build()
        .unwrap();
    let (events, out) = events_of(runtime.run("go")).await;
    out.unwrap();
    let (result, is_error, _) = &tool_results(&events)[0];
    assert!(is_error);
    assert_eq!(result["kind"], "invalid_output");
    assert!(result["message"].as_str().unwrap().contains("limit is 1000 bytes"));

    let again = FnTool::new("again", |_, _| async { Ok(json!(1)) });
    let model = ScriptedModel::new((0..10).map(|i| Turn::tool_calls([(format!("c{i}"), "again", "{}")])));
    let runtime = Runtime::builder()
        .agent(AgentDef::new("b", "x").tool(again).max_steps(10))
        .model(model)
        .max_journal_entries(5)
        .build()
        .unwrap();
    let err = runtime.run(RunRequest::new("go").run_id("limited")).await.unwrap_err();
    assert!(matches!(err, RunError::StepLimit { limit: 5, .. }), "{err:?}");
    assert!(!err.is_retryable());
    let record = runtime.get_run("limited").await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Failed, "resuming cannot fix a full journal");
}

/// A model that notes when it is asked, on Tokio's clock.
struct Timed {
    inner: ScriptedModel,
    asked: Arc<Mutex<Vec<tokio::time::Instant>>>,
}

impl kuralle::Model for Timed {
    fn name(&self) -> &str {
        "timed"
    }

    fn stream(
        &self,
        request: kuralle::ModelRequest,
    ) -> futures::stream::BoxStream<'static, Result<kuralle::ModelEvent, kuralle::ModelError>> {
        self.asked.lock().unwrap().push(tokio::time::Instant::now());
        self.inner.stream(request)
    }
}

/// A runtime over `store` whose model notes when it is asked.
fn timed_rt(
    agent: AgentDef,
    model: ScriptedModel,
    store: FlakyStore,
) -> (Runtime, Arc<Mutex<Vec<tokio::time::Instant>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let model = Timed { inner: model, asked: Arc::clone(&asked) };
    let runtime = Runtime::builder().agent(agent).model(model).store_arc(Arc::new(store)).build().unwrap();
    (runtime, asked)
}

/// A tool that notes the idempotency key of each execution.
fn keyed(name: &str, keys: &Arc<Mutex<Vec<String>>>) -> FnTool {
    let keys = Arc::clone(keys);
    FnTool::new(name, move |_, ctx| {
        let keys = Arc::clone(&keys);
        async move {
            keys.lock().unwrap().push(ctx.idempotency_key().to_owned());
            Ok(json!("ok"))
        }
    })
}

/// A call's outcome commits while the model is asked: the next request goes out without
/// waiting for the commit, and the turn's next write (here its close) waits for it. Before,
/// the request waited: each turn paid two commits in a row. (This wrapper journals a model
/// response with its calls' intents as an append and a finish, so that write is slow too: times
/// count from the call's execution.)
#[tokio::test(start_paused = true)]
async fn a_calls_outcome_commits_while_the_model_is_asked() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    flaky.delay_finish(Duration::from_secs(5));
    let ran = Arc::new(Mutex::new(None));
    let at = Arc::clone(&ran);
    let charge = FnTool::new("charge", move |_, _| {
        let at = Arc::clone(&at);
        async move {
            *at.lock().unwrap() = Some(tokio::time::Instant::now());
            Ok(json!("ok"))
        }
    });
    let (runtime, asked) =
        timed_rt(AgentDef::new("pay", "x").tool(charge), ScriptedModel::by_transcript(script()), flaky);
    let out = runtime.run(RunRequest::new("pay").run_id("r")).await.unwrap();
    let ran = ran.lock().unwrap().expect("the call ran");
    let ended = ran.elapsed();
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[1], ran, "asked again as the call ended, before its outcome committed");
    assert!(ended >= Duration::from_secs(5), "the run ended after it committed: {ended:?}");
    assert_eq!(out.status, RunStatus::Finished);
    let steps = memory.steps("r").await.unwrap();
    let journaled: Vec<_> = steps.iter().map(|s| (s.kind, s.status)).collect();
    let finished = StepStatus::Finished;
    assert_eq!(journaled, [(StepKind::Model, finished), (StepKind::Tool, finished), (StepKind::Model, finished)]);
    assert!(memory.current_lease("r").await.unwrap().is_none(), "given up after the outcome landed");
}

/// A store over `memory` whose call outcomes fail a second after they are sent, once the model
/// response (the first `finish_step`, in this wrapper) has recorded.
fn outcomes_failing_late(memory: &Arc<dyn RunStore>) -> FlakyStore {
    let flaky = FlakyStore::new(Arc::clone(memory));
    flaky.delay_finish(Duration::from_secs(1));
    flaky.fail_finish_from(1);
    flaky
}

/// An outcome whose write fails after the model was asked: the model's answer, which saw the
/// outcome, is not journaled; the turn ends with the store's error, resumable, and the resumed
/// turn runs the call again with the same key (at-least-once, as for a crash before the commit).
#[tokio::test(start_paused = true)]
async fn an_outcome_that_fails_after_the_model_was_asked_is_the_turns_error() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = outcomes_failing_late(&memory);
    let keys = Arc::new(Mutex::new(Vec::new()));
    let agent = AgentDef::new("pay", "x").tool(keyed("charge", &keys));
    let (runtime, asked) = timed_rt(agent.clone(), ScriptedModel::by_transcript(script()), flaky.clone());
    let err = runtime.run(RunRequest::new("pay").run_id("r")).await.unwrap_err();
    assert!(matches!(err, RunError::Store(StoreError::Unavailable(_))), "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(asked.lock().unwrap().len(), 2, "the model was asked while the outcome was in flight");
    let steps = memory.steps("r").await.unwrap();
    let journaled: Vec<_> = steps.iter().map(|s| (s.kind, s.status)).collect();
    assert_eq!(journaled, [(StepKind::Model, StepStatus::Finished), (StepKind::Tool, StepStatus::Running)]);
    assert_eq!(memory.get_run("r").await.unwrap().unwrap().status, RunStatus::Running);

    flaky.fail_finish(false);
    let (runtime, _) = timed_rt(agent, ScriptedModel::by_transcript(script()), flaky);
    assert_eq!(runtime.resume("r").await.unwrap().status, RunStatus::Finished);
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "the call runs again");
    assert_eq!(keys[0], keys[1], "with the same idempotency key");
}

/// A model outage while a call's outcome is failing to commit: the run reports the lost
/// outcome, not the model.
#[tokio::test(start_paused = true)]
async fn a_lost_outcome_outranks_a_model_outage() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = outcomes_failing_late(&memory);
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    let model = ScriptedModel::new([script()[0].clone(), Turn::error("connection reset")]);
    let (runtime, _) = timed_rt(agent, model, flaky);
    let err = runtime.run(RunRequest::new("pay").run_id("r")).await.unwrap_err();
    assert!(matches!(err, RunError::Store(StoreError::Unavailable(_))), "{err:?}");
}

/// A turn that ends (here on a model outage) while a call's outcome is in flight gives its lease
/// up only once the outcome committed: given up first, the write would be fenced and lost. Two
/// waits guard it: the turn's, which looks for a lost outcome to report, and the release's
/// own; the test fails only with both removed.
#[tokio::test(start_paused = true)]
async fn a_turn_keeps_its_lease_until_its_outcome_commits() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    flaky.delay_finish(Duration::from_secs(5));
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    let model = ScriptedModel::new([script()[0].clone(), Turn::error("connection reset")]);
    let (runtime, _) = timed_rt(agent, model, flaky);
    let err = runtime.run(RunRequest::new("pay").run_id("r")).await.unwrap_err();
    assert!(matches!(err, RunError::Model(_)), "{err:?}");
    let steps = memory.steps("r").await.unwrap();
    assert_eq!(steps.iter().find(|s| s.kind == StepKind::Tool).unwrap().status, StepStatus::Finished);
    assert!(memory.current_lease("r").await.unwrap().is_none());
}

/// A tool that, the first time it runs, sets whether `flaky`'s outcome writes fail.
fn switching(name: &str, flaky: &FlakyStore, fail: bool) -> FnTool {
    let flaky = flaky.clone();
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    FnTool::new(name, move |_, _| {
        if first.swap(false, Ordering::SeqCst) {
            flaky.fail_finish(fail);
        }
        async { Ok(json!("ok")) }
    })
}

/// A lost outcome fails every later write of the turn, not only the next: here the next is the
/// second call's intent (a batch of its own), whose append must not take the loss for an outage
/// of its own, retry and go on. Before, it did: the turn finished, journaling two model
/// responses after an outcome it had lost.
#[tokio::test(start_paused = true)]
async fn a_lost_outcome_fails_every_later_write_of_the_turn() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    flaky.delay_finish(Duration::from_secs(1));
    // `a`'s outcome cannot be written; `b`, if it ran, would heal the store.
    let agent = AgentDef::new("pay", "x").tool(switching("a", &flaky, true)).tool(switching("b", &flaky, false));
    let turns = || vec![Turn::tool_calls([("1", "a", "{}"), ("2", "b", "{}")]), Turn::text("Done.")];
    let err = rt(agent.clone(), ScriptedModel::by_transcript(turns()), Arc::new(flaky.clone()))
        .run(RunRequest::new("go").run_id("r"))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Store(StoreError::Unavailable(_))), "{err:?}");
    let steps = memory.steps("r").await.unwrap();
    let journaled: Vec<_> = steps.iter().map(|s| (s.name.as_str(), s.status)).collect();
    assert_eq!(journaled, [("model", StepStatus::Finished), ("a", StepStatus::Running)], "nothing after the loss");
    assert_eq!(memory.get_run("r").await.unwrap().unwrap().status, RunStatus::Running, "resumable");

    flaky.fail_finish(false);
    let out = rt(agent, ScriptedModel::by_transcript(turns()), Arc::new(flaky)).resume("r").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
}

/// A store whose outcome writes are parked (as SQLite's are): the model is asked at once; an
/// outage that refused the outcome is tried again by the run's next write, which reads it.
#[tokio::test(start_paused = true)]
async fn a_parked_outcome_refused_by_an_outage_is_tried_again_by_the_next_write() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let flaky = FlakyStore::new(memory.clone());
    flaky.park_finishes(true);
    flaky.fail_finish_from(1); // the model response records; the charge's outcome cannot, for now
    let healer = flaky.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        healer.fail_finish(false);
    });
    let count = Arc::new(AtomicUsize::new(0));
    let agent = AgentDef::new("pay", "x").tool(counting("charge", &count));
    let (runtime, asked) = timed_rt(agent, ScriptedModel::by_transcript(script()), flaky);
    let start = tokio::time::Instant::now();
    let out = runtime.run(RunRequest::new("pay").run_id("r")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    let asked = asked.lock().unwrap().clone();
    assert!(asked[1] - start < Duration::from_millis(400), "asked while the outcome waited");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the charge ran once");
    let steps = memory.steps("r").await.unwrap();
    assert_eq!(steps.iter().find(|s| s.kind == StepKind::Tool).unwrap().status, StepStatus::Finished);
}

/// An outcome the store refuses for good (larger than it takes) after the model was asked: the
/// turn ends with that refusal, and the run is marked failed, although every other write of the
/// turn fails with the lost outcome: marking the run builds on none of them.
#[tokio::test(start_paused = true)]
async fn a_run_ended_by_a_lost_outcome_is_marked_failed() {
    let memory: Arc<dyn RunStore> = Arc::new(MemoryStore::new().with_max_value_bytes(2_048));
    let flaky = FlakyStore::new(memory.clone());
    flaky.park_finishes(true);
    flaky.delay_finish(Duration::from_secs(1));
    let big = FnTool::new("big", |_, _| async { Ok(json!("x".repeat(4_096))) });
    let turns = [Turn::tool_calls([("1", "big", "{}")]), Turn::text("Done.")];
    let (runtime, asked) = timed_rt(AgentDef::new("a", "x").tool(big), ScriptedModel::by_transcript(turns), flaky);
    let err = runtime.run(RunRequest::new("go").run_id("r")).await.unwrap_err();
    assert!(matches!(err, RunError::Store(StoreError::LimitExceeded(_))), "{err:?}");
    assert_eq!(asked.lock().unwrap().len(), 2, "the model was asked while the outcome was parked");
    let steps = memory.steps("r").await.unwrap();
    let journaled: Vec<_> = steps.iter().map(|s| (s.name.as_str(), s.status)).collect();
    assert_eq!(journaled, [("model", StepStatus::Finished), ("big", StepStatus::Running)]);
    assert_eq!(memory.get_run("r").await.unwrap().unwrap().status, RunStatus::Failed);
}
