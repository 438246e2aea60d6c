//! Token and dollar limits on every provider wire, with the usage each wire reports: a local
//! server speaking the wire answers the first request with a tool call that spent 40 input
//! and 9 output tokens; a run capped at 49 tokens, or at 4 cents with a price of $1,000 per
//! million tokens (49 tokens = 4.9 cents), is refused its second request, which the server
//! never receives.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use futures::StreamExt;
use kuralle::{
    AgentDef, Event, Limit, Model, Pricing, RunError, RunLimits, RunRequest, RunStatus, Runtime, StepKind,
    models::{Anthropic, Gemini, OpenAi, OpenAiResponses},
};
use kuralle_tests::{
    FnTool,
    wire_server::{Reply, Server},
};
use serde_json::{Value, json};

const INPUT: u64 = 40;
const OUTPUT: u64 = 9;

/// A wire: the reply that calls the `work` tool with the usage above, a closing text reply,
/// and a model of that wire talking to `server`.
struct Wire {
    name: &'static str,
    call: fn() -> Reply,
    text: fn() -> Reply,
    model: fn(&Server) -> Arc<dyn Model>,
}

fn sse(body: String) -> Reply {
    Reply::Sse { body, chunked: true, piece: 29 }
}

// OpenAI Chat Completions: chunks, then a usage-only chunk (`stream_options.include_usage`).
fn openai_chunk(delta: Value, finish: Value, usage: Value) -> String {
    let chunk = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_741_570_283,
        "model": "gpt-4o-mini-2024-07-18", "choices": if usage.is_null() {
            json!([{"index": 0, "delta": delta, "finish_reason": finish}])
        } else { json!([]) }, "usage": usage});
    format!("data: {chunk}\n\n")
}

fn openai_call() -> Reply {
    let start = json!({"role": "assistant", "content": null,
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "work", "arguments": "{}"}}]});
    let usage = json!({"prompt_tokens": INPUT, "completion_tokens": OUTPUT, "total_tokens": INPUT + OUTPUT});
    sse([
        openai_chunk(start, Value::Null, Value::Null),
        openai_chunk(json!({}), json!("tool_calls"), Value::Null),
        openai_chunk(Value::Null, Value::Null, usage),
        "data: [DONE]\n\n".into(),
    ]
    .concat())
}

fn openai_text() -> Reply {
    let usage = json!({"prompt_tokens": INPUT, "completion_tokens": 1, "total_tokens": INPUT + 1});
    sse([
        openai_chunk(json!({"role": "assistant", "content": "done"}), json!("stop"), Value::Null),
        openai_chunk(Value::Null, Value::Null, usage),
        "data: [DONE]\n\n".into(),
    ]
    .concat())
}

