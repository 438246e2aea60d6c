//! `kuralle::models::OpenAiResponses` against a local HTTP/1.1 server that records every
//! request and answers with streams in the Responses API's documented format (`event:` +
//! `data:` frames with `type` and `sequence_number`, ids `resp_…`, `rs_…`, `msg_…`, `fc_…`,
//! `call_…`), cut into small pieces so frames, lines and characters span reads.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kuralle::{
    FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, Part, ToolCallRequest, ToolSpec, Usage,
    models::{OpenAi, OpenAiResponses, OpenAiResponsesBuilder},
};
use kuralle_tests::wire_server::{Reply, Server};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    time::Instant,
};

// ---------------------------------------------------------------------------------------------
// The wire format: events as the API documents them.

const RESP_ID: &str = "resp_68af4030592c81938ec0a5fbab4a3e9f05438e46b5f69a3b";
const MODEL: &str = "o4-mini-2025-04-16";

/// The response object the lifecycle events carry.
fn response(status: &str, output: Value, usage: Value) -> Value {
    json!({
        "id": RESP_ID,
        "object": "response",
        "created_at": 1_756_315_696,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": "You are terse.",
        "max_output_tokens": null,
        "model": MODEL,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": {}
    })
}

fn usage(input: u64, cached: u64, output: u64, reasoning: u64) -> Value {
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output
    })
}

/// One response's events, numbered as the API numbers them, and its finished output items.
#[derive(Default)]
struct Stream {
    events: Vec<Value>,
    output: Vec<Value>,
}

impl Stream {
    /// `response.created` and `response.in_progress`.
    fn new() -> Self {
        let mut s = Self::default();
        s.push(json!({"type": "response.created", "response": response("in_progress", json!([]), Value::Null)}));
        s.push(json!({"type": "response.in_progress", "response": response("in_progress", json!([]), Value::Null)}));
        s
    }

    fn push(&mut self, event: Value) {
        self.events.push(event);
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    /// A reasoning item: each summary part streamed in two pieces, then the item with its
    /// encrypted content.
    fn reasoning(mut self, id: &str, summary: &[&str], encrypted: &str) -> Self {
        let i = self.index();
        self.push(json!({"type": "response.output_item.added", "output_index": i,
            "item": {"id": id, "type": "reasoning", "summary": []}}));
        for (s, text) in summary.iter().enumerate() {
            let part = json!({"type": "summary_text", "text": ""});
            self.push(json!({"type": "response.reasoning_summary_part.added", "item_id": id, "output_index": i,
                "summary_index": s, "part": part}));
            let cut = text.char_indices().nth(text.chars().count() / 2).map_or(0, |(b, _)| b);
            for piece in [&text[..cut], &text[cut..]] {
                self.push(json!({"type": "response.reasoning_summary_text.delta", "item_id": id, "output_index": i,
                    "summary_index": s, "delta": piece, "obfuscation": "x1Yz"}));
            }
            self.push(json!({"type": "response.reasoning_summary_text.done", "item_id": id, "output_index": i,
                "summary_index": s, "text": text}));
            self.push(json!({"type": "response.reasoning_summary_part.done", "item_id": id, "output_index": i,
                "summary_index": s, "part": {"type": "summary_text", "text": text}}));
        }
        let item = json!({"id": id, "type": "reasoning", "encrypted_content": encrypted,
            "summary": summary.iter().map(|t| json!({"type": "summary_text", "text": t})).collect::<Vec<_>>()});
        self.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
        self.output.push(item);
        self
    }

    /// A message whose text streams in `pieces`; `status` is the item's final status.
    fn message_with_status(mut self, id: &str, pieces: &[&str], status: &str) -> Self {
        let i = self.index();
        let text: String = pieces.concat();
        self.push(json!({"type": "response.output_item.added", "output_index": i,
            "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}));
        self.push(json!({"type": "response.content_part.added", "item_id": id, "output_index": i, "content_index": 0,
            "part": {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}}));
        for piece in pieces {
            self.push(json!({"type": "response.output_text.delta", "item_id": id, "output_index": i,
                "content_index": 0, "delta": piece, "logprobs": [], "obfuscation": "Qm9"}));
        }
        self.push(json!({"type": "response.output_text.done", "item_id": id, "output_index": i, "content_index": 0,
            "text": text, "logprobs": []}));
        let part = json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
        self.push(json!({"type": "response.content_part.done", "item_id": id, "output_index": i, "content_index": 0,
            "part": part}));
        let item = json!({"id": id, "type": "message", "status": status, "content": [part], "role": "assistant"});
        self.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
        self.output.push(item);
        self
    }

    fn message(self, id: &str, pieces: &[&str]) -> Self {
        self.message_with_status(id, pieces, "completed")
    }

    /// A function call whose arguments stream in `pieces`.
    fn call(mut self, id: &str, call_id: &str, name: &str, pieces: &[&str]) -> Self {
        let i = self.index();
        let arguments: String = pieces.concat();
        self.push(json!({"type": "response.output_item.added", "output_index": i, "item": {
            "id": id, "type": "function_call", "status": "in_progress", "arguments": "", "call_id": call_id, "name": name}}));
        for piece in pieces {
            self.push(json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": i,
                "delta": piece, "obfuscation": "k2"}));
        }
        self.push(json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": i,
            "arguments": arguments}));
        let item = json!({"id": id, "type": "function_call", "status": "completed", "arguments": arguments,
            "call_id": call_id, "name": name});
        self.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
        self.output.push(item);
        self
    }

