//! `kuralle::models::Anthropic` against a local HTTP/1.1 server that records every request and
//! answers with event streams in the Messages API's documented format (`event:` + `data:`
//! frames, cut into small pieces).

use std::time::Duration;

use futures::StreamExt;
use kuralle::{
    FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, Origin, Part, ToolCallRequest, ToolSpec, Usage,
    models::{Anthropic, AnthropicBuilder},
};
use kuralle_tests::wire_server::{Reply, Server};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    time::Instant,
};

// ---------------------------------------------------------------------------------------------
// The wire format: events as the Messages API streams them.

const SIGNATURE: &str = "EqQBCkYIBRgCIkD2hZ1cTr9dC8YbKj/yfN4u0m9e8xR0k3bVd5kq8FfA0x0fJ4pH2yQj1xIbH9pBvKrj6mC4kK8cF3XqHvQEgwIcB6fW3fZ+2N3ZL8aDN2Yf9yVxJzLw9H9pSIw==";
const REDACTED: &str =
    "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj2pYmMEjU=";

fn frame(event: &Value) -> String {
    format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap())
}

fn body(events: &[Value]) -> String {
    events.iter().map(frame).collect()
}

fn sse(events: &[Value]) -> Reply {
    Reply::Sse { body: body(events), chunked: true, piece: 23 }
}

fn message_start(input: u64, cache_write: u64, cache_read: u64) -> Value {
    json!({"type": "message_start", "message": {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant", "content": [],
        "model": "claude-sonnet-4-5-20250929", "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input, "cache_creation_input_tokens": cache_write,
                  "cache_read_input_tokens": cache_read, "output_tokens": 1, "service_tier": "standard"}
    }})
}

fn ping() -> Value {
    json!({"type": "ping"})
}

fn block_stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn text_block(index: u64, pieces: &[&str]) -> Vec<Value> {
    let mut events =
        vec![json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})];
    events.extend(
        pieces.iter().map(
            |p| json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}),
        ),
    );
    events.push(block_stop(index));
    events
}

fn thinking_block(index: u64, pieces: &[&str], signature: &str) -> Vec<Value> {
    let mut events = vec![json!({"type": "content_block_start", "index": index,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""}})];
    events.extend(pieces.iter().map(
        |p| json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": p}}),
    ));
    events.push(
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}}),
    );
    events.push(block_stop(index));
    events
}

fn redacted_block(index: u64, data: &str) -> Vec<Value> {
    vec![
        json!({"type": "content_block_start", "index": index, "content_block": {"type": "redacted_thinking", "data": data}}),
        block_stop(index),
    ]
}

/// A `tool_use` block: the start with `input: {}`, then one `input_json_delta` per fragment.
fn tool_block(index: u64, id: &str, name: &str, fragments: &[&str]) -> Vec<Value> {
    let mut events = vec![json!({"type": "content_block_start", "index": index,
        "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})];
    events.extend(fragments.iter().map(|f| {
        json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": f}})
    }));
    events.push(block_stop(index));
    events
}

fn message_end(stop_reason: &str, output: u64) -> Vec<Value> {
    vec![
        json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": output}}),
        json!({"type": "message_stop"}),
    ]
}

fn error_event(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// A whole response: `message_start`, a ping, the blocks, the end.
fn response(blocks: Vec<Vec<Value>>, stop_reason: &str, input: u64, output: u64) -> Vec<Value> {
    let mut events = vec![message_start(input, 0, 0), ping()];
    events.extend(blocks.into_iter().flatten());
    events.extend(message_end(stop_reason, output));
    events
}

// ---------------------------------------------------------------------------------------------
// Client-side helpers.

fn client(server: &Server) -> AnthropicBuilder {
    Anthropic::builder().base_url(&server.origin).api_key("sk-ant-api03-test").model("claude-sonnet-4-5")
}

fn user_request(text: &str) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![Message::User { content: text.into() }].into(),
        tools: Vec::new().into(),
        output: None,
    }
}

async fn collect(model: &Anthropic, request: ModelRequest) -> Vec<Result<ModelEvent, ModelError>> {
    tokio::time::timeout(Duration::from_secs(20), model.stream(request).collect())
        .await
        .expect("the model stream must end")
}

fn spec(name: &str, description: &str, properties: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema: json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": properties,
        }),
        output_schema: None,
    }
}

fn delta(t: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::TextDelta { delta: t.into() })
}

fn reasoning(t: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::ReasoningDelta { delta: t.into() })
}

fn part(part: Part) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Part { part })
}

