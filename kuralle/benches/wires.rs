//! Each model wire, measured the same way (issue 22):
//! - **parse**: a large recorded stream (text deltas, reasoning, tool-call fragments, usage)
//!   served by a local HTTP server and read through the client into events, in MB/s of SSE,
//!   against a plain `serde_json` pass over the same event payloads (`Value` per event);
//! - **refuse**: the peak RSS (`VmHWM`) of a fresh process whose client refuses a 100 MB
//!   response at the default `max_response_bytes` (16 MiB).
//!
//! Run with `cargo bench -p kuralle --bench wires` (Linux). `-- parse` or `-- refuse` runs one
//! half; `-- rss WIRE` is the child process of the refuse half.

use std::{
    hint::black_box,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use kuralle::{Message, Model, ModelEvent, ModelRequest};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

const FLOOD: usize = 100 << 20;
/// Events in the recorded stream.
const EVENTS: usize = 40_000;

/// A recorded stream: each event's `event:` name (if any) and JSON data.
type Recorded = Vec<(Option<&'static str>, Value)>;

/// One wire: how to build its client, what its path is, and its recorded stream.
struct Wire {
    name: &'static str,
    client: fn(&str) -> Arc<dyn Model>,
    /// The SSE events (`event:` name, JSON data) of a long answer with calls.
    stream: fn(usize) -> Recorded,
    /// What opens a long answer before its text (block starts).
    flood_first: fn() -> Recorded,
    /// One event of text, repeated to flood.
    flood_event: fn(&str) -> (Option<&'static str>, Value),
    /// Whether the stream ends with `data: [DONE]`.
    done_marker: bool,
}

fn wires() -> Vec<Wire> {
    vec![
        Wire {
            name: "openai chat",
            client: |origin| {
                Arc::new(
                    kuralle::models::OpenAi::builder()
                        .base_url(format!("{origin}/v1"))
                        .model("m")
                        .max_retries(0)
                        .build()
                        .unwrap(),
                )
            },
            stream: |n| {
                let mut events = Vec::with_capacity(n + 4);
                for i in 0..n {
                    let delta = if i % 4 == 0 {
                        json!({"reasoning_content": format!("thinking about step {i} of the plan, ")})
                    } else if i % 50 == 1 {
                        json!({"tool_calls": [{"index": i / 50, "id": format!("call_{i}"), "type": "function",
                        "function": {"name": "lookup", "arguments": ""}}]})
                    } else if i % 50 == 2 {
                        json!({"tool_calls": [{"index": i / 50, "function": {"arguments": "{\"order\":\"A-17\",\"note\":\"fragment\"}"}}]})
                    } else {
                        json!({"content": format!("word {i} of a long answer, ")})
                    };
                    events.push((None, json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})));
                }
                events.push((
                    None,
                    json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
                ));
                events.push((
                None,
                json!({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 1200, "completion_tokens": 9000}}),
            ));
                events
            },
            flood_first: Vec::new,
            flood_event: |text| (None, json!({"choices": [{"index": 0, "delta": {"content": text}}]})),
            done_marker: true,
        },
        Wire {
            name: "anthropic",
            client: |origin| {
                Arc::new(
                    kuralle::models::Anthropic::builder()
                        .base_url(origin)
                        .api_key("k")
                        .model("claude-sonnet-4-5")
                        .max_retries(0)
                        .build()
                        .unwrap(),
                )
            },
            stream: |n| {
                let named = |v: Value| (Some(event_name(&v)), v);
                let mut events =
                    vec![named(json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
                "usage": {"input_tokens": 1200, "cache_read_input_tokens": 800, "output_tokens": 1}}}))];
                let mut index = 0;
                let mut i = 0;
                while i < n {
                    let (start, delta) = match index % 3 {
                        0 => (json!({"type": "thinking", "thinking": "", "signature": ""}), "thinking"),
                        1 => (json!({"type": "text", "text": ""}), "text"),
                        _ => (
                            json!({"type": "tool_use", "id": format!("toolu_{index}"), "name": "lookup", "input": {}}),
                            "tool",
                        ),
                    };
                    events.push(named(json!({"type": "content_block_start", "index": index, "content_block": start})));
                    for j in 0..50 {
                        let d = match delta {
                            "thinking" => {
                                json!({"type": "thinking_delta", "thinking": format!("thinking about step {j} of the plan, ")})
                            }
                            "text" => json!({"type": "text_delta", "text": format!("word {j} of a long answer, ")}),
                            _ if j == 0 => json!({"type": "input_json_delta", "partial_json": "{\"order\":\"A-17\","}),
                            _ => json!({"type": "input_json_delta", "partial_json": format!("\"k{j}\":\"fragment\",")}),
                        };
                        events.push(named(json!({"type": "content_block_delta", "index": index, "delta": d})));
                    }
                    if delta == "tool" {
                        events.push(named(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": "\"end\":1}"}})));
                    }
                    if delta == "thinking" {
                        events.push(named(json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": "EqQBCkYIARgCIkD"}})));
                    }
                    events.push(named(json!({"type": "content_block_stop", "index": index})));
                    index += 1;
                    i += 52;
                }
                events.push(named(json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9000}})));
                events.push(named(json!({"type": "message_stop"})));
                events
            },
            flood_first: || {
                vec![
                    (
                        Some("message_start"),
                        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                    "role": "assistant", "content": [], "model": "m", "usage": {"input_tokens": 1, "output_tokens": 1}}}),
                    ),
                    (
                        Some("content_block_start"),
                        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                    ),
                ]
            },
            flood_event: |text| {
                (
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
                )
            },
            done_marker: false,
        },
        Wire {
            name: "openai responses",
            client: |origin| {
                Arc::new(
                    kuralle::models::OpenAiResponses::builder()
                        .base_url(format!("{origin}/v1"))
                        .model("m")
                        .max_retries(0)
                        .build()
                        .unwrap(),
                )
            },
            stream: |n| {
                // Blocks of 50 events: a reasoning item (summary deltas), a message (text
                // deltas), a function call (argument fragments), each opened and closed.
                let named = |mut v: Value, name: &'static str| {
                    v["type"] = json!(name);
                    (Some(name), v)
                };
                let mut events: Recorded = Vec::with_capacity(n + 4);
                events.push(named(
                    json!({"response": {"id": "resp_1", "status": "in_progress", "output": []}}),
                    "response.created",
                ));
                for block in 0..n / 50 {
                    let (rs, msg, fc) = (3 * block, 3 * block + 1, 3 * block + 2);
                    let rs_id = format!("rs_{block}");
                    events.push(named(
                        json!({"output_index": rs, "item": {"id": rs_id, "type": "reasoning", "summary": []}}),
                        "response.output_item.added",
                    ));
                    for i in 0..12 {
                        events.push(named(
                            json!({"item_id": rs_id, "output_index": rs, "summary_index": 0,
                                "delta": format!("thinking about step {i} of the plan, ")}),
                            "response.reasoning_summary_text.delta",
                        ));
                    }
                    events.push(named(
                        json!({"output_index": rs, "item": {"id": rs_id, "type": "reasoning",
                            "encrypted_content": "gAAAAAB".repeat(40),
                            "summary": [{"type": "summary_text", "text": "thinking about the plan"}]}}),
                        "response.output_item.done",
                    ));
                    let msg_id = format!("msg_{block}");
                    events.push(named(
                        json!({"output_index": msg, "item": {"id": msg_id, "type": "message", "role": "assistant", "content": []}}),
                        "response.output_item.added",
                    ));
                    let mut text = String::new();
                    for i in 0..30 {
                        let delta = format!("word {i} of a long answer, ");
                        text.push_str(&delta);
                        events.push(named(
                            json!({"item_id": msg_id, "output_index": msg, "content_index": 0, "delta": delta}),
                            "response.output_text.delta",
                        ));
                    }
                    events.push(named(
                        json!({"output_index": msg, "item": {"id": msg_id, "type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": text, "annotations": []}]}}),
                        "response.output_item.done",
                    ));
                    let (fc_id, call_id) = (format!("fc_{block}"), format!("call_{block}"));
                    let arguments = "{\"order\":\"A-17\",\"note\":\"fragment\"}";
                    events.push(named(
                        json!({"output_index": fc, "item": {"id": fc_id, "type": "function_call",
                            "call_id": call_id, "name": "lookup", "arguments": ""}}),
                        "response.output_item.added",
                    ));
                    events.push(named(
                        json!({"item_id": fc_id, "output_index": fc, "delta": arguments}),
                        "response.function_call_arguments.delta",
                    ));
                    events.push(named(
                        json!({"output_index": fc, "item": {"id": fc_id, "type": "function_call",
                            "call_id": call_id, "name": "lookup", "arguments": arguments}}),
                        "response.output_item.done",
                    ));
                }
                events.push(named(
                    json!({"response": {"id": "resp_1", "status": "completed", "usage": {"input_tokens": 1200,
                        "output_tokens": 9000, "output_tokens_details": {"reasoning_tokens": 3000}}}}),
                    "response.completed",
                ));
                events
            },
            flood_first: || {
                vec![(
                    Some("response.output_item.added"),
                    json!({"type": "response.output_item.added", "output_index": 0,
                        "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}),
                )]
            },
            flood_event: |text| {
                (
                    Some("response.output_text.delta"),
                    json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                        "content_index": 0, "delta": text}),
                )
            },
            done_marker: false,
        },
        Wire {
            name: "gemini",
            client: |origin| {
                Arc::new(
                    kuralle::models::Gemini::builder()
                        .base_url(origin)
                        .api_key("k")
                        .model("gemini-2.5-flash")
                        .max_retries(0)
                        .build()
                        .unwrap(),
                )
            },
            stream: |n| {
                let chunk = |parts: Value| json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}], "modelVersion": "gemini-2.5-flash", "responseId": "r1"});
                let mut events = Vec::with_capacity(n + 2);
                for i in 0..n {
                    let part = if i % 4 == 0 {
                        json!({"text": format!("thinking about step {i} of the plan, "), "thought": true})
                    } else if i % 50 == 1 {
                        json!({"functionCall": {"name": "lookup", "args": {"order": "A-17", "note": "whole"}}, "thoughtSignature": "CiQBVKhc7pZ3sig=="})
                    } else {
                        json!({"text": format!("word {i} of a long answer, ")})
                    };
                    events.push((None, chunk(json!([part]))));
                }
                let mut end = chunk(json!([{"text": "", "thoughtSignature": "CiQBVKhc7pZ3end=="}]));
                end["candidates"][0]["finishReason"] = json!("STOP");
                events.push((None, end));
                events.push((None, json!({"usageMetadata": {"promptTokenCount": 1200, "candidatesTokenCount": 6000, "thoughtsTokenCount": 3000}})));
                events
            },
            flood_first: Vec::new,
            flood_event: |text| {
                (None, json!({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}]}))
            },
            done_marker: false,
        },
    ]
}

