//! `kuralle::models::OpenAi` against a local HTTP/1.1 server (plain `TcpListener`) that records
//! every request and answers with scripted responses in OpenAI's wire format.

use std::time::Duration;

use futures::StreamExt;
use kuralle::{
    FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, Part, ToolCallRequest, ToolSpec, Usage,
    models::OpenAi,
};
use kuralle_tests::wire_server::{Reply, Server};
use serde_json::{Value, json};
// Tokio's clock: the timing tests run on a paused clock, so what they measure is the client's
// own waits, exactly, whatever the machine's load.
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// Wire-format helpers: chunk shapes as recorded from api.openai.com.

const CHATCMPL: &str = "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG";

fn chunk(delta: Value, finish_reason: Value) -> Value {
    json!({
        "id": CHATCMPL,
        "object": "chat.completion.chunk",
        "created": 1_741_570_283,
        "model": "gpt-4o-mini-2024-07-18",
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        "usage": null,
    })
}

fn role() -> Value {
    chunk(json!({"role": "assistant", "content": "", "refusal": null}), Value::Null)
}

fn text(t: &str) -> Value {
    chunk(json!({"content": t}), Value::Null)
}

fn finish(reason: &str) -> Value {
    chunk(json!({}), json!(reason))
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "id": CHATCMPL,
        "object": "chat.completion.chunk",
        "created": 1_741_570_283,
        "model": "gpt-4o-mini-2024-07-18",
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0, "audio_tokens": 0,
                "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0
            }
        }
    })
}

/// The first fragment of a tool call: index, id, type and name, empty arguments.
fn call_start(index: u64, id: &str, name: &str) -> Value {
    let delta = json!({
        "tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]
    });
    chunk(delta, Value::Null)
}

fn call_start_with_role(index: u64, id: &str, name: &str) -> Value {
    let mut c = call_start(index, id, name);
    let delta = &mut c["choices"][0]["delta"];
    delta["role"] = json!("assistant");
    delta["content"] = Value::Null;
    delta["refusal"] = Value::Null;
    c
}

fn call_args(index: u64, fragment: &str) -> Value {
    chunk(json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}), Value::Null)
}

/// `data: {...}\n\n` per chunk, then `data: [DONE]\n\n`.
fn sse_body(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn sse(chunks: &[Value]) -> Reply {
    Reply::Sse { body: sse_body(chunks), chunked: true, piece: 29 }
}

fn client(server: &Server) -> kuralle::models::OpenAiBuilder {
    OpenAi::builder().base_url(&server.base_url).api_key("sk-test-123").model("gpt-4o-mini")
}

fn user_request(text: &str) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![Message::User { content: text.into() }].into(),
        tools: Vec::new().into(),
        output: None,
    }
}

async fn collect(model: &OpenAi, request: ModelRequest) -> Vec<Result<ModelEvent, ModelError>> {
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

fn call(id: &str, name: &str, args: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::ToolCall(ToolCallRequest { call_id: id.into(), name: name.into(), arguments: args.into() }))
}

fn finished(reason: FinishReason, input: u64, output: u64) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Finish { reason, usage: Usage { input_tokens: input, output_tokens: output, ..Usage::default() } })
}

// ---------------------------------------------------------------------------------------------
// Cases.