fn text_part(t: &str) -> Result<ModelEvent, ModelError> {
    part(Part::text(t))
}

fn thinking(text: &str, signature: &str) -> Part {
    Part::Reasoning { text: text.into(), summary: vec![], signature: Some(signature.into()), encrypted: None, id: None }
}

fn call(id: &str, name: &str, args: &str) -> ToolCallRequest {
    ToolCallRequest { call_id: id.into(), name: name.into(), arguments: args.into() }
}

fn call_event(id: &str, name: &str, args: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::ToolCall(call(id, name, args)))
}

fn finished(reason: FinishReason, usage: Usage) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Finish { reason, usage })
}

fn tokens(input: u64, output: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, ..Usage::default() }
}

fn anthropic_origin() -> Option<Origin> {
    Some(Origin::new("anthropic", "claude-sonnet-4-5"))
}

// ---------------------------------------------------------------------------------------------
// Parsing.

#[tokio::test]
async fn text_with_cache_usage_and_the_request_shape() {
    let mut events = vec![message_start(21, 188, 1024), ping()];
    events.extend(text_block(0, &["Hello", ", wörld", "!"]));
    events.push(ping());
    events.extend(message_end("end_turn", 12));
    let server = Server::start(vec![Reply::Sse { body: body(&events), chunked: false, piece: 7 }]).await;
    let model = client(&server).build().unwrap();
    assert_eq!((model.name(), model.provider()), ("claude-sonnet-4-5", "anthropic"));

    let got = collect(&model, user_request("Say hello")).await;
    let usage = Usage {
        input_tokens: 21 + 188 + 1024,
        output_tokens: 12,
        cache_read_tokens: 1024,
        cache_write_tokens: 188,
        reasoning_tokens: 0,
    };
    assert_eq!(
        got,
        vec![
            delta("Hello"),
            delta(", wörld"),
            delta("!"),
            text_part("Hello, wörld!"),
            finished(FinishReason::Stop, usage)
        ]
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/messages"));
    assert_eq!(r.header("x-api-key"), Some("sk-ant-api03-test"));
    assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(r.header("authorization"), None);
    assert_eq!(r.header("anthropic-beta"), None);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    assert_eq!(
        r.body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "stream": true,
            "system": "You are terse.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}]
        })
    );
}

#[tokio::test]
async fn thinking_redacted_thinking_text_and_calls_arrive_in_order() {
    let server = Server::start(vec![sse(&response(
        vec![
            thinking_block(0, &["The user wants", " the weather."], SIGNATURE),
            redacted_block(1, REDACTED),
            text_block(2, &["I'll check", " both."]),
            // The first fragment is empty, as the API streams it; the input is cut anywhere.
            tool_block(3, "toolu_01A09q90qw90lq917835lq9", "get_weather", &["", "{\"city\": ", "\"Par", "is\"}"]),
            // A call without arguments: no fragment at all ...
            tool_block(4, "toolu_01B2", "current_time", &[]),
            // ... or only the empty one.
            tool_block(5, "toolu_01C3", "current_time", &[""]),
        ],
        "tool_use",
        472,
        89,
    ))])
    .await;
    let model = client(&server).max_tokens(8192).thinking(4096).build().unwrap();
    let got = collect(&model, user_request("Weather in Paris, and the time?")).await;
    assert_eq!(
        got,
        vec![
            reasoning("The user wants"),
            reasoning(" the weather."),
            part(thinking("The user wants the weather.", SIGNATURE)),
            part(Part::RedactedReasoning { data: REDACTED.into() }),
            delta("I'll check"),
            delta(" both."),
            text_part("I'll check both."),
            call_event("toolu_01A09q90qw90lq917835lq9", "get_weather", "{\"city\": \"Paris\"}"),
            call_event("toolu_01B2", "current_time", "{}"),
            call_event("toolu_01C3", "current_time", "{}"),
            finished(FinishReason::ToolCalls, tokens(472, 89)),
        ]
    );
    let body = &server.requests()[0].body;
    assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
    assert_eq!(body["max_tokens"], 8192);
}

