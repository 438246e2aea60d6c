//! Issue 16: what a hostile model, a broken tool or a misbehaving consumer sends cannot take a
//! run down or hold it open. Each test drives the public runtime API.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, MAX_TOOL_ARGS_BYTES, Message, RunError, RunOutput, RunStatus, Runtime, StepKind, ToolError,
    parse_args, progress,
    testing::{ScriptedModel, Turn},
    tool,
};
use kuralle_tests::{FnTool, tool_results as results};
use serde_json::{Value, json};

async fn run_collect(runtime: &Runtime, input: &str) -> (Vec<Event>, RunOutput) {
    let mut handle = runtime.run(kuralle::RunRequest::new(input).run_id("r"));
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await.expect("run succeeds"))
}

fn echo() -> FnTool {
    FnTool::new("echo", |args, _ctx| async move { Ok(args) }).parallel()
}

/// The tool messages of the `n`th model request, as `(call_id, content)`.
fn tool_messages(model: &ScriptedModel, n: usize) -> Vec<(String, Value)> {
    model.requests()[n]
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { call_id, content, .. } => Some((call_id.to_string(), content.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn an_oversized_argument_fails_only_its_call_and_is_not_journaled() {
    let huge = format!(r#"{{"text":"{}"}}"#, "x".repeat(10 << 20));
    let model = ScriptedModel::new([
        Turn::tool_calls([("big", "echo", huge.as_str()), ("small", "echo", r#"{"text":"hi"}"#)]),
        Turn::text("done"),
    ]);
    let rt = Runtime::builder().agent(AgentDef::new("a", "x").tool(echo())).model(model.clone()).build().unwrap();
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished, "the run goes on");

    let r = results(&events);
    assert_eq!(r.len(), 2);
    assert_eq!((r[0].0.as_str(), r[0].2), ("big", true));
    assert_eq!(r[0].1["kind"], "invalid_input");
    let message = r[0].1["message"].as_str().unwrap();
    assert!(message.contains(&format!("the limit is {MAX_TOOL_ARGS_BYTES} bytes")), "{message}");
    assert_eq!(r[1], ("small".to_owned(), json!({"text": "hi"}), false));

    // Nothing oversized is journaled: the model step holds a marker in place of the arguments,
    // and that marker gets exactly the answer the live call got.
    let journal = rt.journal("r").await.unwrap();
    for step in &journal {
        let size = step.result.as_ref().map_or(4, kuralle::JsonText::len);
        assert!(size < 64 * 1024, "step {} ({:?}) is {size} bytes", step.ordinal, step.kind);
    }
    let model_step = journal.iter().find(|s| s.kind == StepKind::Model).unwrap();
    let marker =
        model_step.result.as_ref().unwrap().to_value()["parts"][0]["call"]["arguments"].as_str().unwrap().to_owned();
    let replayed = parse_args("echo", &marker).unwrap_err();
    assert!(matches!(replayed, ToolError::InvalidInput { .. }));
    assert_eq!(replayed.to_string(), message);

    // The transcript sent back carries the marker, not 10 MB.
    let request = serde_json::to_string(&model.requests()[1]).unwrap();
    assert!(request.len() < 64 * 1024, "second request is {} bytes", request.len());
}

#[tokio::test]
async fn arguments_that_together_exceed_the_journal_cap_are_refused_largest_first() {
    let args = |n: usize| format!(r#"{{"text":"{}"}}"#, "y".repeat(n));
    let (a, b, c) = (args(300_000), args(600_000), args(100_000));
    let model = ScriptedModel::new([
        Turn::tool_calls([("a", "echo", a.as_str()), ("b", "echo", b.as_str()), ("c", "echo", c.as_str())]),
        Turn::text("done"),
    ]);
    let rt = Runtime::builder()
        .agent(AgentDef::new("a", "x").tool(echo()))
        .model(model)
        .max_value_bytes(700_000)
        .build()
        .unwrap();
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished);
    let errors: Vec<(String, bool)> = results(&events).into_iter().map(|(id, _, e)| (id, e)).collect();
    assert_eq!(errors, [("a".into(), false), ("b".into(), true), ("c".into(), false)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_blocks_its_thread_does_not_hold_the_handle_open() {
    let finished = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&finished);
    let blocking = FnTool::new("block", move |_args, _ctx| {
        let finished = Arc::clone(&seen);
        async move {
            std::thread::sleep(Duration::from_millis(1500));
            finished.store(true, Ordering::SeqCst);
            Ok(json!("late"))
        }
    })
    .timeout(Duration::from_millis(100));
    let model = ScriptedModel::new([Turn::tool_calls([("c", "block", "{}")]), Turn::text("gave up")]);
    let rt = Runtime::builder().agent(AgentDef::new("a", "x").tool(blocking)).model(model).build().unwrap();
    let (events, out) = run_collect(&rt, "go").await;
    // The stream and the output came while the tool was still asleep.
    assert!(!finished.load(Ordering::SeqCst), "the handle waited for the blocked tool");
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(results(&events)[0].1["kind"], "timeout");
    assert!(matches!(events.last(), Some(Event::Done { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_never_returns_does_not_hang_the_event_loop() {
    let stop = Arc::new(AtomicBool::new(false));
    let spinning = Arc::new(AtomicBool::new(false));
    let (stop_in, spinning_in) = (Arc::clone(&stop), Arc::clone(&spinning));
    // Burns its thread without ever yielding (until the test lets it go, so it does not
    // outlive the test).
    let spin = FnTool::new("spin", move |_args, _ctx| {
        let (stop, spinning) = (Arc::clone(&stop_in), Arc::clone(&spinning_in));
        async move {
            spinning.store(true, Ordering::SeqCst);
            while !stop.load(Ordering::SeqCst) {
                std::hint::spin_loop();
            }
            spinning.store(false, Ordering::SeqCst);
            Ok(json!(null))
        }
    })
    .timeout(Duration::from_millis(50));
    let model = ScriptedModel::new([Turn::tool_calls([("c", "spin", "{}")]), Turn::text("moved on")]);
    let rt = Runtime::builder().agent(AgentDef::new("a", "x").tool(spin)).model(model).build().unwrap();
    let (events, out) = run_collect(&rt, "go").await;
    let still_spinning = spinning.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    assert!(still_spinning, "the run ended while the call was still running");
    assert_eq!(out.text, "moved on");
    assert_eq!(results(&events)[0].1["kind"], "timeout");
}

#[tokio::test]
async fn a_five_megabyte_result_reaches_the_model_truncated_and_the_journal_whole() {
    let big = FnTool::new("dump", |_args, _ctx| async move {
        let mut text = String::from("HEAD-MARK ");
        text.push_str(&"0123456789".repeat(500_000));
        text.push_str(" TAIL-MARK");
        Ok(Value::String(text))
    });
    let model = ScriptedModel::new([Turn::tool_calls([("c", "dump", "{}")]), Turn::text("ok")]);
    let rt = Runtime::builder().agent(AgentDef::new("a", "x").tool(big)).model(model.clone()).build().unwrap();
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished);
    assert!(!results(&events)[0].2, "a 5 MB result is not an error");

    let seen = tool_messages(&model, 1);
    let truncated = &seen[0].1;
    let shown = truncated["value"].as_str().expect("a truncated value");
    assert!(shown.starts_with("HEAD-MARK") && shown.ends_with("TAIL-MARK"));
    let shown_tokens = truncated["__truncated"]["shownTokens"].as_u64().unwrap();
    assert!(shown_tokens <= kuralle::DEFAULT_MAX_TOOL_RESULT_TOKENS as u64);

    let journal = rt.journal("r").await.unwrap();
    let step = journal.iter().find(|s| s.kind == StepKind::Tool).unwrap();
    assert_eq!(step.result.as_ref().unwrap().to_value().as_str().unwrap().len(), 5_000_020);
}

#[tokio::test]
async fn a_result_beyond_the_journal_cap_is_a_clear_error_for_the_model() {
    let big = FnTool::new("dump", |_args, _ctx| async move { Ok(Value::String("z".repeat(5000))) });
    let model = ScriptedModel::new([Turn::tool_calls([("c", "dump", "{}")]), Turn::text("ok")]);
    let rt = Runtime::builder()
        .agent(AgentDef::new("a", "x").tool(big))
        .model(model.clone())
        .max_value_bytes(4096)
        .build()
        .unwrap();
    let (_, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished);
    let error = &tool_messages(&model, 1)[0].1;
    assert_eq!(error["kind"], "invalid_output");
    assert!(error["message"].as_str().unwrap().contains("the limit is 4096 bytes"), "{error}");
}

#[test]
fn two_tools_with_one_name_are_refused_at_build_naming_both() {
    let agent = AgentDef::new("a", "x").tool(echo()).tool(FnTool::new("echo", |a, _| async move { Ok(a) }));
    let err = Runtime::builder().agent(agent).model(ScriptedModel::new([])).build().unwrap_err();
    match &err {
        RunError::DuplicateTool { agent, tool, first, second } => {
            assert_eq!((agent.as_str(), tool.as_str()), ("a", "echo"));
            assert!(first.ends_with("FnTool") && second.ends_with("FnTool"), "{err}");
        }
        other => panic!("expected DuplicateTool, got {other:?}"),
    }
}

#[tokio::test]
async fn duplicate_call_ids_get_one_result_each_under_distinct_ids() {
    let model = ScriptedModel::new([
        Turn::tool_calls([
            ("same", "echo", r#"{"n":1}"#),
            ("same", "echo", r#"{"n":2}"#),
            ("same", "echo", r#"{"n":3}"#),
        ]),
        Turn::text("ok"),
    ]);
    let rt = Runtime::builder().agent(AgentDef::new("a", "x").tool(echo())).model(model.clone()).build().unwrap();
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished);
    let r = results(&events);
    let ids: Vec<&str> = r.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(ids, ["same", "same~2", "same~3"]);
    assert_eq!(r[2].1, json!({"n": 3}), "each call still runs with its own arguments");

    // The next request answers every call of the assistant message exactly once.
    let request = &model.requests()[1];
    let asked: Vec<String> = request
        .messages
        .iter()
        .flat_map(|m| match m {
            m @ Message::Assistant { .. } => m.tool_calls().map(|c| c.call_id.to_string()).collect(),
            _ => Vec::new(),
        })
        .collect();
    let answered: Vec<String> = tool_messages(&model, 1).into_iter().map(|(id, _)| id).collect();
    assert_eq!(asked, answered);
}

/// Reports `n` progress values, then returns `n`.
#[tool]
async fn chatty(n: u32) -> u32 {
    for i in 0..n {
        progress!(i);
    }
    n
}

#[tokio::test]
async fn a_consumer_that_lags_gets_bounded_progress_and_every_other_event() {
    let model = ScriptedModel::new([Turn::tool_calls([("c", "chatty", r#"{"n":20000}"#)]), Turn::text("ok")]);
    let rt =
        Runtime::builder().agent(AgentDef::new("a", "x").tool(Chatty)).model(model).event_buffer(16).build().unwrap();
    let mut handle = rt.run(kuralle::RunRequest::new("go").run_id("r"));
    // Read nothing until the run has finished: the chatty tool is not held up by the reader.
    loop {
        let record = rt.get_run("r").await.unwrap();
        if record.is_some_and(|r| r.status == RunStatus::Finished) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    let progress = events.iter().filter(|e| matches!(e, Event::ToolProgress { .. })).count();
    assert!((1..=8).contains(&progress), "{progress} progress events were buffered");
    assert_eq!(results(&events), [("c".to_owned(), json!(20000), false)]);
    assert!(matches!(events.last(), Some(Event::Done { .. })));
    handle.await.unwrap();
}

#[tokio::test]
async fn a_handle_that_is_awaited_without_reading_never_holds_the_run_up() {
    let model = ScriptedModel::new([Turn::tool_calls([("c", "chatty", r#"{"n":100}"#)]), Turn::text("ok")]);
    let rt =
        Runtime::builder().agent(AgentDef::new("a", "x").tool(Chatty)).model(model).event_buffer(1).build().unwrap();
    let out = rt.run("go").await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
}