    /// `response.completed` with the output so far.
    fn completed(mut self, usage: Value) -> Self {
        let r = response("completed", Value::Array(self.output.clone()), usage);
        self.push(json!({"type": "response.completed", "response": r}));
        self
    }

    /// `response.incomplete` for `reason`.
    fn incomplete(mut self, reason: &str, usage: Value) -> Self {
        let mut r = response("incomplete", Value::Array(self.output.clone()), usage);
        r["incomplete_details"] = json!({"reason": reason});
        self.push(json!({"type": "response.incomplete", "response": r}));
        self
    }

    /// `response.failed` with `{code, message}`.
    fn failed(mut self, code: &str, message: &str) -> Self {
        let mut r = response("failed", Value::Array(self.output.clone()), Value::Null);
        r["error"] = json!({"code": code, "message": message});
        self.push(json!({"type": "response.failed", "response": r}));
        self
    }

    /// The SSE body: `event: {type}` and `data: {json}` per event.
    fn body(&self) -> String {
        kuralle_tests::wire_server::responses_sse(&self.events)
    }

    fn reply(&self) -> Reply {
        Reply::Sse { body: self.body(), chunked: true, piece: 37 }
    }
}

fn client(server: &Server) -> OpenAiResponsesBuilder {
    OpenAiResponses::builder().base_url(&server.base_url).api_key("sk-test-123").model("o4-mini")
}

fn user_request(text: &str) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![Message::User { content: text.into() }].into(),
        tools: Vec::new().into(),
        output: None,
    }
}

async fn collect(model: &OpenAiResponses, request: ModelRequest) -> Vec<Result<ModelEvent, ModelError>> {
    tokio::time::timeout(Duration::from_secs(20), model.stream(request).collect())
        .await
        .expect("the model stream must end")
}

fn weather_spec() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Current weather for a city.".into(),
        input_schema: json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "units": {"type": ["string", "null"]}
            },
            "required": ["city"]
        }),
        output_schema: None,
    }
}

fn delta(t: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::TextDelta { delta: t.into() })
}

fn thinking(t: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::ReasoningDelta { delta: t.into() })
}

fn text_part(text: &str, id: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Part { part: Part::Text { text: text.into(), signature: None, id: Some(id.into()) } })
}

fn call_part(id: &str, call_id: &str, name: &str, arguments: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Part {
        part: Part::ToolCall {
            call: ToolCallRequest { call_id: call_id.into(), name: name.into(), arguments: arguments.into() },
            signature: None,
            id: Some(id.into()),
        },
    })
}

fn finished(reason: FinishReason, usage: Usage) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Finish { reason, usage })
}

fn tokens(input: u64, output: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, ..Usage::default() }
}

// ---------------------------------------------------------------------------------------------
// Parsing.