#[tokio::test]
async fn a_signature_only_thinking_block_round_trips() {
    let answer =
        || sse(&response(vec![thinking_block(0, &[], SIGNATURE), text_block(1, &["Done."])], "end_turn", 9, 4));
    let server = Server::start(vec![answer(), answer()]).await;
    let model = client(&server).max_tokens(2048).thinking(1024).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert_eq!(
        got,
        vec![
            part(thinking("", SIGNATURE)),
            delta("Done."),
            text_part("Done."),
            finished(FinishReason::Stop, tokens(9, 4))
        ]
    );

    // The turn as the runtime keeps it goes back with the empty thinking and its signature.
    let mut request = user_request("hi");
    request.messages = vec![
        Message::User { content: "hi".into() },
        Message::Assistant { parts: vec![thinking("", SIGNATURE), Part::text("Done.")], origin: anthropic_origin() },
        Message::User { content: "Again?".into() },
    ]
    .into();
    collect(&model, request).await;
    assert_eq!(
        server.requests()[1].body["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "", "signature": SIGNATURE},
            {"type": "text", "text": "Done."}
        ]})
    );
}

#[tokio::test]
async fn every_stop_reason() {
    for (wire, reason) in [
        ("end_turn", FinishReason::Stop),
        ("stop_sequence", FinishReason::Stop),
        ("tool_use", FinishReason::ToolCalls),
        ("max_tokens", FinishReason::Length),
        ("model_context_window_exceeded", FinishReason::Length),
        ("refusal", FinishReason::Refusal),
        ("something_new", FinishReason::Other("something_new".into())),
    ] {
        let server = Server::start(vec![sse(&response(vec![text_block(0, &["partial"])], wire, 5, 3))]).await;
        let model = client(&server).build().unwrap();
        let got = collect(&model, user_request("hi")).await;
        assert_eq!(got, vec![delta("partial"), text_part("partial"), finished(reason, tokens(5, 3))], "{wire}");
    }
}

#[tokio::test]
async fn a_non_streamed_message_is_accepted() {
    let message = json!({
        "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF", "type": "message", "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": SIGNATURE},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01D7", "name": "get_weather", "input": {"city": "Oslo"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 40, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 10, "output_tokens": 30}
    });
    let server =
        Server::start(vec![Reply::Status { status: 200, reason: "OK", headers: vec![], body: message.to_string() }])
            .await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("Weather in Oslo?")).await;
    assert_eq!(
        got,
        vec![
            reasoning("Look it up."),
            part(thinking("Look it up.", SIGNATURE)),
            delta("Let me check."),
            text_part("Let me check."),
            call_event("toolu_01D7", "get_weather", r#"{"city":"Oslo"}"#),
            finished(
                FinishReason::ToolCalls,
                Usage { input_tokens: 50, output_tokens: 30, cache_read_tokens: 10, ..Usage::default() }
            ),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Errors inside a 200 answer, and paused turns.

#[tokio::test(start_paused = true)]
async fn an_overloaded_error_event_before_any_output_is_asked_again() {
    let server = Server::start(vec![
        sse(&[message_start(12, 0, 0), ping(), error_event("overloaded_error", "Overloaded")]),
        sse(&response(vec![text_block(0, &["second try"])], "end_turn", 12, 3)),
    ])
    .await;
    let model = client(&server).retry_backoff(Duration::from_millis(50), Duration::from_millis(100)).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert_eq!(got, vec![delta("second try"), text_part("second try"), finished(FinishReason::Stop, tokens(12, 3))]);
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body, requests[1].body);
    assert!(requests[1].at - requests[0].at >= Duration::from_millis(25), "the retry waited its backoff");
}

#[tokio::test]
async fn an_error_event_after_output_is_final() {
    for (kind, message) in [("overloaded_error", "Overloaded"), ("api_error", "Internal server error")] {
        let mut events = vec![message_start(12, 0, 0)];
        events.push(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
        events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}}));
        events.push(error_event(kind, message));
        let server =
            Server::start(vec![sse(&events), sse(&response(vec![text_block(0, &["never"])], "end_turn", 1, 1))]).await;
        let model = client(&server).retry_backoff(Duration::from_millis(1), Duration::from_millis(2)).build().unwrap();
        let got = collect(&model, user_request("hi")).await;
        assert_eq!(got[0], delta("Hel"), "{kind}");
        match (&got[1..], kind) {
            ([Err(ModelError::Overloaded(m))], "overloaded_error") | ([Err(ModelError::Provider(m))], "api_error") => {
                assert!(m.contains(message) && m.contains(kind), "{m}");
            }
            (other, _) => panic!("{kind}: unexpected {other:?}"),
        }
        assert_eq!(server.requests().len(), 1, "{kind}: a started answer is never asked again");
    }
}

