//! A run killed mid-turn, after a response with reasoning and tool calls, is resumed by a new
//! process: its journal replays the response, and the next request to the provider carries the
//! provider's state (thinking signatures, reasoning, encrypted items, item ids) byte for byte,
//! exactly as a run that never crashed sends it. One case per wire.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use kuralle_tests::wire_server::{Reply, Server};
use serde_json::{Value, json};

fn child(wire: &str, origin: &str, db: &Path, crash: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_provider_child"));
    cmd.env("WIRE", wire)
        .env("ORIGIN", origin)
        .env("DB", db)
        .env("RUN_ID", "order-run")
        .env("CRASH", if crash { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// Starts a child that stops inside its first tool call, and SIGKILLs it there.
fn kill_in_tool(wire: &str, origin: &str, db: &Path) {
    let mut proc = child(wire, origin, db, true).spawn().expect("spawn child");
    let stdout = proc.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("MARK ") {
                let _ = tx.send(line);
                return;
            }
        }
    });
    let mark = rx.recv_timeout(Duration::from_secs(60)).expect("the child never reached its tool");
    assert_eq!(mark, "MARK in_tool");
    proc.kill().expect("SIGKILL");
    proc.wait().unwrap();
}

/// Runs a child to its end; returns its last JSON line.
async fn run_to_end(wire: &str, origin: &str, db: &Path) -> Value {
    let mut cmd = child(wire, origin, db, false);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run child")).await.unwrap();
    assert!(out.status.success(), "child failed: {out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().expect("an output line")).expect("JSON output")
}

/// The follow-up request (the one after the tool results) of a run that crashed after the
/// first response, and of one that did not; they must be identical.
async fn follow_ups(wire: &str, first: fn() -> Reply, second: fn() -> Reply) -> (Value, Value) {
    let mut bodies = Vec::new();
    for crash in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("runs.db");
        let server = Server::start(vec![first(), second()]).await;
        let origin = server.origin.clone();
        if crash {
            let (o, d) = (origin.clone(), db.clone());
            let w = wire.to_owned();
            tokio::task::spawn_blocking(move || kill_in_tool(&w, &o, &d)).await.unwrap();
        }
        let out = run_to_end(wire, &origin, &db).await;
        assert_eq!(out["status"], "Finished", "{out}");
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "the first response was replayed from the journal, not asked again");
        bodies.push(requests[1].body.clone());
    }
    let control = bodies.pop().unwrap();
    let resumed = bodies.pop().unwrap();
    assert_eq!(resumed, control, "the resumed run's follow-up differs from an uncrashed run's");
    (resumed, control)
}

fn sse(events: &[Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect::<String>() + "data: [DONE]\n\n"
}

fn chat_first() -> Reply {
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Two orders; "}}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "look both up."}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a1", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"order\":\"A-1\"}"},
            "extra_content": {"google": {"thought_signature": "Q2lVQkFY/+sig=="}}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b2", "type": "function",
            "function": {"name": "lookup", "arguments": "{\"order\":\"B-2\"}"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ]);
    Reply::Sse { body, chunked: true, piece: 37 }
}