#[tokio::test]
async fn text_only_with_usage_chunk() {
    let body = sse_body(&[role(), text("Hello"), text(", wörld"), text("!"), finish("stop"), usage(19, 4)]);
    let server = Server::start(vec![Reply::Sse { body, chunked: false, piece: 7 }]).await;
    let model = client(&server).build().unwrap();
    assert_eq!(model.name(), "gpt-4o-mini");

    let events = collect(&model, user_request("Say hello")).await;
    assert_eq!(events, vec![delta("Hello"), delta(", wörld"), delta("!"), finished(FinishReason::Stop, 19, 4)]);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(r.header("authorization"), Some("Bearer sk-test-123"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    assert_eq!(
        r.body,
        json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hello"}
            ],
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

#[tokio::test]
async fn one_tool_call_and_the_full_transcript_encoding() {
    let server = Server::start(vec![sse(&[
        call_start_with_role(0, "call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather"),
        call_args(0, "{\""),
        call_args(0, "city"),
        call_args(0, "\":\""),
        call_args(0, "Paris"),
        call_args(0, "\",\"units\":null}"),
        finish("tool_calls"),
        usage(82, 17),
    ])])
    .await;
    let model =
        client(&server).temperature(0.2).max_tokens(256).header("OpenAI-Organization", "org-kuralle").build().unwrap();

    let request = ModelRequest {
        system: "You answer weather questions.".into(),
        messages: vec![
            Message::User { content: "Weather in Oslo and Rome?".into() },
            Message::Assistant {
                parts: vec![
                    Part::text("Checking both."),
                    Part::call(ToolCallRequest {
                        call_id: "call_oslo".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Oslo","units":null}"#.into(),
                    }),
                    Part::call(ToolCallRequest {
                        call_id: "call_rome".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city": "Rome""#.into(),
                    }),
                ],
                origin: None,
            },
            Message::Tool { call_id: "call_oslo".into(), name: "get_weather".into(), content: json!({"temp_c": -3}) },
            Message::Tool { call_id: "call_rome".into(), name: "get_weather".into(), content: json!("sunny, 18°C") },
            Message::assistant_text("Oslo -3°C, Rome 18°C."),
            Message::User { content: "And Paris?".into() },
        ]
        .into(),
        tools: vec![weather_spec()].into(),
        output: None,
    };
    let events = collect(&model, request).await;
    assert_eq!(
        events,
        vec![
            call("call_DdmO9pD3xa9XTPNJ32zg2hcA", "get_weather", r#"{"city":"Paris","units":null}"#),
            finished(FinishReason::ToolCalls, 82, 17),
        ]
    );

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].header("openai-organization"), Some("org-kuralle"));
    assert_eq!(
        requests[0].body,
        json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You answer weather questions."},
                {"role": "user", "content": "Weather in Oslo and Rome?"},
                {
                    "role": "assistant",
                    "content": "Checking both.",
                    "tool_calls": [
                        {"id": "call_oslo", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"units\":null}"}},
                        {"id": "call_rome", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\""}}
                    ]
                },
                {"role": "tool", "tool_call_id": "call_oslo", "content": "{\"temp_c\":-3}"},
                {"role": "tool", "tool_call_id": "call_rome", "content": "sunny, 18°C"},
                {"role": "assistant", "content": "Oslo -3°C, Rome 18°C."},
                {"role": "user", "content": "And Paris?"}
            ],
            "tools": [{
                "type": "function",
                "function": {
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
                }
            }],
            "temperature": 0.2,
            "max_tokens": 256,
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

#[tokio::test]
async fn three_parallel_tool_calls_with_interleaved_fragments() {
    let server = Server::start(vec![sse(&[
        call_start_with_role(0, "call_a1", "get_weather"),
        call_start(1, "call_b2", "get_time"),
        call_args(0, "{\"city\""),
        call_args(1, "{\"tz\":"),
        call_start(2, "call_c3", "get_weather"),
        call_args(2, "{\"city\":\"Ro"),
        call_args(0, ":\"Oslo\"}"),
        call_args(1, "\"Europe/Rome\"}"),
        // Invalid JSON stays as the model sent it: that is the runtime's business.
        call_args(2, "me\""),
        finish("tool_calls"),
        usage(120, 66),
    ])])
    .await;
    let model = client(&server).build().unwrap();
    let mut request = user_request("Weather in Oslo and Rome, and the time in Rome?");
    request.tools = vec![weather_spec()].into();

    let events = collect(&model, request).await;
    assert_eq!(
        events,
        vec![
            call("call_a1", "get_weather", r#"{"city":"Oslo"}"#),
            call("call_b2", "get_time", r#"{"tz":"Europe/Rome"}"#),
            call("call_c3", "get_weather", r#"{"city":"Rome""#),
            finished(FinishReason::ToolCalls, 120, 66),
        ]
    );
}

#[tokio::test]
async fn every_finish_reason_without_a_usage_chunk() {
    for (wire, reason) in [
        ("stop", FinishReason::Stop),
        ("length", FinishReason::Length),
        ("content_filter", FinishReason::ContentFilter),
        ("weird_reason", FinishReason::Other("weird_reason".into())),
    ] {
        let server = Server::start(vec![sse(&[role(), text("partial"), finish(wire)])]).await;
        let model = client(&server).build().unwrap();
        let events = collect(&model, user_request("hi")).await;
        assert_eq!(events, vec![delta("partial"), finished(reason, 0, 0)], "{wire}");
    }
}

#[tokio::test]
async fn strict_tools_can_be_switched_off() {
    let server = Server::start(vec![sse(&[role(), text("ok"), finish("stop")])]).await;
    let model = client(&server).strict_tools(false).build().unwrap();
    let mut request = user_request("hi");
    request.tools = vec![weather_spec()].into();
    collect(&model, request).await;
    let tools = &server.requests()[0].body["tools"];
    assert_eq!(
        tools,
        &json!([{
            "type": "function",
            "function": {
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
            }
        }])
    );
}

#[tokio::test]
async fn error_object_mid_stream_is_a_provider_error() {
    let mut body: String = [role(), text("Hel")].iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str(
        "data: {\"error\":{\"message\":\"The server had an error while processing your request. Sorry about that!\",\
         \"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n",
    );
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 40 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], delta("Hel"));
    match &events[1] {
        Err(ModelError::Provider(message)) => {
            assert!(message.contains("The server had an error"), "{message}");
            assert!(message.contains("server_error"), "{message}");
        }
        other => panic!("expected a provider error, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn rate_limited_then_success_honours_retry_after() {
    let server = Server::start(vec![
        Reply::Status {
            status: 429,
            reason: "Too Many Requests",
            headers: vec![("retry-after", "1"), ("x-ratelimit-remaining-requests", "0")],
            body: json!({"error": {
                "message": "Rate limit reached for gpt-4o-mini in organization org-kuralle on requests per min (RPM): Limit 3, Used 3, Requested 1.",
                "type": "requests", "param": null, "code": "rate_limit_exceeded"
            }})
            .to_string(),
        },
        sse(&[role(), text("after the wait"), finish("stop"), usage(5, 3)]),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events, vec![delta("after the wait"), finished(FinishReason::Stop, 5, 3)]);

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "exactly one retry");
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_secs(1), "waited only {waited:?}");
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    assert_eq!(requests[0].body, requests[1].body);
}

#[tokio::test(start_paused = true)]
async fn persistent_5xx_fails_after_the_retry_budget() {
    let server_error = || {
        Reply::Status {
        status: 500,
        reason: "Internal Server Error",
        headers: vec![],
        body: json!({"error": {"message": "The server had an error processing your request.", "type": "server_error", "param": null, "code": null}}).to_string(),
    }
    };
    let server = Server::start(vec![server_error(), server_error(), server_error()]).await;
    let model = client(&server)
        .max_retries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(50))
        .build()
        .unwrap();
    let events = collect(&model, user_request("hi")).await;
    match &events[..] {
        [Err(ModelError::Http { status: 500, attempts: 3, message })] => {
            assert!(message.contains("The server had an error"), "{message}");
        }
        other => panic!("expected Http 500 after 3 attempts, got {other:?}"),
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    // Jittered backoff: each wait is between half and all of 20 ms, then 40 ms.
    assert!(requests[1].at - requests[0].at >= Duration::from_millis(10));
    assert!(requests[2].at - requests[1].at >= Duration::from_millis(20));
}

#[tokio::test]
async fn persistent_429_is_rate_limited() {
    let limited = || Reply::Status {
        status: 429,
        reason: "Too Many Requests",
        headers: vec![("retry-after-ms", "10")],
        body: json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})
            .to_string(),
    };
    let server = Server::start(vec![limited(), limited()]).await;
    let model = client(&server).max_retries(1).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::RateLimited { attempts: 2, message })] if message.contains("Rate limit reached")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn unauthorized_is_auth_without_retry() {
    let server = Server::start(vec![Reply::Status {
        status: 401,
        reason: "Unauthorized",
        headers: vec![],
        body: json!({"error": {
            "message": "Incorrect API key provided: sk-test-***123. You can find your API key at https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error", "param": null, "code": "invalid_api_key"
        }})
        .to_string(),
    }])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    match &events[..] {
        [Err(ModelError::Auth { status: 401, message })] => {
            assert!(message.contains("Incorrect API key"), "{message}");
        }
        other => panic!("expected Auth, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.requests().len(), 1, "401 is never retried");
}

#[tokio::test]
async fn other_4xx_is_http_without_retry() {
    let server = Server::start(vec![Reply::Status {
        status: 400,
        reason: "Bad Request",
        headers: vec![],
        body: json!({"error": {"message": "Invalid schema for function 'get_weather'.", "type": "invalid_request_error", "param": "tools[0].function.parameters", "code": "invalid_function_parameters"}}).to_string(),
    }])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Http { status: 400, attempts: 1, message })] if message.contains("Invalid schema")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn connection_cut_mid_stream_is_a_transport_error() {
    let body: String = [role(), text("Once upon")].iter().map(|c| format!("data: {c}\n\n")).collect();
    let server = Server::start(vec![Reply::Cut { body }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Tell a story")).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], delta("Once upon"));
    assert!(matches!(&events[1], Err(ModelError::Transport(_))), "{events:?}");
    assert_eq!(server.requests().len(), 1, "a started stream is never retried");
}

#[tokio::test]
async fn truncated_stream_is_a_protocol_error() {
    // Close-delimited, so the body ends cleanly, but without a finish_reason or [DONE].
    let body: String = [role(), text("Once upon")].iter().map(|c| format!("data: {c}\n\n")).collect();
    let server = Server::start(vec![Reply::Sse { body, chunked: false, piece: 1000 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Tell a story")).await;
    assert_eq!(events[0], delta("Once upon"));
    assert!(matches!(&events[1..], [Err(ModelError::Protocol(m))] if m.contains("truncated")), "{events:?}");
}

#[tokio::test]
async fn malformed_chunk_json_is_a_protocol_error() {
    let body =
        format!("data: {}\n\ndata: {{\"id\":\"chatcmpl-x\",\"choices\":[{{\"delta\":\n\ndata: [DONE]\n\n", role());
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 16 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Protocol(m))] if m.contains("invalid chunk")), "{events:?}");
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

#[tokio::test]
async fn connection_refused_is_a_transport_error_after_retries() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let model = OpenAi::builder()
        .base_url(base)
        .model("llama3.2")
        .max_retries(1)
        .retry_backoff(Duration::from_millis(10), Duration::from_millis(10))
        .build()
        .unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Transport(_))]), "{events:?}");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let body: String = [role(), text("first")].iter().map(|c| format!("data: {c}\n\n")).collect();
    let mut server = Server::start(vec![Reply::StreamThenWait { body }]).await;
    let model = client(&server).build().unwrap();
    let mut stream = model.stream(user_request("hi"));
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    assert_eq!(first, Some(delta("first")));
    drop(stream);
    let seen = tokio::time::timeout(Duration::from_secs(5), server.disconnects.recv()).await;
    assert_eq!(seen, Ok(Some(())), "the server saw the client go away");
}