// OpenAI Responses: the output items, then `response.completed` with the usage.
fn responses(items: Value, output: u64) -> Reply {
    let usage = json!({"input_tokens": INPUT, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": INPUT + output});
    let response = |status: &str, output: &Value, usage: &Value| {
        json!({"id": "resp_1", "object": "response", "created_at": 1_756_315_696, "status": status,
            "error": null, "incomplete_details": null, "model": "o4-mini-2025-04-16", "output": output, "usage": usage})
    };
    let mut events =
        vec![json!({"type": "response.created", "response": response("in_progress", &json!([]), &Value::Null)})];
    for (i, item) in items.as_array().unwrap().iter().enumerate() {
        events.push(json!({"type": "response.output_item.added", "output_index": i, "item": item}));
        events.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
    }
    events.push(json!({"type": "response.completed", "response": response("completed", &items, &usage)}));
    let body = kuralle_tests::wire_server::responses_sse(&events);
    sse(body)
}

fn responses_call() -> Reply {
    responses(
        json!([{"id": "fc_1", "type": "function_call", "status": "completed", "arguments": "{}", "call_id": "call_1", "name": "work"}]),
        OUTPUT,
    )
}

fn responses_text() -> Reply {
    responses(
        json!([{"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "text": "done"}]}]),
        1,
    )
}

// Anthropic Messages: input tokens in `message_start`, output tokens in `message_delta`.
fn anthropic(block: Value, deltas: &[Value], stop: &str, output: u64) -> Reply {
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "model": "claude-sonnet-4-5", "usage": {"input_tokens": INPUT, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
    ];
    events.extend(deltas.iter().map(|d| json!({"type": "content_block_delta", "index": 0, "delta": d})));
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": output}}));
    events.push(json!({"type": "message_stop"}));
    sse(events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect())
}

fn anthropic_call() -> Reply {
    anthropic(
        json!({"type": "tool_use", "id": "toolu_1", "name": "work", "input": {}}),
        &[json!({"type": "input_json_delta", "partial_json": "{}"})],
        "tool_use",
        OUTPUT,
    )
}

fn anthropic_text() -> Reply {
    anthropic(json!({"type": "text", "text": ""}), &[json!({"type": "text_delta", "text": "done"})], "end_turn", 1)
}

// Gemini: `usageMetadata` on the chunk.
fn gemini(parts: Value, output: u64) -> Reply {
    let chunk = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": INPUT, "candidatesTokenCount": output, "totalTokenCount": INPUT + output}});
    sse(format!("data: {chunk}\r\n\r\n"))
}

fn gemini_call() -> Reply {
    gemini(json!([{"functionCall": {"name": "work", "args": {}}}]), OUTPUT)
}

fn gemini_text() -> Reply {
    gemini(json!([{"text": "done"}]), 1)
}

const WIRES: [Wire; 4] = [
    Wire {
        name: "gpt-4o-mini",
        call: openai_call,
        text: openai_text,
        model: |s| {
            Arc::new(OpenAi::builder().base_url(&s.base_url).api_key("sk-test").model("gpt-4o-mini").build().unwrap())
        },
    },
    Wire {
        name: "o4-mini",
        call: responses_call,
        text: responses_text,
        model: |s| {
            Arc::new(
                OpenAiResponses::builder().base_url(&s.base_url).api_key("sk-test").model("o4-mini").build().unwrap(),
            )
        },
    },
    Wire {
        name: "claude-sonnet-4-5",
        call: anthropic_call,
        text: anthropic_text,
        model: |s| {
            Arc::new(
                Anthropic::builder()
                    .base_url(&s.origin)
                    .api_key("sk-ant-test")
                    .model("claude-sonnet-4-5")
                    .build()
                    .unwrap(),
            )
        },
    },
    Wire {
        name: "gemini-2.5-flash",
        call: gemini_call,
        text: gemini_text,
        model: |s| {
            Arc::new(
                Gemini::builder().base_url(&s.origin).api_key("gm-test").model("gemini-2.5-flash").build().unwrap(),
            )
        },
    },
];

/// Runs `limits` on `wire` (priced at $1,000 per million tokens); returns the event's limit
/// and used amount, and how many requests the server received.
async fn run(wire: &Wire, limits: RunLimits) -> (Limit, f64, usize) {
    let server = Server::start(vec![(wire.call)(), (wire.text)()]).await;
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    let work = FnTool::new("work", move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok(json!({"ok": true})) }
    });
    let model = (wire.model)(&server);
    assert_eq!(model.name(), wire.name, "prices are looked up by this name");
    let runtime = Runtime::builder()
        .agent(AgentDef::new("worker", "Work.").tool(work))
        .model_arc(model)
        .pricing(wire.name, Pricing::new(1_000.0, 1_000.0))
        .build()
        .unwrap();
    let mut handle = runtime.run(RunRequest::new("go").run_id("run-1").limits(limits));
    let mut exceeded = None;
    while let Some(e) = handle.next().await {
        if let Event::LimitExceeded { limit, used, .. } = e {
            exceeded = Some((limit, used.value()));
        }
    }
    let result = handle.await;
    assert!(matches!(result, Err(RunError::LimitExceeded { .. })), "{}: {result:?}", wire.name);
    assert_eq!(runtime.get_run("run-1").await.unwrap().unwrap().status, RunStatus::LimitExceeded);
    assert_eq!(ran.load(Ordering::SeqCst), 1, "{}: the first response's call ran", wire.name);
    // The journaled response carries the wire's usage and its price.
    let journal = runtime.journal("run-1").await.unwrap();
    let model_step = journal.iter().find(|s| s.kind == StepKind::Model).unwrap();
    let response: Value = model_step.result.as_ref().unwrap().decode().unwrap();
    assert_eq!(response["usage"]["input_tokens"], INPUT, "{}: {response}", wire.name);
    assert_eq!(response["usage"]["output_tokens"], OUTPUT, "{}: {response}", wire.name);
    assert!((response["cost_usd"].as_f64().unwrap() - 0.049).abs() < 1e-12, "{}: {response}", wire.name);
    let (limit, used) = exceeded.unwrap_or_else(|| panic!("{}: no LimitExceeded event", wire.name));
    (limit, used, server.requests().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limit_holds_on_every_wire() {
    for wire in &WIRES {
        let (limit, used, requests) = run(wire, RunLimits::new().max_total_tokens(INPUT + OUTPUT)).await;
        assert_eq!((limit, used), (Limit::TotalTokens, (INPUT + OUTPUT) as f64), "{}", wire.name);
        assert_eq!(requests, 1, "{}: the request past the cap never reached the wire", wire.name);

        let (limit, used, requests) = run(wire, RunLimits::new().max_output_tokens(OUTPUT)).await;
        assert_eq!((limit, used, requests), (Limit::OutputTokens, OUTPUT as f64, 1), "{}", wire.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_limit_holds_on_every_wire() {
    for wire in &WIRES {
        let (limit, used, requests) = run(wire, RunLimits::new().max_cost_usd(0.04)).await;
        assert_eq!(limit, Limit::CostUsd, "{}", wire.name);
        assert!((used - 0.049).abs() < 1e-12, "{}: {used}", wire.name);
        assert_eq!(requests, 1, "{}: the request past the cap never reached the wire", wire.name);
    }
}
