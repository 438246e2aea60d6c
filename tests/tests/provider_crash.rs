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