#[tokio::test(start_paused = true)]
async fn persistent_overloaded_events_fail_after_the_retry_budget() {
    let overloaded = || sse(&[message_start(12, 0, 0), error_event("overloaded_error", "Overloaded")]);
    let server = Server::start(vec![overloaded(), overloaded(), overloaded(), overloaded()]).await;
    let model = client(&server)
        .max_retries(2)
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(20))
        .build()
        .unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Overloaded(m))] if m.contains("Overloaded")), "{got:?}");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn a_paused_turn_is_continued_in_the_same_stream() {
    let first = {
        let mut events = vec![message_start(50, 0, 0)];
        events.extend(thinking_block(0, &["Search first."], SIGNATURE));
        events.extend(text_block(1, &["Let me search."]));
        events.push(json!({"type": "content_block_start", "index": 2, "content_block":
            {"type": "server_tool_use", "id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB", "name": "web_search", "input": {}}}));
        events.push(json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"query\": \"kuralle\"}"}}));
        events.push(block_stop(2));
        events.push(json!({"type": "content_block_start", "index": 3, "content_block":
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB",
             "content": [{"type": "web_search_result", "title": "kuralle", "url": "https://example.com", "encrypted_content": "Eo8BCioIAhgB"}]}}));
        events.push(block_stop(3));
        events.extend(message_end("pause_turn", 30));
        events
    };
    let second = response(vec![text_block(0, &[" Found it."])], "end_turn", 80, 20);
    let server = Server::start(vec![sse(&first), sse(&second)]).await;
    let model = client(&server).max_tokens(4096).thinking(2048).build().unwrap();
    let got = collect(&model, user_request("What is kuralle?")).await;
    assert_eq!(
        got,
        vec![
            reasoning("Search first."),
            part(thinking("Search first.", SIGNATURE)),
            delta("Let me search."),
            text_part("Let me search."),
            delta(" Found it."),
            text_part(" Found it."),
            finished(FinishReason::Stop, tokens(130, 50)),
        ]
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let mut expected = requests[0].body.clone();
    expected["messages"].as_array_mut().unwrap().push(json!({"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Search first.", "signature": SIGNATURE},
        {"type": "text", "text": "Let me search."},
        {"type": "server_tool_use", "id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB", "name": "web_search", "input": {"query": "kuralle"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_014hJH82Qum7Td6UV8gDXThB",
         "content": [{"type": "web_search_result", "title": "kuralle", "url": "https://example.com", "encrypted_content": "Eo8BCioIAhgB"}]}
    ]}));
    assert_eq!(requests[1].body, expected);
}

#[tokio::test]
async fn paused_turns_are_continued_a_bounded_number_of_times() {
    let paused = || sse(&response(vec![text_block(0, &["."])], "pause_turn", 10, 1));
    let server = Server::start((0..12).map(|_| paused()).collect()).await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("Search a lot.")).await;
    assert_eq!(got.last(), Some(&finished(FinishReason::Other("pause_turn".into()), tokens(90, 9))));
    assert_eq!(got.iter().filter(|e| **e == delta(".")).count(), 9);
    let requests = server.requests();
    assert_eq!(requests.len(), 9, "the first request and 8 continuations");
    let last = requests[8].body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["content"].as_array().unwrap().len(), 8);
}

// ---------------------------------------------------------------------------------------------
// The request body.

