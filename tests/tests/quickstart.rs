//! The quickstart picks its provider from the environment and says which one it uses: offline
//! it plays a scripted model; with a provider's key (and base URL, here a local server speaking
//! that provider's wire) it talks to that provider.

use std::process::{Command, Output};

use kuralle_tests::wire_server::{Reply, Server};
use serde_json::{Value, json};

const KEYS: [&str; 9] = [
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "GEMINI_API_KEY",
    "GEMINI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_MODEL",
    "KURALLE_PROVIDER",
    "KURALLE_MODEL",
];

async fn quickstart(env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quickstart"));
    for key in KEYS {
        cmd.env_remove(key);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run the quickstart")).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_it_says_it_plays_a_scripted_model() {
    let out = quickstart(&[]).await;
    assert!(stderr(&out).starts_with("model: scripted (offline;"), "{}", stderr(&out));
    assert!(stdout(&out).contains("The echo tool says: hello world"), "{}", stdout(&out));
}

fn anthropic(events: &[Value]) -> Reply {
    let body = events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
    Reply::Sse { body, chunked: true, piece: 31 }
}

fn anthropic_turn(block: Value, deltas: &[Value], stop: &str) -> Reply {
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "model": "claude-sonnet-4-5", "usage": {"input_tokens": 40, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
    ];
    events.extend(deltas.iter().map(|d| json!({"type": "content_block_delta", "index": 0, "delta": d})));
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 12}}));
    events.push(json!({"type": "message_stop"}));
    anthropic(&events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_anthropic_key_it_talks_to_claude() {
    let server = Server::start(vec![
        anthropic_turn(
            json!({"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {}}),
            &[json!({"type": "input_json_delta", "partial_json": "{\"text\":\"hello world\"}"})],
            "tool_use",
        ),
        anthropic_turn(
            json!({"type": "text", "text": ""}),
            &[json!({"type": "text_delta", "text": "Claude echoed: hello world"})],
            "end_turn",
        ),
    ])
    .await;
    let out = quickstart(&[
        ("ANTHROPIC_API_KEY", "sk-ant-test".into()),
        ("ANTHROPIC_BASE_URL", server.origin.clone()),
        // Another key is set too; Anthropic comes first without KURALLE_PROVIDER.
        ("OPENAI_API_KEY", "sk-test".into()),
    ])
    .await;
    assert!(stderr(&out).starts_with("model: claude-sonnet-4-5 (anthropic)"), "{}", stderr(&out));
    assert!(stdout(&out).contains("Claude echoed: hello world"), "{}", stdout(&out));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].header("x-api-key"), Some("sk-ant-test"));
}

fn gemini(parts: Value, finish: &str) -> Reply {
    let chunk = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}],
        "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 8}});
    Reply::Sse { body: format!("data: {chunk}\r\n\r\n"), chunked: true, piece: 29 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kuralle_provider_picks_gemini_when_several_keys_are_set() {
    let server = Server::start(vec![
        gemini(
            json!([{"functionCall": {"name": "echo", "args": {"text": "hello world"}}, "thoughtSignature": "c2ln"}]),
            "STOP",
        ),
        gemini(json!([{"text": "Gemini echoed: hello world"}]), "STOP"),
    ])
    .await;
    let out = quickstart(&[
        ("ANTHROPIC_API_KEY", "sk-ant-test".into()),
        ("GEMINI_API_KEY", "gm-test".into()),
        ("GEMINI_BASE_URL", server.origin.clone()),
        ("KURALLE_PROVIDER", "gemini".into()),
        ("KURALLE_MODEL", "gemini-2.5-pro".into()),
    ])
    .await;
    assert!(stderr(&out).starts_with("model: gemini-2.5-pro (gemini)"), "{}", stderr(&out));
    assert!(stdout(&out).contains("Gemini echoed: hello world"), "{}", stdout(&out));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[0].path.starts_with("/v1beta/models/gemini-2.5-pro:streamGenerateContent"),
        "{}",
        requests[0].path
    );
    assert_eq!(requests[0].header("x-goog-api-key"), Some("gm-test"));
    // The signature goes back on its call.
    assert_eq!(requests[1].body["contents"][1]["parts"][0]["thoughtSignature"], "c2ln");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_provider_is_a_clear_error() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quickstart"));
    for key in KEYS {
        cmd.env_remove(key);
    }
    cmd.env("KURALLE_PROVIDER", "bedrock");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("KURALLE_PROVIDER") && err.contains("bedrock") && err.contains("anthropic"), "{err}");
}