fn chat_second() -> Reply {
    let body =
        sse(&[json!({"choices": [{"index": 0, "delta": {"content": "1,800 in all."}, "finish_reason": "stop"}]})]);
    Reply::Sse { body, chunked: true, piece: 64 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_reasoning_content_and_thought_signatures_survive_a_crash() {
    let (resumed, _) = follow_ups("chat", chat_first, chat_second).await;
    let assistant = &resumed["messages"][2];
    assert_eq!(assistant["reasoning_content"], "Two orders; look both up.");
    assert_eq!(assistant["tool_calls"][0]["extra_content"]["google"]["thought_signature"], "Q2lVQkFY/+sig==");
    assert!(assistant["tool_calls"][1].get("extra_content").is_none(), "a signature is never copied to another call");
    assert_eq!(resumed["messages"][3]["tool_call_id"], "call_a1");
    assert_eq!(resumed["messages"][4]["tool_call_id"], "call_b2");
}

/// A Responses stream (data lines only: each event names its `type`): two reasoning items,
/// each before the call it produced.
fn responses_first() -> Reply {
    let call = |i: u64, id: &str, call_id: &str, order: &str| {
        json!({"type": "response.output_item.done", "output_index": i, "item": {"id": id, "type": "function_call",
            "status": "completed", "call_id": call_id, "name": "lookup", "arguments": format!("{{\"order\":\"{order}\"}}")}})
    };
    let reasoning = |i: u64, id: &str, summary: &str, encrypted: &str| {
        json!({"type": "response.output_item.done", "output_index": i, "item": {"id": id, "type": "reasoning",
            "encrypted_content": encrypted, "summary": [{"type": "summary_text", "text": summary}]}})
    };
    let body = [
        json!({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_c1", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"id": "rs_a", "type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_a", "output_index": 0, "summary_index": 0, "delta": "A-1 first."}),
        reasoning(0, "rs_a", "A-1 first.", "gAAAAABcrash-a=="),
        json!({"type": "response.output_item.added", "output_index": 1, "item": {"id": "fc_a1", "type": "function_call",
            "call_id": "call_a1", "name": "lookup", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_a1", "output_index": 1, "delta": "{\"order\":\"A-1\"}"}),
        call(1, "fc_a1", "call_a1", "A-1"),
        reasoning(2, "rs_b", "Then B-2.", "gAAAAABcrash-b=="),
        call(3, "fc_b2", "call_b2", "B-2"),
        json!({"type": "response.completed", "response": {"id": "resp_c1", "status": "completed",
            "usage": {"input_tokens": 60, "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 24}}}}),
    ]
    .iter()
    .map(|e| format!("data: {e}\n\n"))
    .collect();
    Reply::Sse { body, chunked: true, piece: 37 }
}

fn responses_second() -> Reply {
    let item = json!({"id": "msg_c2", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "1,800 in all.", "annotations": []}]});
    let body = [
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"id": "msg_c2", "type": "message", "content": []}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_c2", "output_index": 0, "delta": "1,800 in all."}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": {"status": "completed", "usage": {"input_tokens": 90, "output_tokens": 5}}}),
    ]
    .iter()
    .map(|e| format!("data: {e}\n\n"))
    .collect();
    Reply::Sse { body, chunked: true, piece: 64 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_reasoning_items_and_item_ids_survive_a_crash() {
    let (resumed, _) = follow_ups("responses", responses_first, responses_second).await;
    assert_eq!(resumed["store"], false);
    assert_eq!(
        resumed["input"],
        json!([
            {"type": "message", "role": "user", "content": "What do A-1 and B-2 total?"},
            {"type": "reasoning", "id": "rs_a", "encrypted_content": "gAAAAABcrash-a==",
             "summary": [{"type": "summary_text", "text": "A-1 first."}]},
            {"type": "function_call", "id": "fc_a1", "call_id": "call_a1", "name": "lookup", "arguments": "{\"order\":\"A-1\"}"},
            {"type": "reasoning", "id": "rs_b", "encrypted_content": "gAAAAABcrash-b==",
             "summary": [{"type": "summary_text", "text": "Then B-2."}]},
            {"type": "function_call", "id": "fc_b2", "call_id": "call_b2", "name": "lookup", "arguments": "{\"order\":\"B-2\"}"},
            {"type": "function_call_output", "call_id": "call_a1", "output": "{\"order\":\"A-1\",\"total\":900}"},
            {"type": "function_call_output", "call_id": "call_b2", "output": "{\"order\":\"B-2\",\"total\":900}"}
        ])
    );
}

/// Anthropic events, `event:` named as the API sends them.
fn anthropic_sse(events: &[Value]) -> Reply {
    let body = events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    Reply::Sse { body, chunked: true, piece: 29 }
}

fn anthropic_start() -> Value {
    json!({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5", "stop_reason": null, "usage": {"input_tokens": 30, "output_tokens": 1}}})
}

fn anthropic_end(stop: &str) -> [Value; 2] {
    [
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 80}}),
        json!({"type": "message_stop"}),
    ]
}

fn anthropic_first() -> Reply {
    let mut events = vec![
        anthropic_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Two orders, "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "two lookups."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxn+/="}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_01A", "name": "lookup", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"order\":"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"A-1\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_01B", "name": "lookup", "input": {}}}),
        json!({"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": "{\"order\":\"B-2\"}"}}),
        json!({"type": "content_block_stop", "index": 3}),
    ];
    events.extend(anthropic_end("tool_use"));
    anthropic_sse(&events)
}

fn anthropic_second() -> Reply {
    let mut events = vec![
        anthropic_start(),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "1,800 in all."}}),
        json!({"type": "content_block_stop", "index": 0}),
    ];
    events.extend(anthropic_end("end_turn"));
    anthropic_sse(&events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_signatures_and_redacted_thinking_survive_a_crash() {
    let (resumed, _) = follow_ups("anthropic", anthropic_first, anthropic_second).await;
    let messages = resumed["messages"].as_array().unwrap();
    let assistant = &messages[1];
    assert_eq!(assistant["role"], "assistant");
    assert_eq!(
        assistant["content"][0],
        json!({"type": "thinking", "thinking": "Two orders, two lookups.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxn+/="})
    );
    assert_eq!(assistant["content"][1], json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}));
    assert_eq!(assistant["content"][2]["id"], "toolu_01A");
    assert_eq!(assistant["content"][3]["input"], json!({"order": "B-2"}));
    // Both results in one user message, in call order.
    let results = messages[2]["content"].as_array().unwrap();
    let ids: Vec<&str> = results.iter().map(|r| r["tool_use_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["toolu_01A", "toolu_01B"]);
}

/// Gemini frames end in CRLF pairs and the stream has no end marker.
fn gemini_sse(chunks: &[Value]) -> String {
    chunks.iter().map(|c| format!("data: {c}\r\n\r\n")).collect()
}

fn gemini_parts(parts: Value) -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], "modelVersion": "gemini-2.5-flash"})
}