#[tokio::test]
async fn text_with_a_multibyte_character_cut_between_reads() {
    let pieces = ["Grüß", " dich, ", "世界 🌍!"];
    let body =
        Stream::new().message("msg_68af40318e5c8193a5fc4b7e1a8b6a0b", &pieces).completed(usage(36, 0, 9, 0)).body();
    // Pieces of 5 bytes: some cut lands inside a multibyte character (checked, not hoped).
    let piece = 5;
    assert!(
        (piece..body.len()).step_by(piece).any(|cut| !body.is_char_boundary(cut)),
        "no read boundary falls inside a character"
    );
    let server = Server::start(vec![Reply::Sse { body, chunked: false, piece }]).await;
    let model = client(&server).build().unwrap();
    assert_eq!((model.name(), model.provider()), ("o4-mini", "openai.responses"));

    let events = collect(&model, user_request("Greet the world")).await;
    assert_eq!(
        events,
        vec![
            delta("Grüß"),
            delta(" dich, "),
            delta("世界 🌍!"),
            text_part("Grüß dich, 世界 🌍!", "msg_68af40318e5c8193a5fc4b7e1a8b6a0b"),
            finished(FinishReason::Stop, tokens(36, 9)),
        ]
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/responses"));
    assert_eq!(r.header("authorization"), Some("Bearer sk-test-123"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    // No reasoning configured: no `reasoning`, and no include a model without reasoning refuses.
    assert_eq!(
        r.body,
        json!({
            "model": "o4-mini",
            "instructions": "You are terse.",
            "input": [{"type": "message", "role": "user", "content": "Greet the world"}],
            "stream": true,
            "store": false
        })
    );
}

#[tokio::test]
async fn reasoning_summaries_stream_and_the_item_keeps_its_encrypted_content() {
    let stream = Stream::new()
        .reasoning(
            "rs_68af4031a5b88193a1c0e6d1e3c7a9f2",
            &["**Checking units**\n\nThe user wants Celsius.", "**Answering**"],
            "gAAAAABor0Axq4iVb2Lk8oM1xP-encrypted-0",
        )
        .message("msg_68af4032b7f48193b9c3d0e2f4a6c8e0", &["It is ", "21 °C."])
        .completed(usage(1_250, 1_024, 310, 256));
    let server = Server::start(vec![stream.reply()]).await;
    let model =
        client(&server).reasoning_effort("medium").reasoning_summary("auto").max_output_tokens(2_048).build().unwrap();

    let events = collect(&model, user_request("Temperature in Paris, Celsius?")).await;
    assert_eq!(
        events,
        vec![
            thinking("**Checking units**\n\nT"),
            thinking("he user wants Celsius."),
            thinking("\n\n"),
            thinking("**Answ"),
            thinking("ering**"),
            Ok(ModelEvent::Part {
                part: Part::Reasoning {
                    text: String::new(),
                    summary: vec!["**Checking units**\n\nThe user wants Celsius.".into(), "**Answering**".into()],
                    signature: None,
                    encrypted: Some("gAAAAABor0Axq4iVb2Lk8oM1xP-encrypted-0".into()),
                    id: Some("rs_68af4031a5b88193a1c0e6d1e3c7a9f2".into()),
                }
            }),
            delta("It is "),
            delta("21 °C."),
            text_part("It is 21 °C.", "msg_68af4032b7f48193b9c3d0e2f4a6c8e0"),
            finished(
                FinishReason::Stop,
                Usage {
                    input_tokens: 1_250,
                    output_tokens: 310,
                    cache_read_tokens: 1_024,
                    cache_write_tokens: 0,
                    reasoning_tokens: 256
                }
            ),
        ]
    );
    let body = &server.requests()[0].body;
    assert_eq!(body["reasoning"], json!({"effort": "medium", "summary": "auto"}));
    assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(body["max_output_tokens"], 2_048);
    assert_eq!(body["store"], false);
}

#[tokio::test]
async fn parallel_function_calls_keep_item_and_call_ids() {
    let stream = Stream::new()
        .call(
            "fc_68af4033c1d08193",
            "call_Oslo8DmO9pD3xa9X",
            "get_weather",
            &["{\"ci", "ty\":\"Os", "lo\",\"units\":null}"],
        )
        .call(
            "fc_68af4033d2e18193",
            "call_RomeTNJ32zg2hcA",
            "get_weather",
            &["{\"city\":", "\"Rome\"", ",\"units\":\"C\"}"],
        )
        .completed(usage(310, 0, 58, 0));
    let server = Server::start(vec![stream.reply()]).await;
    let model = client(&server).temperature(0.2).header("OpenAI-Organization", "org-kuralle").build().unwrap();
    let mut request = user_request("Weather in Oslo and Rome?");
    request.tools = vec![weather_spec()].into();

    let events = collect(&model, request).await;
    assert_eq!(
        events,
        vec![
            call_part("fc_68af4033c1d08193", "call_Oslo8DmO9pD3xa9X", "get_weather", r#"{"city":"Oslo","units":null}"#),
            call_part("fc_68af4033d2e18193", "call_RomeTNJ32zg2hcA", "get_weather", r#"{"city":"Rome","units":"C"}"#),
            finished(FinishReason::ToolCalls, tokens(310, 58)),
        ]
    );
    let r = &server.requests()[0];
    assert_eq!(r.header("openai-organization"), Some("org-kuralle"));
    assert_eq!(
        r.body,
        json!({
            "model": "o4-mini",
            "instructions": "You are terse.",
            "input": [{"type": "message", "role": "user", "content": "Weather in Oslo and Rome?"}],
            "tools": [{
                "type": "function",
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "description": "City name"},
                        "units": {"type": ["string", "null"]}
                    },
                    "required": ["city", "units"],
                    "additionalProperties": false
                },
                "strict": true
            }],
            "parallel_tool_calls": true,
            "stream": true,
            "store": false,
            "temperature": 0.2
        })
    );
}

#[tokio::test]
async fn strict_tools_can_be_switched_off() {
    let server =
        Server::start(vec![Stream::new().message("msg_1", &["ok"]).completed(usage(5, 0, 1, 0)).reply()]).await;
    let model = client(&server).strict_tools(false).build().unwrap();
    let mut request = user_request("hi");
    request.tools = vec![weather_spec()].into();
    collect(&model, request).await;
    assert_eq!(
        server.requests()[0].body["tools"],
        json!([{
            "type": "function",
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "units": {"type": ["string", "null"]}
                },
                "required": ["city"]
            },
            "strict": false
        }])
    );
}

#[tokio::test]
async fn incomplete_responses_finish_with_their_reason() {
    for (reason, want) in [
        ("max_output_tokens", FinishReason::Length),
        ("content_filter", FinishReason::ContentFilter),
        ("some_new_reason", FinishReason::Other("some_new_reason".into())),
    ] {
        let stream = Stream::new()
            .message_with_status("msg_68af40350a", &["The first ", "part"], "incomplete")
            .incomplete(reason, usage(20, 0, 16, 0));
        let server = Server::start(vec![stream.reply()]).await;
        let model = client(&server).max_output_tokens(16).build().unwrap();
        let events = collect(&model, user_request("Write a long story")).await;
        assert_eq!(
            events,
            vec![
                delta("The first "),
                delta("part"),
                text_part("The first part", "msg_68af40350a"),
                finished(want, tokens(20, 16)),
            ],
            "{reason}"
        );
    }
}