#[tokio::test]
async fn local_server_without_api_key_sends_no_authorization() {
    let server = Server::start(vec![sse(&[role(), text("hi from llama"), finish("stop")])]).await;
    let model = OpenAi::builder().base_url(format!("{}/", server.base_url)).model("llama3.2").build().unwrap();
    assert_eq!(model.name(), "llama3.2");
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events, vec![delta("hi from llama"), finished(FinishReason::Stop, 0, 0)]);
    let requests = server.requests();
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].header("authorization"), None);
    assert_eq!(requests[0].body["model"], "llama3.2");
}

#[tokio::test]
async fn schema_strict_mode_cannot_express_is_an_invalid_request() {
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

#[tokio::test]
async fn a_non_streamed_json_completion_is_accepted() {
    let completion = json!({
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion",
        "created": 1_741_569_952,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {"id": "call_x1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
                    {"id": "call_x2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}
                ],
                "refusal": null,
                "annotations": []
            },
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70},
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306"
    });
    let server =
        Server::start(vec![Reply::Status { status: 200, reason: "OK", headers: vec![], body: completion.to_string() }])
            .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Weather in Oslo and Rome?")).await;
    assert_eq!(
        events,
        vec![
            delta("Let me check."),
            call("call_x1", "get_weather", r#"{"city":"Oslo"}"#),
            call("call_x2", "get_weather", r#"{"city":"Rome"}"#),
            finished(FinishReason::ToolCalls, 40, 30),
        ]
    );
}

#[tokio::test]
async fn a_full_agent_run_through_the_runtime_with_a_tool_round_trip() {
    let server = Server::start(vec![
        sse(&[
            call_start_with_role(0, "call_echo_1", "echo"),
            call_args(0, "{\"text\":"),
            call_args(0, "\"hello world\"}"),
            finish("tool_calls"),
            usage(40, 9),
        ]),
        sse(&[role(), text("The tool said: "), text("hello world."), finish("stop"), usage(60, 7)]),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let echo = kuralle_tests::FnTool::new("echo", |args, _| async move { Ok(json!({"echoed": args["text"]})) });
    let runtime = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("support", "Use the echo tool when asked.").tool(echo))
        .model(model)
        .build()
        .unwrap();
    let mut handle = runtime.run("Echo \"hello world\"");
    let mut deltas = String::new();
    let mut tool_results = Vec::new();
    while let Some(event) = handle.next().await {
        match event {
            kuralle::Event::TextDelta { delta } => deltas.push_str(&delta),
            kuralle::Event::ToolResult { result, .. } => tool_results.push(result),
            _ => {}
        }
    }
    let out = handle.await.unwrap();
    assert_eq!(out.text, "The tool said: hello world.");
    assert_eq!(deltas, out.text);
    assert_eq!(out.usage, Usage { input_tokens: 100, output_tokens: 16, ..Usage::default() });
    assert_eq!(tool_results, [json!({"echoed": "hello world"})]);

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["tools"][0]["function"]["name"], "echo");
    assert_eq!(
        requests[1].body["messages"],
        json!([
            {"role": "system", "content": "Use the echo tool when asked."},
            {"role": "user", "content": "Echo \"hello world\""},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_echo_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":\"hello world\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_echo_1", "content": "{\"echoed\":\"hello world\"}"}
        ])
    );
}