fn gemini_first() -> Reply {
    let mut calls = gemini_parts(json!([
        {"functionCall": {"name": "lookup", "args": {"order": "A-1"}}, "thoughtSignature": "CiQBVKhc7sigA1+/=="},
        {"functionCall": {"name": "lookup", "args": {"order": "B-2"}}}
    ]));
    calls["candidates"][0]["finishReason"] = json!("STOP");
    let body = gemini_sse(&[
        gemini_parts(json!([{"text": "Two orders; look both up.", "thought": true}])),
        gemini_parts(json!([{"text": "Checking.", "thoughtSignature": "CiQBVKhc7sigText=="}])),
        calls,
        json!({"usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 20, "thoughtsTokenCount": 30}}),
    ]);
    Reply::Sse { body, chunked: true, piece: 41 }
}

fn gemini_second() -> Reply {
    let mut end = gemini_parts(json!([{"text": "1,800 in all."}]));
    end["candidates"][0]["finishReason"] = json!("STOP");
    Reply::Sse { body: gemini_sse(&[end]), chunked: true, piece: 64 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_thoughts_and_signatures_on_their_parts_survive_a_crash() {
    let (resumed, _) = follow_ups("gemini", gemini_first, gemini_second).await;
    let contents = &resumed["contents"];
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": [
            {"text": "Two orders; look both up.", "thought": true},
            {"text": "Checking.", "thoughtSignature": "CiQBVKhc7sigText=="},
            {"functionCall": {"name": "lookup", "args": {"order": "A-1"}}, "thoughtSignature": "CiQBVKhc7sigA1+/=="},
            {"functionCall": {"name": "lookup", "args": {"order": "B-2"}}}
        ]})
    );
    assert_eq!(
        contents[2],
        json!({"role": "user", "parts": [
            {"functionResponse": {"name": "lookup", "response": {"order": "A-1", "total": 900}}},
            {"functionResponse": {"name": "lookup", "response": {"order": "B-2", "total": 900}}}
        ]})
    );
}