#[tokio::test]
async fn the_transcript_encoding() {
    let failed =
        json!({"error": true, "kind": "invalid_input", "message": "get_weather: arguments are not valid JSON"});
    let denied = json!({"__denied": true, "toolName": "get_weather", "deniedBy": "policy", "message": "declined"});
    let server = Server::start(vec![sse(&response(vec![text_block(0, &["ok"])], "end_turn", 1, 1))]).await;
    let model = client(&server).max_tokens(8192).thinking(2048).temperature(0.3).cache_control(true).build().unwrap();
    let request = ModelRequest {
        system: "You answer weather questions.".into(),
        messages: vec![
            Message::User { content: "Weather in Oslo and Rome?".into() },
            // Another provider's turn: its reasoning, signatures and ids stay behind.
            Message::Assistant {
                parts: vec![
                    Part::Reasoning {
                        text: "foreign thoughts".into(),
                        summary: vec!["a summary".into()],
                        signature: Some("foreign-signature".into()),
                        encrypted: Some("gAAAAB-encrypted".into()),
                        id: Some("rs_67ccd2bf".into()),
                    },
                    Part::Text { text: "Checking both.".into(), signature: None, id: Some("msg_67ccd3ac".into()) },
                    Part::ToolCall {
                        call: call("call_oslo", "get_weather", r#"{"city":"Oslo"}"#),
                        signature: None,
                        id: Some("fc_67ccd3".into()),
                    },
                    // Cut off by the output limit: not an object, so `{}` goes back.
                    Part::call(call("call_rome", "get_weather", r#"{"city": "Rome""#)),
                ],
                origin: Some(Origin::new("openai.responses", "o4-mini")),
            },
            Message::Tool { call_id: "call_oslo".into(), name: "get_weather".into(), content: json!({"temp_c": -3}) },
            Message::Tool { call_id: "call_rome".into(), name: "get_weather".into(), content: failed.clone() },
            Message::Assistant {
                parts: vec![thinking("Oslo answered; Rome failed.", "sig-b"), Part::text("Oslo -3°C; Rome unknown.")],
                origin: anthropic_origin(),
            },
            Message::User { content: "And Paris?".into() },
            Message::User { content: "Lyon too.".into() },
            Message::Assistant {
                parts: vec![
                    Part::RedactedReasoning { data: REDACTED.into() },
                    thinking("", "sig-only"),
                    Part::call(call("toolu_paris", "get_weather", r#"{"city":"Paris"}"#)),
                    Part::call(call("toolu_lyon", "get_weather", r#"{"city":"Lyon"}"#)),
                    Part::call(call("toolu_nice", "get_weather", r#"{"city":"Nice"}"#)),
                ],
                origin: anthropic_origin(),
            },
            Message::Tool { call_id: "toolu_paris".into(), name: "get_weather".into(), content: json!("sunny, 18°C") },
            Message::Tool { call_id: "toolu_lyon".into(), name: "get_weather".into(), content: denied.clone() },
            // No result for toolu_nice; the user's next words go after the results.
            Message::User { content: "Be brief.".into() },
            Message::assistant_text(""),
        ]
        .into(),
        tools: vec![
            spec("get_weather", "Current weather for a city.", json!({"city": {"type": "string"}})),
            spec("current_time", "", json!({})),
        ]
        .into(),
        output: None,
    };
    let got = collect(&model, request).await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    assert_eq!(
        server.requests()[0].body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 8192,
            "stream": true,
            "system": [{"type": "text", "text": "You answer weather questions.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo and Rome?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking both."},
                    {"type": "tool_use", "id": "call_oslo", "name": "get_weather", "input": {"city": "Oslo"}},
                    {"type": "tool_use", "id": "call_rome", "name": "get_weather", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_oslo", "content": "{\"temp_c\":-3}"},
                    {"type": "tool_result", "tool_use_id": "call_rome", "is_error": true,
                     "content": failed.to_string()}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Oslo answered; Rome failed.", "signature": "sig-b"},
                    {"type": "text", "text": "Oslo -3°C; Rome unknown."}
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "And Paris?"},
                    {"type": "text", "text": "Lyon too."}
                ]},
                {"role": "assistant", "content": [
                    {"type": "redacted_thinking", "data": REDACTED},
                    {"type": "thinking", "thinking": "", "signature": "sig-only"},
                    {"type": "tool_use", "id": "toolu_paris", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_lyon", "name": "get_weather", "input": {"city": "Lyon"}},
                    {"type": "tool_use", "id": "toolu_nice", "name": "get_weather", "input": {"city": "Nice"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_paris", "content": "sunny, 18°C"},
                    {"type": "tool_result", "tool_use_id": "toolu_lyon", "is_error": true,
                     "content": denied.to_string()},
                    {"type": "tool_result", "tool_use_id": "toolu_nice", "is_error": true,
                     "content": "No result was recorded for this call."},
                    {"type": "text", "text": "Be brief."}
                ]}
            ],
            "tools": [
                {"name": "get_weather", "description": "Current weather for a city.",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"name": "current_time", "input_schema": {"type": "object", "properties": {}},
                 "cache_control": {"type": "ephemeral"}}
            ],
            "thinking": {"type": "enabled", "budget_tokens": 2048}
        })
    );
}

#[tokio::test]
async fn the_thinking_mode_of_a_tool_turn_in_progress_is_kept() {
    let ok = || sse(&response(vec![text_block(0, &["ok"])], "end_turn", 1, 1));
    let server = Server::start(vec![ok(), ok(), ok()]).await;
    let tools: std::sync::Arc<[ToolSpec]> =
        vec![spec("get_weather", "Weather.", json!({"city": {"type": "string"}}))].into();
    let turn = |parts: Vec<Part>, origin: Option<Origin>| ModelRequest {
        system: "".into(),
        messages: vec![
            Message::User { content: "Weather in Oslo?".into() },
            Message::Assistant { parts, origin },
            Message::Tool { call_id: "toolu_1".into(), name: "get_weather".into(), content: json!({"temp_c": -3}) },
        ]
        .into(),
        tools: tools.clone(),
        output: None,
    };
    let oslo = || Part::call(call("toolu_1", "get_weather", r#"{"city":"Oslo"}"#));
    let thinking_model = client(&server).max_tokens(4096).thinking(2048).temperature(0.5).build().unwrap();

    // Another provider's turn cannot start with a thinking block: thinking is off for this
    // request (and the temperature, allowed again, is sent).
    let foreign = vec![
        Part::Reasoning { text: "hmm".into(), summary: vec![], signature: Some("s".into()), encrypted: None, id: None },
        Part::text("Checking."),
        oslo(),
    ];
    collect(&thinking_model, turn(foreign, Some(Origin::new("gemini", "gemini-2.5-pro")))).await;
    // This wire's own turn starts with its thinking: thinking stays on.
    collect(&thinking_model, turn(vec![thinking("Look it up.", SIGNATURE), oslo()], anthropic_origin())).await;
    // A model without thinking is not sent the thinking of the turn in progress.
    let plain = client(&server).build().unwrap();
    collect(&plain, turn(vec![thinking("Look it up.", SIGNATURE), oslo()], anthropic_origin())).await;

    let requests = server.requests();
    let assistant = |i: usize| requests[i].body["messages"][1]["content"].clone();
    let tool_use = json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}});
    assert_eq!(assistant(0), json!([{"type": "text", "text": "Checking."}, tool_use]));
    assert_eq!(requests[0].body.get("thinking"), None);
    assert_eq!(requests[0].body["temperature"], 0.5);
    assert_eq!(
        assistant(1),
        json!([{"type": "thinking", "thinking": "Look it up.", "signature": SIGNATURE}, tool_use])
    );
    assert_eq!(requests[1].body["thinking"], json!({"type": "enabled", "budget_tokens": 2048}));
    assert_eq!(requests[1].body.get("temperature"), None);
    assert_eq!(assistant(2), json!([tool_use]));
    assert_eq!(requests[2].body.get("thinking"), None);
    for r in &requests {
        assert_eq!(r.body.get("tool_choice"), None, "tool use is never forced");
    }
}

#[tokio::test]
async fn interleaved_thinking_sends_its_beta_header() {
    let server = Server::start(vec![sse(&response(vec![text_block(0, &["ok"])], "end_turn", 1, 1))]).await;
    let model = client(&server).max_tokens(4096).thinking(16_000).interleaved_thinking(true).build().unwrap();
    collect(&model, user_request("hi")).await;
    let r = &server.requests()[0];
    assert_eq!(r.header("anthropic-beta"), Some("interleaved-thinking-2025-05-14"));
    assert_eq!(r.body["thinking"], json!({"type": "enabled", "budget_tokens": 16_000}));
}

// ---------------------------------------------------------------------------------------------
// A whole agent run: the follow-up request carries the provider's state back exactly.

#[tokio::test]
async fn a_full_agent_run_sends_thinking_redacted_thinking_and_calls_back_exactly() {
    let server = Server::start(vec![
        sse(&response(
            vec![
                thinking_block(0, &["Weather for Paris, ", "then the time."], SIGNATURE),
                redacted_block(1, REDACTED),
                text_block(2, &["Checking the weather", " and the time."]),
                tool_block(3, "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", &["", "{\"city\":", " \"Paris\"}"]),
                tool_block(4, "toolu_01VTvM8zqB6kYj7qqXPvbbX8", "current_time", &[]),
            ],
            "tool_use",
            620,
            140,
        )),
        sse(&response(vec![text_block(0, &["Paris is 18°C", " at 14:05."])], "end_turn", 900, 15)),
    ])
    .await;
    let model = client(&server).max_tokens(8192).thinking(4096).build().unwrap();
    let weather =
        kuralle_tests::FnTool::new(
            "get_weather",
            |args, _| async move { Ok(json!({"city": args["city"], "temp_c": 18})) },
        );
    let time = kuralle_tests::FnTool::new("current_time", |_, _| async move { Ok(json!("14:05")) });
    let runtime = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("assistant", "Use the tools.").tool(weather).tool(time))
        .model(model)
        .build()
        .unwrap();
    let mut handle = runtime.run("Weather in Paris, and the time?");
    let mut thoughts = String::new();
    while let Some(event) = handle.next().await {
        if let kuralle::Event::ReasoningDelta { delta } = event {
            thoughts.push_str(&delta);
        }
    }
    let out = handle.await.unwrap();
    assert_eq!(out.text, "Paris is 18°C at 14:05.");
    assert_eq!(thoughts, "Weather for Paris, then the time.");
    assert_eq!(out.usage, tokens(1520, 155));

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
    assert_eq!(
        requests[1].body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris, and the time?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Weather for Paris, then the time.", "signature": SIGNATURE},
                {"type": "redacted_thinking", "data": REDACTED},
                {"type": "text", "text": "Checking the weather and the time."},
                {"type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_01VTvM8zqB6kYj7qqXPvbbX8", "name": "current_time", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "content": "{\"city\":\"Paris\",\"temp_c\":18}"},
                {"type": "tool_result", "tool_use_id": "toolu_01VTvM8zqB6kYj7qqXPvbbX8", "content": "14:05"}
            ]}
        ])
    );
    assert_eq!(requests[1].body["thinking"], json!({"type": "enabled", "budget_tokens": 4096}), "thinking stays on");
}

// ---------------------------------------------------------------------------------------------
// Hostile and failing servers.

fn error_body(kind: &str, message: &str) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"})
        .to_string()
}

#[tokio::test(start_paused = true)]
async fn rate_limited_then_success_honours_retry_after() {
    let server = Server::start(vec![
        Reply::Status {
            status: 429,
            reason: "Too Many Requests",
            headers: vec![("retry-after", "1"), ("anthropic-ratelimit-requests-remaining", "0")],
            body: error_body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
        },
        sse(&response(vec![text_block(0, &["after the wait"])], "end_turn", 5, 3)),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert_eq!(
        got,
        vec![delta("after the wait"), text_part("after the wait"), finished(FinishReason::Stop, tokens(5, 3))]
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "exactly one retry");
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(2), "waited {waited:?}");
}

#[tokio::test]
async fn persistent_429_is_rate_limited_without_a_second_round_of_retries() {
    let limited = || Reply::Status {
        status: 429,
        reason: "Too Many Requests",
        headers: vec![("retry-after", "0")],
        body: error_body("rate_limit_error", "Rate limited"),
    };
    let server = Server::start(vec![limited(), limited(), limited(), limited(), limited()]).await;
    let model = client(&server).max_retries(1).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&got[..], [Err(ModelError::RateLimited { attempts: 2, message })] if message.contains("Rate limited")),
        "{got:?}"
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn overloaded_529_then_success() {
    let server = Server::start(vec![
        Reply::Status {
            status: 529,
            reason: "Overloaded",
            headers: vec![],
            body: error_body("overloaded_error", "Overloaded"),
        },
        sse(&response(vec![text_block(0, &["ok"])], "end_turn", 5, 1)),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert_eq!(got.last(), Some(&finished(FinishReason::Stop, tokens(5, 1))));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn persistent_5xx_fails_after_the_retry_budget() {
    let failing = || Reply::Status {
        status: 500,
        reason: "Internal Server Error",
        headers: vec![],
        body: error_body("api_error", "Internal server error"),
    };
    let server = Server::start(vec![failing(), failing(), failing(), failing()]).await;
    let model = client(&server)
        .max_retries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(50))
        .build()
        .unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&got[..], [Err(ModelError::Http { status: 500, attempts: 3, message })] if message.contains("api_error")),
        "{got:?}"
    );
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn unauthorized_is_auth_without_retry() {
    let server = Server::start(vec![Reply::Status {
        status: 401,
        reason: "Unauthorized",
        headers: vec![],
        body: error_body("authentication_error", "invalid x-api-key"),
    }])
    .await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    match &got[..] {
        [Err(e @ ModelError::Auth { status: 401, message })] => {
            assert!(message.contains("invalid x-api-key"), "{message}");
            assert!(!e.to_string().contains("sk-ant-api03-test"), "the key is never in an error");
        }
        other => panic!("expected Auth, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.requests().len(), 1, "401 is never retried");
}

#[tokio::test]
async fn other_4xx_is_http_without_retry_and_a_long_prompt_is_typed() {
    let server = Server::start(vec![
        Reply::Status {
            status: 400,
            reason: "Bad Request",
            headers: vec![],
            body: error_body(
                "invalid_request_error",
                "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`.",
            ),
        },
        Reply::Status {
            status: 400,
            reason: "Bad Request",
            headers: vec![],
            body: error_body("invalid_request_error", "prompt is too long: 210849 tokens > 200000 maximum"),
        },
    ])
    .await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&got[..], [Err(ModelError::Http { status: 400, attempts: 1, message })] if message.contains("Expected `thinking`")),
        "{got:?}"
    );
    let got = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&got[..], [Err(ModelError::ContextWindowExceeded(m))] if m.contains("prompt is too long")),
        "{got:?}"
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn connection_cut_mid_stream_is_a_transport_error() {
    let mut events = vec![message_start(5, 0, 0)];
    events.push(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
    events
        .push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Once upon"}}));
    let server = Server::start(vec![Reply::Cut { body: body(&events) }]).await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("Tell a story")).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], delta("Once upon"));
    assert!(matches!(&got[1], Err(ModelError::Transport(_))), "{got:?}");
    assert_eq!(server.requests().len(), 1, "a started stream is never retried");
}

#[tokio::test]
async fn a_stream_without_message_stop_is_truncated() {
    let mut events = vec![message_start(5, 0, 0)];
    events.extend(text_block(0, &["Once upon"]));
    events.push(json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}));
    let server = Server::start(vec![Reply::Sse { body: body(&events), chunked: false, piece: 1000 }]).await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("Tell a story")).await;
    assert_eq!(got[..2], [delta("Once upon"), text_part("Once upon")]);
    assert!(matches!(&got[2..], [Err(ModelError::Protocol(m))] if m.contains("truncated")), "{got:?}");
}