#[tokio::test]
async fn a_response_cut_while_reasoning_keeps_its_reasoning_out_of_the_next_request() {
    // The output limit hit during reasoning: a reasoning item and nothing after it.
    let stream = Stream::new()
        .reasoning("rs_68af4036", &["Planning"], "gAAAAB-enc-cut")
        .incomplete("max_output_tokens", usage(40, 0, 64, 64));
    let server = Server::start(vec![stream.reply()]).await;
    let model = client(&server).reasoning_effort("high").max_output_tokens(64).build().unwrap();
    let events = collect(&model, user_request("Prove it")).await;
    let parts: Vec<Part> = events
        .iter()
        .filter_map(|e| match e {
            Ok(ModelEvent::Part { part }) => Some(part.clone()),
            _ => None,
        })
        .collect();
    assert!(matches!(&parts[..], [Part::Reasoning { id: Some(id), .. }] if id == "rs_68af4036"), "{parts:?}");
    assert_eq!(events.last(), Some(&finished(FinishReason::Length, Usage { reasoning_tokens: 64, ..tokens(40, 64) })));

    // Sent back, a reasoning item without the item it produced is refused by the API.
    let server =
        Server::start(vec![Stream::new().message("msg_2", &["Done."]).completed(usage(50, 0, 2, 0)).reply()]).await;
    let model = client(&server).reasoning_effort("high").build().unwrap();
    let mut request = user_request("Prove it");
    request.messages = vec![
        Message::User { content: "Prove it".into() },
        Message::Assistant { parts, origin: Some(kuralle::Origin::new("openai.responses", "o4-mini")) },
        Message::User { content: "Go on".into() },
    ]
    .into();
    collect(&model, request).await;
    assert_eq!(
        server.requests()[0].body["input"],
        json!([
            {"type": "message", "role": "user", "content": "Prove it"},
            {"type": "message", "role": "user", "content": "Go on"}
        ])
    );
}