fn event_name(v: &Value) -> &'static str {
    match v["type"].as_str().unwrap_or_default() {
        "message_start" => "message_start",
        "content_block_start" => "content_block_start",
        "content_block_delta" => "content_block_delta",
        "content_block_stop" => "content_block_stop",
        "message_delta" => "message_delta",
        "message_stop" => "message_stop",
        "response.output_item.added" => "response.output_item.added",
        "response.output_item.done" => "response.output_item.done",
        "response.output_text.delta" => "response.output_text.delta",
        "response.reasoning_summary_text.delta" => "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta" => "response.function_call_arguments.delta",
        "response.completed" => "response.completed",
        "response.created" => "response.created",
        _ => "message",
    }
}

fn sse(events: &[(Option<&str>, Value)], done: bool) -> Vec<u8> {
    let mut body = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            body.push_str("event: ");
            body.push_str(name);
            body.push('\n');
        }
        body.push_str("data: ");
        body.push_str(&data.to_string());
        body.push_str("\n\n");
    }
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    body.into_bytes()
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> bool {
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            let length: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while head.len() < end + 4 + length {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            return true;
        }
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
}

/// Serves `body` as an event stream to every request.
async fn serve(body: Arc<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = Arc::clone(&body);
            tokio::spawn(async move {
                if !read_request(&mut socket).await {
                    return;
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    origin
}

fn request() -> ModelRequest {
    ModelRequest {
        system: "".into(),
        messages: vec![Message::User { content: "hi".into() }].into(),
        tools: Vec::new().into(),
        output: None,
    }
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

async fn parse(wire: &Wire) {
    let events = (wire.stream)(EVENTS);
    let body = Arc::new(sse(&events, wire.done_marker));
    let datas: Vec<String> = events.iter().map(|(_, d)| d.to_string()).collect();
    let origin = serve(Arc::clone(&body)).await;
    let model = (wire.client)(&origin);
    let mut client_times = Vec::new();
    let mut plain_times = Vec::new();
    let mut count = 0;
    for _ in 0..7 {
        let started = Instant::now();
        let mut stream = model.stream(request());
        count = 0;
        while let Some(event) = stream.next().await {
            let event: ModelEvent = event.expect("the recorded stream parses");
            black_box(&event);
            count += 1;
        }
        client_times.push(started.elapsed());

        let started = Instant::now();
        for data in &datas {
            black_box(serde_json::from_str::<Value>(data).unwrap());
        }
        plain_times.push(started.elapsed());
    }
    let mb = body.len() as f64 / 1e6;
    let (client, plain) = (median(client_times), median(plain_times));
    println!(
        "{:<18} parse  {:>6.2} MB in {:>8.2?}: {:>7.1} MB/s ({count} events); serde_json pass {:>7.1} MB/s; ratio {:.2}×",
        wire.name,
        mb,
        client,
        mb / client.as_secs_f64(),
        mb / plain.as_secs_f64(),
        client.as_secs_f64() / plain.as_secs_f64(),
    );
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0)
}

/// The child: refuses a 100 MB stream of `wire` and prints its peak RSS growth.
async fn refuse(wire: &Wire) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let written = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&written);
    let first = sse(&(wire.flood_first)(), false);
    let event = sse(&[(wire.flood_event)(&"x".repeat(64 << 10))], false);
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        if !read_request(&mut socket).await {
            return;
        }
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
        if socket.write_all(head.as_bytes()).await.is_err() || socket.write_all(&first).await.is_err() {
            return;
        }
        let mut sent = 0;
        while sent < FLOOD {
            if socket.write_all(&event).await.is_err() {
                return;
            }
            sent += event.len();
            count.store(sent, Ordering::SeqCst);
        }
    });
    let model = (wire.client)(&origin);
    let before = status_kib("VmRSS:");
    let mut stream = model.stream(request());
    let mut outcome = String::from("accepted (!)");
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            outcome = e.to_string();
            break;
        }
    }
    drop(stream);
    let peak = status_kib("VmHWM:");
    println!(
        "{:<18} refuse 100 MB: peak RSS +{:.1} MiB over {:.1} MiB; server wrote {:.1} MiB; {outcome}",
        wire.name,
        peak.saturating_sub(before) as f64 / 1024.0,
        before as f64 / 1024.0,
        written.load(Ordering::SeqCst) as f64 / (1 << 20) as f64,
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    if let Some(i) = args.iter().position(|a| a == "rss") {
        let name = args.get(i + 1).expect("rss WIRE").replace('_', " ");
        let wire = wires().into_iter().find(|w| w.name == name).expect("a known wire");
        rt.block_on(refuse(&wire));
        return;
    }
    // `cargo test --benches` runs bench binaries without `--bench`; do the work only when asked
    // to benchmark, so the test run stays quick.
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let only = |half: &str| !args.iter().any(|a| a == "parse" || a == "refuse") || args.iter().any(|a| a == half);
    if only("parse") {
        rt.block_on(async {
            for wire in wires() {
                parse(&wire).await;
            }
        });
    }
    if only("refuse") {
        let exe = std::env::current_exe().unwrap();
        for wire in wires() {
            // A fresh process per wire, so one wire's peak does not hide another's.
            let out = Command::new(&exe).arg("rss").arg(wire.name.replace(' ', "_")).output().unwrap();
            print!("{}", String::from_utf8_lossy(&out.stdout));
        }
    }
}