#[tokio::test]
async fn malformed_event_json_is_a_protocol_error() {
    let body = format!(
        "{}event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":\n\n",
        frame(&message_start(5, 0, 0))
    );
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 16 }]).await;
    let model = client(&server).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Protocol(m))] if m.contains("invalid JSON")), "{got:?}");
}

#[tokio::test]
async fn garbage_is_a_protocol_error() {
    let server = Server::start(vec![
        Reply::Sse { body: "<html><body>502 Bad Gateway</body></html>\n".into(), chunked: false, piece: 8 },
        Reply::Status {
            status: 200,
            reason: "OK",
            headers: vec![],
            body: "{\"id\": \"msg_01\", \"content\": [".into(),
        },
        Reply::Status {
            status: 200,
            reason: "OK",
            headers: vec![],
            body: error_body("overloaded_error", "Overloaded"),
        },
    ])
    .await;
    let model = client(&server).max_retries(0).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Protocol(m))] if m.contains("truncated")), "{got:?}");
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Protocol(m))] if m.contains("invalid message JSON")), "{got:?}");
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Overloaded(_))]), "{got:?}");
}

/// Answers one request with `response`, written as is.
async fn raw_server(response: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
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
        socket.write_all(response.as_bytes()).await.unwrap();
        socket.shutdown().await.ok();
    });
    origin
}