#[tokio::test]
async fn a_refusal_is_the_turns_text_and_finishes_as_refusal() {
    let id = "msg_68af4037refusal";
    let refusal = "I can’t help with that.";
    let mut stream = Stream::new();
    stream.push(json!({"type": "response.output_item.added", "output_index": 0,
        "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}));
    stream.push(json!({"type": "response.content_part.added", "item_id": id, "output_index": 0, "content_index": 0,
        "part": {"type": "refusal", "refusal": ""}}));
    for piece in ["I can’t ", "help with that."] {
        stream.push(json!({"type": "response.refusal.delta", "item_id": id, "output_index": 0, "content_index": 0,
            "delta": piece}));
    }
    stream.push(json!({"type": "response.refusal.done", "item_id": id, "output_index": 0, "content_index": 0,
        "refusal": refusal}));
    let item = json!({"id": id, "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "refusal", "refusal": refusal}]});
    stream.push(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    stream.output.push(item);
    let server = Server::start(vec![stream.completed(usage(30, 0, 8, 0)).reply()]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Something harmful")).await;
    assert_eq!(
        events,
        vec![
            delta("I can’t "),
            delta("help with that."),
            text_part(refusal, id),
            finished(FinishReason::Refusal, tokens(30, 8)),
        ]
    );
}

#[tokio::test]
async fn a_failed_response_is_typed_and_only_busy_ones_are_asked_again() {
    // Context window: typed, never retried.
    let server = Server::start(vec![
        Stream::new().failed("context_length_exceeded", "Your input exceeds the context window of this model.").reply(),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("huge")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::ContextWindowExceeded(m))] if m.contains("exceeds the context window")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 1);

    // A server error: a provider error, not retried.
    let server = Server::start(vec![
        Stream::new().failed("server_error", "An error occurred while processing your request.").reply(),
        Stream::new().message("msg_x", &["unused"]).completed(usage(1, 0, 1, 0)).reply(),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Provider(m))] if m.contains("An error occurred") && m.contains("server_error")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_rate_limit_failure_before_any_output_is_asked_again() {
    let server = Server::start(vec![
        Stream::new().failed("rate_limit_exceeded", "Rate limit reached for o4-mini on tokens per min (TPM).").reply(),
        Stream::new().message("msg_68af4038", &["after ", "the wait"]).completed(usage(12, 0, 3, 0)).reply(),
    ])
    .await;
    let model = client(&server).retry_backoff(Duration::from_millis(100), Duration::from_millis(200)).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(
        events,
        vec![
            delta("after "),
            delta("the wait"),
            text_part("after the wait", "msg_68af4038"),
            finished(FinishReason::Stop, tokens(12, 3))
        ]
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "exactly one retry");
    assert!(requests[1].at - requests[0].at >= Duration::from_millis(50));
    assert_eq!(requests[0].body, requests[1].body);
}

#[tokio::test(start_paused = true)]
async fn an_error_event_after_output_is_final() {
    let mut stream = Stream::new();
    let id = "msg_68af4039";
    stream.push(json!({"type": "response.output_item.added", "output_index": 0,
        "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}}));
    stream.push(json!({"type": "response.output_text.delta", "item_id": id, "output_index": 0, "content_index": 0,
        "delta": "Hel"}));
    stream.push(json!({"type": "error", "code": "server_is_overloaded",
        "message": "The server is overloaded. Please try again later.", "param": null}));
    let server = Server::start(vec![stream.reply(), stream.reply()]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], delta("Hel"));
    assert!(matches!(&events[1], Err(ModelError::Overloaded(m)) if m.contains("overloaded")), "{events:?}");
    assert_eq!(server.requests().len(), 1, "a started answer is never asked again");

    // The same error before any output is asked again, until the budget is spent.
    let mut busy = Stream::new();
    busy.push(json!({"type": "error", "code": "server_is_overloaded", "message": "The server is overloaded."}));
    let server = Server::start(vec![busy.reply(), busy.reply(), busy.reply()]).await;
    let model = client(&server).max_retries(2).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Overloaded(_))]), "{events:?}");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_non_streamed_response_object_is_accepted() {
    let output = json!([
        {"id": "rs_json1", "type": "reasoning", "encrypted_content": "gAAAAB-json", "summary": []},
        {"id": "msg_json1", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
        {"id": "fc_json1", "type": "function_call", "status": "completed", "call_id": "call_json1",
         "name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"units\":null}"}
    ]);
    let body = response("completed", output, usage(40, 0, 30, 12)).to_string();
    let server = Server::start(vec![Reply::Status { status: 200, reason: "OK", headers: vec![], body }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Weather in Oslo?")).await;
    assert_eq!(
        events,
        vec![
            Ok(ModelEvent::Part {
                part: Part::Reasoning {
                    text: String::new(),
                    summary: vec![],
                    signature: None,
                    encrypted: Some("gAAAAB-json".into()),
                    id: Some("rs_json1".into())
                }
            }),
            text_part("Let me check.", "msg_json1"),
            call_part("fc_json1", "call_json1", "get_weather", r#"{"city":"Oslo","units":null}"#),
            finished(FinishReason::ToolCalls, Usage { reasoning_tokens: 12, ..tokens(40, 30) }),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// The follow-up request: what a run sends back.

#[tokio::test]
async fn a_run_sends_every_reasoning_item_and_item_id_back_exactly() {
    let enc_1 = "gAAAAABor0B1-first-encrypted-reasoning-blob==";
    let enc_2 = "gAAAAABor0B2-second-encrypted-reasoning-blob==";
    let reply_1 = Stream::new()
        .reasoning("rs_1", &["Oslo first."], enc_1)
        .call("fc_1", "call_1", "lookup", &["{\"city\":", "\"Oslo\"}"])
        .reasoning("rs_2", &["Then Rome."], enc_2)
        .call("fc_2", "call_2", "lookup", &["{\"city\":\"Rome\"}"])
        .completed(usage(120, 0, 90, 64));
    let reply_2 = Stream::new().message("msg_3", &["Oslo is 3 °C, ", "Rome 18 °C."]).completed(usage(260, 128, 20, 0));
    let server = Server::start(vec![reply_1.reply(), reply_2.reply()]).await;
    let model = client(&server).reasoning_effort("high").reasoning_summary("auto").build().unwrap();
    let lookup = kuralle_tests::FnTool::new("lookup", |args, _| async move {
        let temp = if args["city"] == "Oslo" { 3 } else { 18 };
        Ok(json!({"city": args["city"], "temp_c": temp}))
    });
    let runtime = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("weather", "Use lookup for each city.").tool(lookup))
        .model(model)
        .build()
        .unwrap();
    let mut handle = runtime.run("Weather in Oslo and Rome?");
    let mut reasoning = String::new();
    while let Some(event) = handle.next().await {
        if let kuralle::Event::ReasoningDelta { delta } = event {
            reasoning.push_str(&delta);
        }
    }
    let out = handle.await.unwrap();
    assert_eq!(out.text, "Oslo is 3 °C, Rome 18 °C.");
    assert_eq!(reasoning, "Oslo first.Then Rome.");
    assert_eq!(
        out.usage,
        Usage {
            input_tokens: 380,
            output_tokens: 110,
            cache_read_tokens: 128,
            cache_write_tokens: 0,
            reasoning_tokens: 64
        }
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let (first, second) = (&requests[0].body, &requests[1].body);
    assert_eq!(first["input"], json!([{"type": "message", "role": "user", "content": "Weather in Oslo and Rome?"}]));
    assert_eq!(first["tools"][0]["name"], "lookup");
    assert_eq!(
        second["input"],
        json!([
            {"type": "message", "role": "user", "content": "Weather in Oslo and Rome?"},
            {"type": "reasoning", "id": "rs_1", "encrypted_content": enc_1,
             "summary": [{"type": "summary_text", "text": "Oslo first."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "reasoning", "id": "rs_2", "encrypted_content": enc_2,
             "summary": [{"type": "summary_text", "text": "Then Rome."}]},
            {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "lookup", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"city\":\"Oslo\",\"temp_c\":3}"},
            {"type": "function_call_output", "call_id": "call_2", "output": "{\"city\":\"Rome\",\"temp_c\":18}"}
        ])
    );
    for body in [first, second] {
        assert_eq!(body["store"], false);
        assert_eq!(body["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(body["reasoning"], json!({"effort": "high", "summary": "auto"}));
        assert_eq!(body["instructions"], "Use lookup for each city.");
    }
}

#[tokio::test]
async fn reasoning_items_survive_the_journal_into_the_next_turn_of_a_reopened_store() {
    let enc = "gAAAAABor0C1-journaled-encrypted-reasoning==";
    let server = Server::start(vec![
        Stream::new()
            .reasoning("rs_j1", &["Look it up."], enc)
            .call("fc_j1", "call_j1", "lookup", &["{\"city\":\"Oslo\"}"])
            .completed(usage(50, 0, 40, 32))
            .reply(),
        Stream::new().message("msg_j2", &["Oslo: 3 °C."]).completed(usage(80, 0, 6, 0)).reply(),
        Stream::new().message("msg_j3", &["Tomorrow: 5 °C."]).completed(usage(120, 0, 6, 0)).reply(),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let runtime = |store| {
        let lookup = kuralle_tests::FnTool::new("lookup", |_, _| async move { Ok(json!({"temp_c": 3})) });
        kuralle::Runtime::builder()
            .agent(kuralle::AgentDef::new("weather", "Use lookup.").tool(lookup))
            .model(client(&server).reasoning_effort("medium").build().unwrap())
            .store(store)
            .build()
            .unwrap()
    };
    let first = runtime(kuralle::stores::SqliteStore::open(dir.path().join("runs.db")).unwrap());
    let out = first.run(kuralle::RunRequest::new("Weather in Oslo?").run_id("s-j")).await.unwrap();
    assert_eq!(out.text, "Oslo: 3 °C.");
    drop(first);

    // Another process, as it were: the store reopened, the transcript read back from it.
    let second = runtime(kuralle::stores::SqliteStore::open(dir.path().join("runs.db")).unwrap());
    let out = second.run(kuralle::RunRequest::new("And tomorrow?").run_id("s-j")).await.unwrap();
    assert_eq!(out.text, "Tomorrow: 5 °C.");
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        requests[2].body["input"],
        json!([
            {"type": "message", "role": "user", "content": "Weather in Oslo?"},
            {"type": "reasoning", "id": "rs_j1", "encrypted_content": enc,
             "summary": [{"type": "summary_text", "text": "Look it up."}]},
            {"type": "function_call", "id": "fc_j1", "call_id": "call_j1", "name": "lookup", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "call_j1", "output": "{\"temp_c\":3}"},
            {"type": "message", "role": "assistant", "id": "msg_j2",
             "content": [{"type": "output_text", "text": "Oslo: 3 °C.", "annotations": []}]},
            {"type": "message", "role": "user", "content": "And tomorrow?"}
        ])
    );
}

#[tokio::test]
async fn a_turn_from_the_chat_wire_sends_no_reasoning_and_no_item_ids() {
    // Turn 1 on the chat-completions wire (a DeepSeek-style model that streams its thinking),
    // turn 2 of the same session on the Responses wire.
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "deepseek-reasoner",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let chat_sse = |chunks: Vec<Value>| {
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        body.push_str("data: [DONE]\n\n");
        Reply::Sse { body, chunked: true, piece: 41 }
    };
    let chat = Server::start(vec![
        chat_sse(vec![
            chunk(json!({"role": "assistant", "reasoning_content": "The user wants Oslo."}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_ds_1", "type": "function",
                    "function": {"name": "lookup", "arguments": "{\"city\":\"Oslo\"}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
        ]),
        chat_sse(vec![chunk(json!({"content": "Oslo is 3 °C."}), json!("stop"))]),
    ])
    .await;
    let responses =
        Server::start(vec![Stream::new().message("msg_r1", &["Rome is 18 °C."]).completed(usage(90, 0, 6, 0)).reply()])
            .await;
    let store: Arc<dyn kuralle::RunStore> = Arc::new(kuralle::stores::MemoryStore::new());
    let lookup = || {
        kuralle_tests::FnTool::new("lookup", |args, _| async move { Ok(json!({"city": args["city"], "temp_c": 3})) })
    };
    let agent = || kuralle::AgentDef::new("weather", "Use lookup.").tool(lookup());
    let on_chat = kuralle::Runtime::builder()
        .agent(agent())
        .model(
            OpenAi::builder().base_url(&chat.base_url).api_key("sk-test").model("deepseek-reasoner").build().unwrap(),
        )
        .store_arc(Arc::clone(&store))
        .build()
        .unwrap();
    let out = on_chat.run(kuralle::RunRequest::new("Weather in Oslo?").run_id("s-1")).await.unwrap();
    assert_eq!(out.text, "Oslo is 3 °C.");
    assert_eq!(chat.requests()[1].body["messages"][2]["reasoning_content"], "The user wants Oslo.");

    let on_responses = kuralle::Runtime::builder()
        .agent(agent())
        .model(client(&responses).reasoning_effort("low").build().unwrap())
        .store_arc(store)
        .build()
        .unwrap();
    let out = on_responses.run(kuralle::RunRequest::new("And Rome?").run_id("s-1")).await.unwrap();
    assert_eq!(out.text, "Rome is 18 °C.");
    assert_eq!(
        responses.requests()[0].body["input"],
        json!([
            {"type": "message", "role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": "call_ds_1", "name": "lookup", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "call_ds_1", "output": "{\"city\":\"Oslo\",\"temp_c\":3}"},
            {"type": "message", "role": "assistant", "content": "Oslo is 3 °C."},
            {"type": "message", "role": "user", "content": "And Rome?"}
        ])
    );
}

#[tokio::test]
async fn state_minted_for_another_wire_never_goes_to_this_one() {
    // Turns that carry Responses-shaped state (item ids, encrypted reasoning) but came from
    // another wire: the chat wire (same vendor, different wire) and Anthropic.
    let server = Server::start(
        (0..2).map(|_| Stream::new().message("msg_ok", &["ok"]).completed(usage(9, 0, 1, 0)).reply()).collect(),
    )
    .await;
    let model = client(&server).reasoning_effort("low").build().unwrap();
    for origin in [kuralle::Origin::new("openai", "gpt-4o"), kuralle::Origin::new("anthropic", "claude-sonnet-4-5")] {
        let mut request = user_request("Weather in Oslo?");
        request.messages = vec![
            Message::User { content: "Weather in Oslo?".into() },
            Message::Assistant {
                parts: vec![
                    Part::Reasoning {
                        text: "thinking".into(),
                        summary: vec!["Oslo.".into()],
                        signature: Some("EqQBCkYIARgC".into()),
                        encrypted: Some("gAAAAB-foreign".into()),
                        id: Some("rs_foreign".into()),
                    },
                    Part::RedactedReasoning { data: "EmwKAhgB".into() },
                    Part::Text {
                        text: "Checking.".into(),
                        signature: Some("sig".into()),
                        id: Some("msg_foreign".into()),
                    },
                    Part::ToolCall {
                        call: ToolCallRequest {
                            call_id: "call_f1".into(),
                            name: "lookup".into(),
                            arguments: "{}".into(),
                        },
                        signature: Some("sig".into()),
                        id: Some("fc_foreign".into()),
                    },
                ],
                origin: Some(origin.clone()),
            },
            Message::Tool { call_id: "call_f1".into(), name: "lookup".into(), content: json!("3 °C") },
        ]
        .into();
        let events = collect(&model, request).await;
        assert!(events.iter().all(Result::is_ok), "{events:?}");
        let requests = server.requests();
        assert_eq!(
            requests.last().unwrap().body["input"],
            json!([
                {"type": "message", "role": "user", "content": "Weather in Oslo?"},
                {"type": "message", "role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": "call_f1", "name": "lookup", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_f1", "output": "3 °C"}
            ]),
            "{origin:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Hostile servers.

#[tokio::test(start_paused = true)]
async fn rate_limited_then_success_honours_retry_after() {
    let server = Server::start(vec![
        Reply::Status {
            status: 429,
            reason: "Too Many Requests",
            headers: vec![("retry-after", "1")],
            body: json!({"error": {"message": "Rate limit reached for o4-mini on requests per min (RPM): Limit 3, Used 3, Requested 1.",
                "type": "requests", "param": null, "code": "rate_limit_exceeded"}})
            .to_string(),
        },
        Stream::new().message("msg_after", &["after the wait"]).completed(usage(5, 0, 3, 0)).reply(),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(
        events,
        vec![
            delta("after the wait"),
            text_part("after the wait", "msg_after"),
            finished(FinishReason::Stop, tokens(5, 3))
        ]
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "exactly one retry");
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(2), "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn persistent_5xx_fails_after_the_retry_budget() {
    let error = || {
        Reply::Status {
        status: 502,
        reason: "Bad Gateway",
        headers: vec![],
        body: json!({"error": {"message": "Upstream connect error.", "type": "server_error", "param": null, "code": null}})
            .to_string(),
    }
    };
    let server = Server::start(vec![error(), error(), error()]).await;
    let model = client(&server)
        .max_retries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(50))
        .build()
        .unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Http { status: 502, attempts: 3, message })] if message.contains("Upstream")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn unauthorized_is_auth_without_retry() {
    let server = Server::start(vec![Reply::Status {
        status: 401,
        reason: "Unauthorized",
        headers: vec![],
        body:
            json!({"error": {"message": "Incorrect API key provided: sk-test-***123.", "type": "invalid_request_error",
            "param": null, "code": "invalid_api_key"}})
            .to_string(),
    }])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Auth { status: 401, message })] if message.contains("Incorrect API key")),
        "{events:?}"
    );
    assert!(!format!("{events:?}").contains("sk-test-123"), "the key never shows in errors");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.requests().len(), 1, "401 is never retried");
}

#[tokio::test]
async fn other_4xx_is_http_and_a_context_overflow_is_typed() {
    let server = Server::start(vec![
        Reply::Status {
            status: 400,
            reason: "Bad Request",
            headers: vec![],
            body: json!({"error": {"message": "Unsupported parameter: 'temperature' is not supported with this model.",
                "type": "invalid_request_error", "param": "temperature", "code": "unsupported_parameter"}})
            .to_string(),
        },
        Reply::Status {
            status: 400,
            reason: "Bad Request",
            headers: vec![],
            body: json!({"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
                "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}})
            .to_string(),
        },
    ])
    .await;
    let model = client(&server).temperature(0.5).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Http { status: 400, attempts: 1, message })] if message.contains("Unsupported parameter")),
        "{events:?}"
    );
    let events = collect(&model, user_request("a very long prompt")).await;
    assert!(matches!(&events[..], [Err(ModelError::ContextWindowExceeded(_))]), "{events:?}");
    assert_eq!(server.requests().len(), 2);
}

/// The events of a stream up to (not including) its end.
fn started(pieces: &[&str]) -> String {
    let mut stream = Stream::new().message("msg_cut", pieces);
    // Drop the message's done events: the answer is still streaming.
    stream.events.truncate(stream.events.len() - 3);
    stream.body()
}

#[tokio::test]
async fn connection_cut_mid_stream_is_a_transport_error() {
    let server = Server::start(vec![Reply::Cut { body: started(&["Once upon"]) }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Tell a story")).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], delta("Once upon"));
    assert!(matches!(&events[1], Err(ModelError::Transport(_))), "{events:?}");
    assert_eq!(server.requests().len(), 1, "a started stream is never retried");
}

#[tokio::test]
async fn truncated_stream_is_a_protocol_error() {
    let server =
        Server::start(vec![Reply::Sse { body: started(&["Once ", "upon"]), chunked: false, piece: 1000 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Tell a story")).await;
    assert_eq!(events[..2], [delta("Once "), delta("upon")]);
    assert!(matches!(&events[2..], [Err(ModelError::Protocol(m))] if m.contains("truncated")), "{events:?}");
}

#[tokio::test]
async fn malformed_event_json_is_a_protocol_error() {
    let body = format!(
        "{}event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"item_id\":\n\n",
        Stream::new().body()
    );
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 16 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Protocol(m))] if m.contains("invalid event")), "{events:?}");
}

#[tokio::test]
async fn garbage_bodies_are_protocol_errors() {
    let server = Server::start(vec![
        // An event stream of garbage: no event ever ends the response.
        Reply::Sse { body: "\u{0}\u{1}garbage\nnot: sse\n\n<<<>>>\n".into(), chunked: true, piece: 7 },
        // Data that is not JSON.
        Reply::Sse { body: "data: hello world\n\n".into(), chunked: false, piece: 5 },
        // A JSON answer that is not a response object.
        Reply::Status { status: 200, reason: "OK", headers: vec![], body: "<html><body>Gateway</body></html>".into() },
        Reply::Status { status: 200, reason: "OK", headers: vec![], body: json!({"status": "queued"}).to_string() },
    ])
    .await;
    let model = client(&server).max_retries(0).build().unwrap();
    for case in ["garbage stream", "non-JSON data", "HTML as JSON", "unfinished response"] {
        let events = collect(&model, user_request("hi")).await;
        assert!(matches!(&events[..], [Err(ModelError::Protocol(_))]), "{case}: {events:?}");
    }
}

#[tokio::test]
async fn a_wrong_content_type_is_a_protocol_error() {
    // A captive portal or misrouted proxy: 200 with an HTML page.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                return;
            }
            request.extend_from_slice(&buf[..n]);
        }
        let page = "<!doctype html><html><body>Sign in to the network</body></html>";
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
            page.len()
        );
        socket.write_all(reply.as_bytes()).await.unwrap();
        socket.shutdown().await.ok();
    });
    let model = OpenAiResponses::builder().base_url(base_url).api_key("k").model("o4-mini").build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Protocol(m))] if m.contains("truncated")), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn request_timeout_applies() {
    let server = Server::start(vec![Reply::Hang]).await;
    let model = client(&server).timeout(Duration::from_millis(300)).build().unwrap();
    let started = Instant::now();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Transport(_))]), "{events:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_stalls_after_its_first_event_times_out() {
    let server = Server::start(vec![Reply::StreamThenWait { body: started(&["Once"]) }]).await;
    let model = client(&server).timeout(Duration::from_millis(500)).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events[0], delta("Once"));
    assert!(matches!(&events[1..], [Err(ModelError::Transport(_))]), "{events:?}");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let mut server = Server::start(vec![Reply::StreamThenWait { body: started(&["first"]) }]).await;
    let model = client(&server).build().unwrap();
    let mut stream = model.stream(user_request("hi"));
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    assert_eq!(first, Some(delta("first")));
    drop(stream);
    let seen = tokio::time::timeout(Duration::from_secs(5), server.disconnects.recv()).await;
    assert_eq!(seen, Ok(Some(())), "the server saw the client go away");
}

#[tokio::test]
async fn a_base_url_without_a_key_sends_no_authorization() {
    let server =
        Server::start(vec![Stream::new().message("msg_l", &["hi"]).completed(usage(3, 0, 1, 0)).reply()]).await;
    let model =
        OpenAiResponses::builder().base_url(format!("{}/", server.base_url)).model("gpt-oss-20b").build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events.last(), Some(&finished(FinishReason::Stop, tokens(3, 1))));
    let requests = server.requests();
    assert_eq!(requests[0].path, "/v1/responses");
    assert_eq!(requests[0].header("authorization"), None);
}

#[tokio::test]
async fn a_schema_strict_mode_cannot_express_is_an_invalid_request() {
    let server = Server::start(vec![]).await;
    let model = client(&server).build().unwrap();
    let mut request = user_request("hi");
    let mut spec = weather_spec();
    spec.input_schema["properties"]["tags"] = json!({"type": "object", "additionalProperties": {"type": "string"}});
    request.tools = vec![spec].into();
    let events = collect(&model, request).await;
    assert!(
        matches!(&events[..], [Err(ModelError::InvalidRequest(m))] if m.contains("/properties/tags")),
        "{events:?}"
    );
    assert!(server.requests().is_empty());
}

/// A 429 that persists is retried by the request's own budget only: the answer that never came
/// is not asked for again by the before-first-event retry (that would be (n + 1)² requests).
#[tokio::test(start_paused = true)]
async fn persistent_429_spends_the_retry_budget_once() {
    let limited = || {
        Reply::Status {
        status: 429,
        reason: "Too Many Requests",
        headers: vec![],
        body: json!({"error": {"message": "Rate limit reached.", "type": "requests", "param": null, "code": "rate_limit_exceeded"}})
            .to_string(),
    }
    };
    let server = Server::start((0..9).map(|_| limited()).collect()).await;
    let model = client(&server)
        .max_retries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(50))
        .build()
        .unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::RateLimited { attempts: 3, .. })]), "{events:?}");
    assert_eq!(server.requests().len(), 3);
}
