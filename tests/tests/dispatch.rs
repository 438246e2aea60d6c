//! Dispatch semantics through the public runtime API: batching, concurrency limits, source
//! order, timeouts, interrupts, error containment, streaming progress and truncation.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Decision, Event, Message, RunOutput, RunRequest, RunStatus, Runtime, StepKind, ToolError,
    testing::{ScriptedModel, Turn},
};
use kuralle_tests::{FnTool, Probe, tool_results as results};
use serde_json::{Value, json};

async fn run_collect(runtime: &Runtime, input: &str) -> (Vec<Event>, RunOutput) {
    let mut handle = runtime.run(input);
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    (events, handle.await.expect("run succeeds"))
}

fn runtime(agent: AgentDef, model: &ScriptedModel) -> Runtime {
    Runtime::builder().agent(agent).model(model.clone()).build().unwrap()
}

fn calls(n: usize, name: &str) -> Turn {
    Turn::tool_calls((0..n).map(|i| (format!("call_{i}"), name.to_owned(), format!(r#"{{"i":{i}}}"#))))
}

fn sleeper(probe: &Probe, ms: u64) -> FnTool {
    let probe = probe.clone();
    FnTool::new("work", move |args, _ctx| {
        let probe = probe.clone();
        async move {
            let _g = probe.enter(&args["i"].to_string());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(args)
        }
    })
    .parallel()
}

#[tokio::test]
async fn twenty_calls_with_the_default_limit_peak_at_eight_and_all_run() {
    let probe = Probe::default();
    let model = ScriptedModel::new([calls(20, "work"), Turn::text("ok")]);
    let rt = runtime(AgentDef::new("a", "x").tool(sleeper(&probe, 40)), &model);
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(probe.total(), 20);
    assert_eq!(probe.peak(), 8);
    let r = results(&events);
    assert_eq!(r.len(), 20);
    assert!(r.iter().all(|(_, _, err)| !err), "none rejected: {r:?}");
}

#[tokio::test]
async fn explicit_limits_bound_the_peak_exactly() {
    for limit in [2, 3] {
        let probe = Probe::default();
        let model = ScriptedModel::new([calls(9, "work"), Turn::text("ok")]);
        let agent = AgentDef::new("a", "x").tool(sleeper(&probe, 30)).max_tool_concurrency(limit);
        run_collect(&runtime(agent, &model), "go").await;
        assert_eq!(probe.peak(), limit);
        assert_eq!(probe.total(), 9);
    }
}

#[tokio::test]
async fn a_predicate_splits_reads_and_writes_into_batches_with_barriers() {
    let probe = Probe::default();
    let p = probe.clone();
    let storage = FnTool::new("storage", move |args, _| {
        let p = p.clone();
        async move {
            let _g = p.enter(args["id"].as_str().unwrap());
            tokio::time::sleep(Duration::from_millis(40)).await;
            Ok(json!("done"))
        }
    })
    .parallel_when(|args| args["op"] == "read");
    let model = ScriptedModel::new([
        Turn::tool_calls([
            ("1", "storage", r#"{"op":"read","id":"r1"}"#),
            ("2", "storage", r#"{"op":"read","id":"r2"}"#),
            ("3", "storage", r#"{"op":"write","id":"w1"}"#),
            ("4", "storage", r#"{"op":"read","id":"r3"}"#),
        ]),
        Turn::text("ok"),
    ]);
    run_collect(&runtime(AgentDef::new("a", "x").tool(storage), &model), "go").await;
    // r1 and r2 overlap: both start before either ends.
    assert!(probe.at("start r1") < probe.at("end r2") && probe.at("start r2") < probe.at("end r1"));
    // w1 runs alone, after both reads.
    assert!(probe.at("start w1") > probe.at("end r1") && probe.at("start w1") > probe.at("end r2"));
    assert_eq!(probe.at("end w1"), probe.at("start w1") + 1);
    // r3 after w1.
    assert!(probe.at("start r3") > probe.at("end w1"));
}

#[tokio::test]
async fn the_model_cannot_make_a_call_parallel_safe_and_a_panicking_predicate_fails_closed() {
    let probe = Probe::default();
    let p = probe.clone();
    let tool = FnTool::new("t", move |args, _| {
        let p = p.clone();
        async move {
            let _g = p.enter(&args["i"].to_string());
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(json!(null))
        }
    })
    .parallel_when(|args| if args["i"] == 99 { true } else { panic!("predicate bug") });
    let model = ScriptedModel::new([
        Turn::tool_calls([("1", "t", r#"{"i":1,"parallel_safe":true}"#), ("2", "t", r#"{"i":2}"#)]),
        Turn::text("ok"),
    ]);
    run_collect(&runtime(AgentDef::new("a", "x").tool(tool), &model), "go").await;
    assert_eq!(probe.peak(), 1);
}

/// Runs three parallel calls that finish in the order given by `delays_ms`, returns the events
/// and the transcript the model saw next.
async fn three_calls(delays_ms: [u64; 3]) -> (Vec<Event>, Vec<Message>) {
    let tool = FnTool::new("delay", move |args, _| async move {
        let i = args["i"].as_u64().unwrap() as usize;
        tokio::time::sleep(Duration::from_millis(delays_ms[i - 1])).await;
        Ok(json!({"call": i}))
    })
    .parallel();
    let model = ScriptedModel::new([
        Turn::tool_calls([("c1", "delay", r#"{"i":1}"#), ("c2", "delay", r#"{"i":2}"#), ("c3", "delay", r#"{"i":3}"#)]),
        Turn::text("ok"),
    ]);
    let (events, _) = run_collect(&runtime(AgentDef::new("a", "x").tool(tool), &model), "go").await;
    (events, model.requests()[1].messages.to_vec())
}

#[tokio::test]
async fn results_come_out_in_source_order_whatever_the_completion_order() {
    let (events, transcript) = three_calls([150, 300, 10]).await; // completes 3, 1, 2
    let ids: Vec<_> = results(&events).into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(ids, ["c1", "c2", "c3"]);
    let tool_ids: Vec<_> = transcript
        .iter()
        .filter_map(|m| match m {
            Message::Tool { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(tool_ids, ["c1", "c2", "c3"]);
    let (_, other) = three_calls([10, 150, 300]).await; // completes 1, 2, 3
    assert_eq!(serde_json::to_string(&transcript).unwrap(), serde_json::to_string(&other).unwrap());
    // Event order within the batch: start, calls, results.
    let kinds: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolBatchStart { .. } => Some("batch"),
            Event::ToolCall { .. } => Some("call"),
            Event::ToolResult { .. } => Some("result"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["batch", "call", "call", "call", "result", "result", "result"]);
}

// On a paused clock: the 50 ms timeouts and the 2.2 s wait for a dropped tool pass in
// virtual time, in order, without the test sleeping.
#[tokio::test(start_paused = true)]
async fn timeouts_fire_the_token_and_drop_tools_that_ignore_it() {
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let finished_anyway = Arc::new(AtomicBool::new(false));
    let (s, f) = (saw_cancel.clone(), finished_anyway.clone());
    let cooperative = FnTool::new("cooperative", move |_, ctx| {
        let s = s.clone();
        async move {
            ctx.cancellation().cancelled().await;
            s.store(true, Ordering::SeqCst);
            Err(ToolError::failed("cooperative", "stopped"))
        }
    })
    .timeout(Duration::from_millis(50));
    let stubborn = FnTool::new("stubborn", move |_, _| {
        let f = f.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            f.store(true, Ordering::SeqCst);
            Ok(json!("late"))
        }
    })
    .timeout(Duration::from_millis(50));
    let model =
        ScriptedModel::new([Turn::tool_calls([("1", "cooperative", "{}"), ("2", "stubborn", "{}")]), Turn::text("ok")]);
    let rt = runtime(AgentDef::new("a", "x").tool(cooperative).tool(stubborn), &model);
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::Finished);
    let r = results(&events);
    assert!(r[0].2 && r[1].2);
    assert_eq!(r[0].1["kind"], "timeout");
    assert_eq!(r[0].1["message"], "tool `cooperative` timed out after 50ms");
    assert_eq!(r[1].1["message"], "tool `stubborn` timed out after 50ms");
    assert!(saw_cancel.load(Ordering::SeqCst));
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert!(!finished_anyway.load(Ordering::SeqCst), "a dropped tool must not keep running");
}

#[tokio::test]
async fn interrupt_cancels_interruptible_calls_only() {
    let started = Arc::new(tokio::sync::Notify::new());
    let interruptible_saw_cancel = Arc::new(AtomicBool::new(false));
    let (st, saw) = (started.clone(), interruptible_saw_cancel.clone());
    let soft = FnTool::new("soft", move |_, ctx| {
        let (st, saw) = (st.clone(), saw.clone());
        async move {
            st.notify_one();
            ctx.cancellation().cancelled().await;
            saw.store(true, Ordering::SeqCst);
            Ok(json!("stopped"))
        }
    })
    .parallel();
    let hard = FnTool::new("hard", move |_, ctx| async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(json!({"completed": true, "cancelled": ctx.is_cancelled()}))
    })
    .parallel()
    .uninterruptible();
    let model =
        ScriptedModel::new([Turn::tool_calls([("1", "soft", "{}"), ("2", "hard", "{}")]), Turn::text("never reached")]);
    let rt = runtime(AgentDef::new("a", "x").tool(soft).tool(hard), &model);
    let mut handle = rt.run("go");
    started.notified().await;
    handle.interrupt();
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    let out = handle.await.unwrap();
    assert_eq!(out.status, RunStatus::Interrupted);
    let r = results(&events);
    assert_eq!(r[0].1["kind"], "cancelled");
    assert_eq!(r[1].1, json!({"completed": true, "cancelled": false}));
    assert!(interruptible_saw_cancel.load(Ordering::SeqCst));
    assert_eq!(model.played(), 1, "no model request after the interrupt");
}

#[tokio::test]
async fn bad_calls_each_get_one_clear_error_and_the_run_goes_on() {
    let executed = Arc::new(AtomicUsize::new(0));
    let e = executed.clone();
    let echo = FnTool::new("echo", move |args, _| {
        let e = e.clone();
        async move {
            e.fetch_add(1, Ordering::SeqCst);
            Ok(args)
        }
    });
    let panicky = FnTool::new("panicky", |_, _| async { panic!("boom") });
    let model = ScriptedModel::new([
        Turn::tool_calls([
            ("1", "echo", r#"{"text": "#),
            ("2", "nope", "{}"),
            ("3", "echo", "[1,2]"),
            ("4", "panicky", "{}"),
            ("5", "echo", r#"{"text":"fine"}"#),
        ]),
        Turn::text("recovered"),
    ]);
    let rt = runtime(AgentDef::new("a", "x").tool(echo).tool(panicky), &model);
    let (events, out) = run_collect(&rt, "go").await;
    assert_eq!(out.text, "recovered");
    let r = results(&events);
    assert_eq!(r.len(), 5, "exactly one result per call id");
    assert!(r[0].1["message"].as_str().unwrap().contains("not valid JSON"));
    assert_eq!(r[1].1["kind"], "unknown_tool");
    assert!(r[1].1["message"].as_str().unwrap().contains("available tools: echo, panicky"));
    assert!(r[2].1["message"].as_str().unwrap().contains("must be a JSON object, not an array"));
    assert_eq!(r[3].1["kind"], "panicked");
    assert!(r[3].1["message"].as_str().unwrap().contains("boom"));
    assert_eq!(r[4], ("5".into(), json!({"text": "fine"}), false));
    assert_eq!(executed.load(Ordering::SeqCst), 1);
    let tool_messages = model.requests()[1].messages.iter().filter(|m| matches!(m, Message::Tool { .. })).count();
    assert_eq!(tool_messages, 5);
}

#[tokio::test]
async fn large_results_are_truncated_in_the_transcript_only() {
    let big: String = (0..5000).map(|i| format!("row {i}\n")).collect::<String>() + "TOTAL=5000";
    let b = big.clone();
    let tool = FnTool::new("dump", move |_, _| {
        let b = b.clone();
        async move { Ok(Value::String(b)) }
    });
    let model = ScriptedModel::new([Turn::tool_calls([("1", "dump", "{}")]), Turn::text("ok")]);
    let rt = runtime(AgentDef::new("a", "x").tool(tool).max_tool_result_tokens(200), &model);
    let (events, _) = run_collect(&rt, "go").await;
    assert_eq!(results(&events)[0].1, Value::String(big), "events keep the full value");
    let Message::Tool { content, .. } = &model.requests()[1].messages[2] else { panic!("tool message") };
    let shown = content["value"].as_str().unwrap();
    assert!(shown.starts_with("row 0\n") && shown.ends_with("TOTAL=5000"));
    assert!(content["__truncated"]["shownTokens"].as_u64().unwrap() <= 200);
}

#[tokio::test]
async fn max_steps_ends_the_run_with_a_clear_status() {
    let tool = FnTool::new("again", |_, _| async { Ok(json!("more")) });
    let model = ScriptedModel::new((0..10).map(|i| Turn::tool_calls([(format!("c{i}"), "again", "{}")])));
    let rt = runtime(AgentDef::new("a", "x").tool(tool).max_steps(3), &model);
    let (_, out) = run_collect(&rt, "go").await;
    assert_eq!(out.status, RunStatus::MaxSteps);
    assert_eq!(model.played(), 3);
}

#[tokio::test]
async fn nested_serial_calls_do_not_deadlock() {
    let inner = FnTool::new("inner", |args, _| async move { Ok(json!({"inner": args["n"]})) });
    let outer = FnTool::new("outer", |_, ctx| async move {
        let a = ctx.tool("inner", json!({"n": 1})).await?;
        let b = ctx.tool("inner", json!({"n": 2})).await?;
        Ok(json!([a, b]))
    });
    let model = ScriptedModel::new([Turn::tool_calls([("1", "outer", "{}")]), Turn::text("ok")]);
    let rt = runtime(AgentDef::new("a", "x").tool(outer).tool(inner), &model);
    let (events, _) = tokio::time::timeout(Duration::from_secs(5), run_collect(&rt, "go")).await.expect("no deadlock");
    assert_eq!(results(&events)[0].1, json!([{"inner": 1}, {"inner": 2}]));
}

#[tokio::test]
async fn model_errors_end_the_run_with_a_typed_error() {
    let model = ScriptedModel::new([Turn::error("overloaded")]);
    let rt = runtime(AgentDef::new("a", "x"), &model);
    let err = rt.run("go").await.unwrap_err();
    assert!(matches!(err, kuralle::RunError::Model(kuralle::ModelError::Provider(_))), "{err:?}");
    assert!(err.is_retryable());
}

/// Two parallel calls in one response that share an idempotency key are one effect: it runs
/// once, both calls get its result, and the journal holds one tool step (issue 24, item 6).
#[tokio::test]
async fn parallel_calls_sharing_a_key_run_once_and_both_get_the_result() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let charge = FnTool::new("charge", move |args, _| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"charged": args["amount"]}))
        }
    })
    .parallel()
    .key(|args| format!("charge-{}", args["order"]));
    let model = ScriptedModel::new([
        Turn::tool_calls([
            ("c1", "charge", r#"{"order":"A-1","amount":5}"#),
            ("c2", "charge", r#"{"order":"A-1","amount":5}"#),
            ("c3", "charge", r#"{"order":"B-2","amount":7}"#),
        ]),
        Turn::text("done"),
    ]);
    let rt = Runtime::builder().agent(AgentDef::new("shop", "x").tool(charge)).model(model).build().unwrap();
    let mut handle = rt.run(RunRequest::new("pay").run_id("r"));
    let mut events = Vec::new();
    while let Some(e) = handle.next().await {
        events.push(e);
    }
    let out = handle.await.unwrap();
    assert_eq!(out.status, RunStatus::Finished);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "A-1 once, B-2 once");
    let results = results(&events);
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(results[0].1, json!({"charged": 5}));
    assert_eq!(results[1].1, json!({"charged": 5}));
    assert_eq!(results[2].1, json!({"charged": 7}));
    let tool_steps = rt.journal("r").await.unwrap().into_iter().filter(|s| s.kind == StepKind::Tool).count();
    assert_eq!(tool_steps, 2, "one step per key");
}

/// With `needs_approval`, two parallel calls sharing a key ask once; once approved, the call
/// runs once and both calls get its result.
#[tokio::test]
async fn parallel_calls_sharing_a_key_ask_for_approval_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let charge = FnTool::new("charge", move |args, _| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"charged": args["amount"]}))
        }
    })
    .parallel()
    .needs_approval()
    .key(|args| format!("charge-{}", args["order"]));
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([
            ("c1", "charge", r#"{"order":"A-1","amount":5}"#),
            ("c2", "charge", r#"{"order":"A-1","amount":5}"#),
        ]),
        Turn::text("done"),
    ]);
    let rt = Runtime::builder().agent(AgentDef::new("shop", "x").tool(charge)).model(model).build().unwrap();
    let mut handle = rt.run(RunRequest::new("pay").run_id("r"));
    let mut pending = Vec::new();
    while let Some(e) = handle.next().await {
        if let Event::Paused { pending: p, .. } = e {
            pending = p;
        }
    }
    assert_eq!(handle.await.unwrap().status, RunStatus::Paused);
    assert_eq!(pending.len(), 1, "one approval per key: {pending:?}");
    let out = rt.deliver("r", Decision::approve("alice")).await.unwrap();
    assert_eq!(out.status, RunStatus::Finished, "{out:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// However many parallel calls of one response share keys, and in whatever order, each key
    /// runs exactly once, every call gets its key's result, and the run finishes.
    #[test]
    fn shared_keys_in_a_batch_run_once_each(orders in proptest::collection::vec(0u8..4, 1..10)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let runs = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<String, usize>::new()));
            let r = runs.clone();
            let charge = FnTool::new("charge", move |args, _| {
                let r = r.clone();
                async move {
                    *r.lock().unwrap().entry(args["order"].to_string()).or_default() += 1;
                    Ok(json!({"order": args["order"]}))
                }
            })
            .parallel()
            .key(|args| format!("charge-{}", args["order"]));
            let calls: Vec<(String, String, String)> = orders
                .iter()
                .enumerate()
                .map(|(i, o)| (format!("c{i}"), "charge".to_owned(), format!(r#"{{"order":{o}}}"#)))
                .collect();
            let model = ScriptedModel::new([Turn::tool_calls(calls), Turn::text("done")]);
            let runtime = runtime(AgentDef::new("shop", "x").tool(charge), &model);
            let (events, out) = run_collect(&runtime, "pay").await;
            assert_eq!(out.status, RunStatus::Finished);
            let distinct: std::collections::HashSet<u8> = orders.iter().copied().collect();
            let runs = runs.lock().unwrap().clone();
            assert_eq!(runs.len(), distinct.len());
            assert!(runs.values().all(|n| *n == 1), "{runs:?}");
            let got: Vec<Value> = results(&events).into_iter().map(|r| r.1).collect();
            let want: Vec<Value> = orders.iter().map(|o| json!({"order": o})).collect();
            assert_eq!(got, want);
        });
    }
}