#[tokio::test]
async fn a_wrong_content_type_is_a_protocol_error() {
    let origin = raw_server(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: 20\r\nconnection: close\r\n\r\n<html>portal</html>\n",
    )
    .await;
    let model = Anthropic::builder().base_url(origin).api_key("k").model("m").build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Protocol(m))] if m.contains("text/html")), "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn request_timeout_applies() {
    let server = Server::start(vec![Reply::Hang]).await;
    let model = client(&server).timeout(Duration::from_millis(300)).build().unwrap();
    let started = Instant::now();
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Transport(_))]), "{got:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_stream_that_stalls_ends_with_a_transport_error() {
    let mut events = vec![message_start(5, 0, 0)];
    events.push(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
    events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Once"}}));
    let server = Server::start(vec![Reply::StreamThenWait { body: body(&events) }]).await;
    let model = client(&server).timeout(Duration::from_millis(300)).build().unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert_eq!(got.first(), Some(&delta("Once")));
    assert!(matches!(got.last(), Some(Err(ModelError::Transport(_)))), "{got:?}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn connection_refused_is_a_transport_error_after_retries() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let model = Anthropic::builder()
        .base_url(origin)
        .api_key("k")
        .model("claude-sonnet-4-5")
        .max_retries(1)
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(10))
        .build()
        .unwrap();
    let got = collect(&model, user_request("hi")).await;
    assert!(matches!(&got[..], [Err(ModelError::Transport(_))]), "{got:?}");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let mut events = vec![message_start(5, 0, 0)];
    events.push(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}));
    events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "first"}}));
    let mut server = Server::start(vec![Reply::StreamThenWait { body: body(&events) }]).await;
    let model = client(&server).build().unwrap();
    let mut stream = model.stream(user_request("hi"));
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    assert_eq!(first, Some(delta("first")));
    drop(stream);
    let seen = tokio::time::timeout(Duration::from_secs(5), server.disconnects.recv()).await;
    assert_eq!(seen, Ok(Some(())), "the server saw the client go away");
}
