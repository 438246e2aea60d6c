//! `kuralle::models::Gemini` against a local HTTP/1.1 server (plain `TcpListener`) that records
//! every request and answers with scripted responses in the Gemini API's wire format
//! (`streamGenerateContent?alt=sse` frames ending in `\r\n\r\n`, `generateContent` JSON,
//! `{"error": {code, message, status}}` bodies).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use kuralle::{
    FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, Origin, Part, ToolCallRequest, ToolSpec, Usage,
    models::{Gemini, GeminiBuilder},
};
use kuralle_tests::wire_server::{Reply, Server};
use serde_json::{Value, json};
// Tokio's clock: the timing tests run on a paused clock, so what they measure is the client's
// own waits, exactly, whatever the machine's load.
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// Wire-format helpers: chunk shapes as the Gemini API streams them.

const MODEL: &str = "gemini-2.5-flash";
const KEY: &str = "AIzaSyD-test-9f8e7d6c5b4a";

/// One streamed `GenerateContentResponse` with `parts` of candidate 0.
fn chunk(parts: Value) -> Value {
    json!({
        "candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0}],
        "modelVersion": MODEL,
        "responseId": "yTsuaK2mDoK1nvgPo7KbyQ4",
    })
}

fn text(t: &str) -> Value {
    chunk(json!([{"text": t}]))
}

fn thought(t: &str) -> Value {
    chunk(json!([{"text": t, "thought": true}]))
}

/// Adds `finishReason` to a chunk.
fn finishing(mut c: Value, reason: &str) -> Value {
    c["candidates"][0]["finishReason"] = json!(reason);
    c
}

fn usage_block(prompt: u64, candidates: u64, thoughts: u64, cached: u64) -> Value {
    let mut u = json!({
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    });
    if thoughts > 0 {
        u["thoughtsTokenCount"] = json!(thoughts);
    }
    if cached > 0 {
        u["cachedContentTokenCount"] = json!(cached);
        u["cacheTokensDetails"] = json!([{"modality": "TEXT", "tokenCount": cached}]);
    }
    u
}

/// Adds `usageMetadata` to a chunk.
fn with_usage(mut c: Value, prompt: u64, candidates: u64, thoughts: u64, cached: u64) -> Value {
    c["usageMetadata"] = usage_block(prompt, candidates, thoughts, cached);
    c
}

/// A chunk with only usage (Gemini can send the finish before the last usage).
fn usage_only(prompt: u64, candidates: u64, thoughts: u64) -> Value {
    json!({"usageMetadata": usage_block(prompt, candidates, thoughts, 0), "modelVersion": MODEL, "responseId": "yTsuaK2mDoK1nvgPo7KbyQ4"})
}

fn call(name: &str, args: Value) -> Value {
    json!({"functionCall": {"name": name, "args": args}})
}

fn signed(mut part: Value, signature: &str) -> Value {
    part["thoughtSignature"] = json!(signature);
    part
}

/// `data: {...}\r\n\r\n` per chunk: the API ends its frames with CRLF pairs.
fn sse_body(chunks: &[Value]) -> String {
    chunks.iter().map(|c| format!("data: {c}\r\n\r\n")).collect()
}

fn sse(chunks: &[Value]) -> Reply {
    Reply::Sse { body: sse_body(chunks), chunked: true, piece: 23 }
}

fn json_reply(body: &Value) -> Reply {
    Reply::Status { status: 200, reason: "OK", headers: vec![], body: body.to_string() }
}

fn error_reply(status: u16, reason: &'static str, code_status: &str, message: &str) -> Reply {
    Reply::Status {
        status,
        reason,
        headers: vec![],
        body: json!({"error": {"code": status, "message": message, "status": code_status}}).to_string(),
    }
}

fn client(server: &Server) -> GeminiBuilder {
    Gemini::builder().base_url(&server.origin).api_key(KEY).model(MODEL)
}

fn user_request(text: &str) -> ModelRequest {
    ModelRequest {
        system: "You are terse.".into(),
        messages: vec![Message::User { content: text.into() }].into(),
        tools: Vec::new().into(),
        output: None,
    }
}

async fn collect(model: &Gemini, request: ModelRequest) -> Vec<Result<ModelEvent, ModelError>> {
    tokio::time::timeout(Duration::from_secs(20), model.stream(request).collect())
        .await
        .expect("the model stream must end")
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

fn finished(reason: FinishReason, usage: Usage) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Finish { reason, usage })
}

fn tokens(input: u64, output: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, ..Usage::default() }
}

fn reasoning_part(text: &str, signature: Option<&str>) -> Part {
    Part::Reasoning {
        text: text.into(),
        summary: vec![],
        signature: signature.map(Into::into),
        encrypted: None,
        id: None,
    }
}

fn calls_of(events: &[Result<ModelEvent, ModelError>]) -> Vec<(ToolCallRequest, Option<String>, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(ModelEvent::ToolCall(call)) => Some((call.clone(), None, None)),
            Ok(ModelEvent::Part { part: Part::ToolCall { call, signature, id } }) => {
                Some((call.clone(), signature.clone(), id.clone()))
            }
            _ => None,
        })
        .collect()
}

fn lookup_spec() -> ToolSpec {
    ToolSpec {
        name: "lookup".into(),
        description: "Looks an order up.".into(),
        input_schema: json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "order": {"type": "string", "description": "Order number"},
                "fields": {"type": ["array", "null"], "items": {"type": "string"}},
                "priority": {"type": "integer", "format": "uint8", "default": 0}
            },
            "required": ["order"]
        }),
        output_schema: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing.

#[tokio::test]
async fn text_stream_with_usage_and_the_request_shape() {
    let body = sse_body(&[
        with_usage(text("Hello"), 9, 1, 0, 0),
        with_usage(text(", wörld"), 9, 3, 0, 0),
        with_usage(finishing(text("!"), "STOP"), 9, 4, 0, 0),
    ]);
    let server = Server::start(vec![Reply::Sse { body, chunked: false, piece: 7 }]).await;
    let model =
        client(&server).max_output_tokens(256).temperature(0.3).header("x-goog-user-project", "p-1").build().unwrap();
    assert_eq!((model.name(), model.provider()), (MODEL, "gemini"));

    let events = collect(&model, user_request("Say hello")).await;
    assert_eq!(events, vec![delta("Hello"), delta(", wörld"), delta("!"), finished(FinishReason::Stop, tokens(9, 4))]);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    );
    assert_eq!(r.header("x-goog-api-key"), Some(KEY));
    assert!(!r.path.contains(KEY), "the key is never in the URL");
    assert_eq!(r.header("authorization"), None);
    assert_eq!(r.header("x-goog-user-project"), Some("p-1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    assert_eq!(
        r.body,
        json!({
            "systemInstruction": {"parts": [{"text": "You are terse."}]},
            "contents": [{"role": "user", "parts": [{"text": "Say hello"}]}],
            "generationConfig": {"maxOutputTokens": 256, "temperature": 0.3}
        })
    );
}

#[tokio::test]
async fn thoughts_and_a_signed_text_part_split_across_chunks() {
    let server = Server::start(vec![sse(&[
        thought("**Greeting the user**\n\nA short "),
        thought("answer will do."),
        text("Hi "),
        text("there"),
        // The signature of the text part arrives on its last piece, with empty text.
        with_usage(
            finishing(chunk(json!([{"text": "", "thoughtSignature": "CiQBVKhc7pZ3Qm9uZXk="}])), "STOP"),
            12,
            2,
            40,
            8,
        ),
    ])])
    .await;
    let model = client(&server).thinking_budget(1024).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(
        events,
        vec![
            reasoning("**Greeting the user**\n\nA short "),
            reasoning("answer will do."),
            part(reasoning_part("**Greeting the user**\n\nA short answer will do.", None)),
            delta("Hi "),
            delta("there"),
            part(Part::Text { text: "Hi there".into(), signature: Some("CiQBVKhc7pZ3Qm9uZXk=".into()), id: None }),
            finished(
                FinishReason::Stop,
                // Output is candidates plus thoughts; input includes the cached tokens.
                Usage {
                    input_tokens: 12,
                    output_tokens: 42,
                    cache_read_tokens: 8,
                    cache_write_tokens: 0,
                    reasoning_tokens: 40
                }
            ),
        ]
    );
    assert_eq!(
        server.requests()[0].body["generationConfig"],
        json!({"thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": true}})
    );
}

#[tokio::test]
async fn a_zero_thinking_budget_asks_for_no_thoughts() {
    let server = Server::start(vec![sse(&[finishing(text("ok"), "STOP")])]).await;
    let model = client(&server).thinking_budget(0).build().unwrap();
    collect(&model, user_request("hi")).await;
    assert_eq!(server.requests()[0].body["generationConfig"], json!({"thinkingConfig": {"thinkingBudget": 0}}));
}

#[tokio::test]
async fn parallel_calls_arrive_whole_without_ids_and_stop_means_tool_calls() {
    let calls = || {
        sse(&[
            thought("Two lookups."),
            chunk(json!([
                signed(call("lookup", json!({"order": "A-1"})), "EpUCAQ3+sig/first=="),
                call("lookup", json!({"order": "B-2", "fields": ["status", "eta"]}))
            ])),
            // The finish arrives before the last usage.
            finishing(chunk(json!([])), "STOP"),
            usage_only(80, 24, 31),
        ])
    };
    let server = Server::start(vec![calls(), calls()]).await;
    let model = client(&server).thinking_level("low").build().unwrap();
    let mut request = user_request("Where are A-1 and B-2?");
    request.tools = vec![lookup_spec()].into();
    let events = collect(&model, request.clone()).await;

    let got = calls_of(&events);
    assert_eq!(got.len(), 2);
    let (first, first_signature, first_id) = &got[0];
    let (second, second_signature, second_id) = &got[1];
    assert_eq!((first.name.as_str(), first.arguments.as_str()), ("lookup", r#"{"order":"A-1"}"#));
    assert_eq!(second.arguments, r#"{"order":"B-2","fields":["status","eta"]}"#);
    // Only the first call of the batch carries the signature; it is never copied.
    assert_eq!(first_signature.as_deref(), Some("EpUCAQ3+sig/first=="));
    assert_eq!(*second_signature, None);
    // Gemini gave no ids: the client's own, derived from the response, distinct.
    assert_eq!((first_id, second_id), (&None, &None));
    assert!(first.call_id.starts_with("gemini-call-0-"), "{}", first.call_id);
    assert!(second.call_id.starts_with("gemini-call-1-"), "{}", second.call_id);
    assert!(matches!(events[2], Ok(ModelEvent::Part { part: Part::ToolCall { .. } })), "{events:?}");
    assert!(matches!(events[3], Ok(ModelEvent::ToolCall(_))), "{events:?}");
    assert_eq!(
        events.last().unwrap(),
        &finished(
            FinishReason::ToolCalls,
            Usage { input_tokens: 80, output_tokens: 55, reasoning_tokens: 31, ..Usage::default() }
        )
    );

    // The same response parsed again gives the same ids.
    let again = collect(&model, request).await;
    let again: Vec<String> = calls_of(&again).into_iter().map(|(c, _, _)| c.call_id.into()).collect();
    assert_eq!(again, [first.call_id.clone(), second.call_id.clone()]);

    let body = &server.requests()[0].body;
    assert_eq!(body["generationConfig"], json!({"thinkingConfig": {"thinkingLevel": "low", "includeThoughts": true}}));
    assert_eq!(
        body["tools"],
        json!([{"functionDeclarations": [{
            "name": "lookup",
            "description": "Looks an order up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order": {"type": "string", "description": "Order number"},
                    "fields": {"type": "array", "items": {"type": "string"}, "nullable": true},
                    "priority": {"type": "integer"}
                },
                "required": ["order"]
            }
        }]}])
    );
}

#[tokio::test]
async fn a_call_with_an_id_keeps_it() {
    let server = Server::start(vec![sse(&[finishing(
        chunk(
            json!([{"functionCall": {"id": "fc_7x2k", "name": "now", "args": {}}}, {"functionCall": {"name": "now"}}]),
        ),
        "STOP",
    )])])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("time?")).await;
    let got = calls_of(&events);
    assert_eq!(got[0].0.call_id, "fc_7x2k");
    assert_eq!(got[0].2.as_deref(), Some("fc_7x2k"), "Gemini's id is kept on the part, to go back");
    assert_eq!(got[0].0.arguments, "{}");
    // A call without `args` has none.
    assert_eq!((got[1].0.arguments.as_str(), got[1].2.as_deref()), ("{}", None));
    assert_eq!(events.last().unwrap(), &finished(FinishReason::ToolCalls, Usage::default()));
}

#[tokio::test]
async fn a_signature_only_part_after_the_calls_is_kept_in_place() {
    let server = Server::start(vec![sse(&[
        chunk(json!([call("now", json!({}))])),
        finishing(chunk(json!([{"text": "", "thoughtSignature": "Ck0BsigAfterCalls"}])), "STOP"),
    ])])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("time?")).await;
    assert!(matches!(&events[0], Ok(ModelEvent::ToolCall(c)) if c.name == "now"), "{events:?}");
    assert_eq!(events[1], part(reasoning_part("", Some("Ck0BsigAfterCalls"))));
    assert_eq!(events[2], finished(FinishReason::ToolCalls, Usage::default()));
}

#[tokio::test]
async fn finish_reasons() {
    for (wire, reason) in [
        ("STOP", FinishReason::Stop),
        ("MAX_TOKENS", FinishReason::Length),
        ("SAFETY", FinishReason::ContentFilter),
        ("RECITATION", FinishReason::ContentFilter),
        ("PROHIBITED_CONTENT", FinishReason::ContentFilter),
        ("BLOCKLIST", FinishReason::ContentFilter),
        ("SPII", FinishReason::ContentFilter),
        ("LANGUAGE", FinishReason::Other("LANGUAGE".into())),
        ("OTHER", FinishReason::Other("OTHER".into())),
    ] {
        let server = Server::start(vec![sse(&[text("partial"), finishing(chunk(json!([])), wire)])]).await;
        let model = client(&server).build().unwrap();
        let events = collect(&model, user_request("hi")).await;
        assert_eq!(events, vec![delta("partial"), finished(reason, Usage::default())], "{wire}");
    }
}

#[tokio::test]
async fn failed_function_calls_are_provider_errors() {
    for wire in ["MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"] {
        let mut end = finishing(chunk(json!([])), wire);
        end["candidates"][0]["finishMessage"] = json!("Malformed function call: print(default_api.lookup(order=A-1))");
        let server = Server::start(vec![sse(&[end, usage_only(30, 0, 0)])]).await;
        let model = client(&server).build().unwrap();
        let events = collect(&model, user_request("hi")).await;
        match &events[..] {
            [Err(ModelError::Provider(m))] => {
                assert!(m.contains(wire), "{m}");
                assert!(m.contains("default_api.lookup"), "{m}");
            }
            other => panic!("{wire}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_blocked_prompt_is_a_content_filter_finish() {
    let blocked = json!({
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {"promptTokenCount": 17, "totalTokenCount": 17},
        "modelVersion": MODEL,
        "responseId": "b1Ock5"
    });
    let server = Server::start(vec![sse(&[blocked])]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("something prohibited")).await;
    assert_eq!(events, vec![finished(FinishReason::ContentFilter, tokens(17, 0))]);
}

#[tokio::test]
async fn a_non_streamed_answer_with_streaming_off() {
    let answer = json!({
        "candidates": [{
            "content": {"role": "model", "parts": [
                {"text": "Checking the order.", "thought": true},
                {"text": "Let me check.", "thoughtSignature": "Cs0BsigText"},
                signed(call("lookup", json!({"order": "A-1"})), "Cs0BsigCall"),
                call("lookup", json!({"order": "B-2"}))
            ]},
            "finishReason": "STOP",
            "index": 0
        }],
        "usageMetadata": usage_block(40, 30, 12, 0),
        "modelVersion": MODEL,
        "responseId": "n0nStr3am"
    });
    let server = Server::start(vec![json_reply(&answer)]).await;
    let model = client(&server).streaming(false).build().unwrap();
    let events = collect(&model, user_request("Where are A-1 and B-2?")).await;
    let requests = server.requests();
    assert_eq!(requests[0].path, "/v1beta/models/gemini-2.5-flash:generateContent");
    assert_eq!(requests[0].header("accept"), Some("application/json"));
    assert_eq!(events.len(), 7, "{events:?}");
    assert_eq!(events[0], reasoning("Checking the order."));
    assert_eq!(events[1], part(reasoning_part("Checking the order.", None)));
    assert_eq!(events[2], delta("Let me check."));
    assert_eq!(
        events[3],
        part(Part::Text { text: "Let me check.".into(), signature: Some("Cs0BsigText".into()), id: None })
    );
    let got = calls_of(&events);
    assert_eq!(got[0].1.as_deref(), Some("Cs0BsigCall"));
    assert_eq!(got[1].1, None);
    assert_eq!(
        events[6],
        finished(
            FinishReason::ToolCalls,
            Usage { input_tokens: 40, output_tokens: 42, reasoning_tokens: 12, ..Usage::default() }
        )
    );
}

#[tokio::test]
async fn a_stream_answered_as_one_json_array_is_accepted() {
    let array = json!([text("Hel"), finishing(with_usage(text("lo"), 5, 2, 0, 0), "STOP")]);
    let server = Server::start(vec![json_reply(&array)]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events, vec![delta("Hel"), delta("lo"), finished(FinishReason::Stop, tokens(5, 2))]);
}

// ---------------------------------------------------------------------------------------------
// The follow-up request: what the runtime makes of a response goes back exactly.

fn first_reply() -> Reply {
    sse(&[
        thought("The user wants two orders; "),
        thought("look both up."),
        chunk(json!([{"text": "", "thoughtSignature": "CiQBsigOnlyThought=="}])),
        text("Let me look "),
        text("both up."),
        chunk(json!([{"text": "", "thoughtSignature": "CiQBsigText+/=="}])),
        chunk(json!([
            signed(call("lookup", json!({"order": "A-1"})), "CiQBsigFirstCall=="),
            call("lookup", json!({"order": "B-2"}))
        ])),
        finishing(chunk(json!([])), "STOP"),
        usage_only(120, 40, 64),
    ])
}

fn second_reply() -> Reply {
    sse(&[finishing(with_usage(text("A-1 shipped; B-2 is pending."), 260, 9, 0, 0), "STOP")])
}

/// Runs an agent with a `lookup` tool through the runtime against `server`; returns the run's
/// text and the call ids the tool saw, in call order.
async fn run_agent(server: &Server) -> (kuralle::RunOutput, Vec<String>, Vec<String>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let saw = Arc::clone(&seen);
    let lookup = kuralle_tests::FnTool::new("lookup", move |args, ctx| {
        let saw = Arc::clone(&saw);
        async move {
            saw.lock().unwrap().push((args["order"].as_str().unwrap_or("").to_owned(), ctx.call_id().to_owned()));
            Ok(if args["order"] == "A-1" { json!({"order": "A-1", "status": "shipped"}) } else { json!("pending") })
        }
    })
    .parallel();
    let runtime = kuralle::Runtime::builder()
        .agent(kuralle::AgentDef::new("orders", "Look orders up.").tool(lookup))
        .model(client(server).thinking_budget(-1).build().unwrap())
        .build()
        .unwrap();
    let mut handle = runtime.run("Where are orders A-1 and B-2?");
    let mut event_ids = Vec::new();
    while let Some(event) = handle.next().await {
        if let kuralle::Event::ToolCall { call_id, .. } = event {
            event_ids.push(call_id.to_string());
        }
    }
    let out = handle.await.unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    (out, seen.into_iter().map(|(_, id)| id).collect(), event_ids)
}

#[tokio::test]
async fn the_follow_up_carries_every_part_back_and_one_content_of_results() {
    let server = Server::start(vec![first_reply(), second_reply()]).await;
    let (out, tool_ids, event_ids) = run_agent(&server).await;
    assert_eq!(out.text, "A-1 shipped; B-2 is pending.");
    assert_eq!(out.usage, Usage { input_tokens: 380, output_tokens: 113, reasoning_tokens: 64, ..Usage::default() });

    // The ids the tools and the run's events saw: the client's derived ones, the same when
    // the same response is parsed again (here, by a direct request with the same transcript).
    assert_eq!(tool_ids.len(), 2);
    assert_eq!(event_ids, tool_ids);
    assert!(tool_ids[0].starts_with("gemini-call-0-") && tool_ids[1].starts_with("gemini-call-1-"), "{tool_ids:?}");
    let again = Server::start(vec![first_reply()]).await;
    let mut request = user_request("Where are orders A-1 and B-2?");
    request.tools = vec![lookup_spec()].into();
    let direct: Vec<String> = calls_of(&collect(&client(&again).build().unwrap(), request).await)
        .into_iter()
        .map(|(c, _, _)| c.call_id.into())
        .collect();
    assert_eq!(direct, tool_ids);
    // And a second run of the whole agent sees the same ids.
    let replay = Server::start(vec![first_reply(), second_reply()]).await;
    assert_eq!(run_agent(&replay).await.1, tool_ids);

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].body["contents"],
        json!([{"role": "user", "parts": [{"text": "Where are orders A-1 and B-2?"}]}])
    );
    assert_eq!(
        requests[1].body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Where are orders A-1 and B-2?"}]},
            {"role": "model", "parts": [
                {"text": "The user wants two orders; look both up.", "thought": true},
                {"text": "", "thoughtSignature": "CiQBsigOnlyThought=="},
                {"text": "Let me look both up.", "thoughtSignature": "CiQBsigText+/=="},
                {"functionCall": {"name": "lookup", "args": {"order": "A-1"}}, "thoughtSignature": "CiQBsigFirstCall=="},
                {"functionCall": {"name": "lookup", "args": {"order": "B-2"}}}
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "lookup", "response": {"order": "A-1", "status": "shipped"}}},
                {"functionResponse": {"name": "lookup", "response": {"result": "pending"}}}
            ]}
        ])
    );
    assert_eq!(requests[1].body["systemInstruction"], json!({"parts": [{"text": "Look orders up."}]}));
}

#[tokio::test]
async fn gemini_ids_go_back_only_where_gemini_gave_them() {
    let server = Server::start(vec![sse(&[finishing(text("ok"), "STOP")])]).await;
    let model = client(&server).build().unwrap();
    let call = |id: &str, order: &str| ToolCallRequest {
        call_id: id.into(),
        name: "lookup".into(),
        arguments: format!(r#"{{"order":"{order}"}}"#),
    };
    let request = ModelRequest {
        system: "".into(),
        messages: vec![
            Message::User { content: "A-1 and B-2?".into() },
            Message::Assistant {
                parts: vec![
                    Part::ToolCall {
                        call: call("fc_a1", "A-1"),
                        signature: Some("sigA".into()),
                        id: Some("fc_a1".into()),
                    },
                    Part::call(call("gemini-call-1-0a1b2c3d4e5f", "B-2")),
                ],
                origin: Some(Origin::new("gemini", MODEL)),
            },
            Message::Tool { call_id: "fc_a1".into(), name: "lookup".into(), content: json!(["shipped"]) },
            Message::Tool { call_id: "gemini-call-1-0a1b2c3d4e5f".into(), name: "lookup".into(), content: json!(null) },
        ]
        .into(),
        tools: vec![lookup_spec()].into(),
        output: None,
    };
    collect(&model, request).await;
    assert_eq!(
        server.requests()[0].body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "A-1 and B-2?"}]},
            {"role": "model", "parts": [
                {"functionCall": {"id": "fc_a1", "name": "lookup", "args": {"order": "A-1"}}, "thoughtSignature": "sigA"},
                {"functionCall": {"name": "lookup", "args": {"order": "B-2"}}}
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"id": "fc_a1", "name": "lookup", "response": {"result": ["shipped"]}}},
                {"functionResponse": {"name": "lookup", "response": {"result": null}}}
            ]}
        ])
    );
}

#[tokio::test]
async fn another_providers_turn_sends_no_foreign_state() {
    let server = Server::start(vec![sse(&[finishing(text("ok"), "STOP")])]).await;
    let model = client(&server).build().unwrap();
    let request = ModelRequest {
        system: "".into(),
        messages: vec![
            Message::User { content: "Weather in Oslo and Rome?".into() },
            Message::Assistant {
                parts: vec![
                    reasoning_part("Two cities.", Some("EqQBCkYIARgCIkAnthropicSig")),
                    Part::RedactedReasoning { data: "EmwKAhgBEgy3redacted".into() },
                    Part::Text {
                        text: "Checking both.".into(),
                        signature: Some("foreign-sig".into()),
                        id: Some("msg_01".into()),
                    },
                    Part::ToolCall {
                        call: ToolCallRequest {
                            call_id: "toolu_01A".into(),
                            name: "weather".into(),
                            arguments: r#"{"city":"Oslo"}"#.into(),
                        },
                        signature: Some("foreign-call-sig".into()),
                        id: Some("fc_foreign".into()),
                    },
                    Part::call(ToolCallRequest {
                        call_id: "toolu_01B".into(),
                        name: "weather".into(),
                        arguments: r#"{"city": "Ro"#.into(),
                    }),
                ],
                origin: Some(Origin::new("anthropic", "claude-sonnet-4-5")),
            },
            Message::Tool { call_id: "toolu_01A".into(), name: "weather".into(), content: json!({"temp_c": -3}) },
            Message::Tool { call_id: "toolu_01B".into(), name: "weather".into(), content: json!("sunny, 18°C") },
            Message::assistant_text("Oslo -3°C, Rome 18°C."),
            Message::User { content: "And Paris?".into() },
        ]
        .into(),
        tools: Vec::new().into(),
        output: None,
    };
    collect(&model, request).await;
    assert_eq!(
        server.requests()[0].body["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Weather in Oslo and Rome?"}]},
            {"role": "model", "parts": [
                {"text": "Checking both."},
                // Gemini 3 wants a signature on a call of the current turn; Google documents this
                // value for calls it did not produce. The first call of the turn only.
                {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}, "thoughtSignature": "skip_thought_signature_validator"},
                {"functionCall": {"name": "weather", "args": {"arguments": "{\"city\": \"Ro"}}}
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "weather", "response": {"temp_c": -3}}},
                {"functionResponse": {"name": "weather", "response": {"result": "sunny, 18°C"}}}
            ]},
            {"role": "model", "parts": [{"text": "Oslo -3°C, Rome 18°C."}]},
            {"role": "user", "parts": [{"text": "And Paris?"}]}
        ])
    );
}

#[tokio::test]
async fn a_recursive_tool_schema_is_an_invalid_request() {
    let server = Server::start(vec![]).await;
    let model = client(&server).build().unwrap();
    let mut request = user_request("hi");
    let mut spec = lookup_spec();
    spec.input_schema["properties"]["parent"] = json!({"$ref": "#"});
    request.tools = vec![spec].into();
    let events = collect(&model, request).await;
    assert!(
        matches!(&events[..], [Err(ModelError::InvalidRequest(m))] if m.contains("lookup") && m.contains("/properties/parent")),
        "{events:?}"
    );
    assert!(server.requests().is_empty());
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
            body: json!({"error": {
                "code": 429,
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "status": "RESOURCE_EXHAUSTED"
            }})
            .to_string(),
        },
        sse(&[finishing(with_usage(text("after the wait"), 5, 3, 0, 0), "STOP")]),
    ])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events, vec![delta("after the wait"), finished(FinishReason::Stop, tokens(5, 3))]);
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "exactly one retry");
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(2), "waited {waited:?}");
    assert_eq!(requests[0].body, requests[1].body);
}

#[tokio::test]
async fn persistent_429_as_a_json_array_is_rate_limited_within_the_budget() {
    let limited = || {
        Reply::Status {
        status: 429,
        reason: "Too Many Requests",
        headers: vec![("retry-after", "0")],
        body: json!([{"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}])
            .to_string(),
    }
    };
    let server = Server::start(vec![limited(), limited(), limited()]).await;
    let model = client(&server).max_retries(1).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::RateLimited { attempts: 2, message })] if message.contains("Resource has been exhausted")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 2, "the retry budget is spent once, not once per layer");
}

#[tokio::test(start_paused = true)]
async fn persistent_503_fails_after_the_retry_budget() {
    let unavailable =
        || error_reply(503, "Service Unavailable", "UNAVAILABLE", "The model is overloaded. Please try again later.");
    let server = Server::start(vec![unavailable(), unavailable(), unavailable()]).await;
    let model = client(&server)
        .max_retries(2)
        .retry_backoff(Duration::from_millis(20), Duration::from_millis(50))
        .build()
        .unwrap();
    let events = collect(&model, user_request("hi")).await;
    match &events[..] {
        [Err(ModelError::Http { status: 503, attempts: 3, message })] => {
            assert!(message.contains("overloaded") && message.contains("UNAVAILABLE"), "{message}");
        }
        other => panic!("expected Http 503 after 3 attempts, got {other:?}"),
    }
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert!(requests[1].at - requests[0].at >= Duration::from_millis(10));
    assert!(requests[2].at - requests[1].at >= Duration::from_millis(20));
}

#[tokio::test(start_paused = true)]
async fn refused_credentials_are_auth_without_retry() {
    for reply in [
        error_reply(401, "Unauthorized", "UNAUTHENTICATED", "Request had invalid authentication credentials."),
        error_reply(403, "Forbidden", "PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
        // What the API answers for a wrong key.
        Reply::Status {
            status: 400,
            reason: "Bad Request",
            headers: vec![],
            body: json!({"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT",
                "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]}})
            .to_string(),
        },
    ] {
        let server = Server::start(vec![reply]).await;
        let model = client(&server).build().unwrap();
        let events = collect(&model, user_request("hi")).await;
        assert!(matches!(&events[..], [Err(ModelError::Auth { .. })]), "{events:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(server.requests().len(), 1, "never retried");
        let shown = format!("{:?}", events[0]);
        assert!(!shown.contains(KEY), "the key is never in an error: {shown}");
    }
}

#[tokio::test]
async fn other_4xx_is_http_without_retry() {
    let server = Server::start(vec![error_reply(
        400,
        "Bad Request",
        "INVALID_ARGUMENT",
        "Invalid JSON payload received. Unknown name \"additionalProperties\" at 'tools[0].function_declarations[0].parameters': Cannot find field.",
    )])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Http { status: 400, attempts: 1, message })] if message.contains("Unknown name")),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_prompt_over_the_context_window_is_typed() {
    let server = Server::start(vec![error_reply(
        400,
        "Bad Request",
        "INVALID_ARGUMENT",
        "The input token count (1290345) exceeds the maximum number of tokens allowed (1048576).",
    )])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("a very long prompt")).await;
    assert!(matches!(&events[..], [Err(ModelError::ContextWindowExceeded(m))] if m.contains("1048576")), "{events:?}");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn overloaded_in_the_stream_before_any_event_is_asked_again() {
    let overloaded = json!({"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}});
    let server = Server::start(vec![
        sse(std::slice::from_ref(&overloaded)),
        sse(&[finishing(text("second try"), "STOP")]),
        // After an event, the same error is final.
        sse(&[text("Once"), overloaded]),
    ])
    .await;
    let model = client(&server).retry_backoff(Duration::from_millis(10), Duration::from_millis(20)).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events, vec![delta("second try"), finished(FinishReason::Stop, Usage::default())]);
    assert_eq!(server.requests().len(), 2);

    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events[0], delta("Once"));
    assert!(matches!(&events[1..], [Err(ModelError::Overloaded(m))] if m.contains("overloaded")), "{events:?}");
    assert_eq!(server.requests().len(), 3, "a started answer is never asked again");
}

#[tokio::test]
async fn connection_cut_mid_stream_is_a_transport_error() {
    let server = Server::start(vec![Reply::Cut { body: sse_body(&[text("Once upon")]) }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Tell a story")).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], delta("Once upon"));
    assert!(matches!(&events[1], Err(ModelError::Transport(_))), "{events:?}");
    assert_eq!(server.requests().len(), 1, "a started stream is never retried");
}

#[tokio::test]
async fn a_stream_without_a_finish_reason_is_truncated() {
    // Close-delimited, so the body ends cleanly, but no chunk said it was the last.
    let body = sse_body(&[text("Once upon"), usage_only(4, 2, 0)]);
    let server = Server::start(vec![Reply::Sse { body, chunked: false, piece: 1000 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("Tell a story")).await;
    assert_eq!(events[0], delta("Once upon"));
    assert!(matches!(&events[1..], [Err(ModelError::Protocol(m))] if m.contains("truncated")), "{events:?}");
}

#[tokio::test]
async fn malformed_chunk_json_is_a_protocol_error() {
    let body = format!("{}data: {{\"candidates\": [{{\"content\":\r\n\r\n", sse_body(&[text("Hi")]));
    let server = Server::start(vec![Reply::Sse { body, chunked: true, piece: 16 }]).await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events[0], delta("Hi"));
    assert!(matches!(&events[1..], [Err(ModelError::Protocol(m))] if m.contains("invalid chunk")), "{events:?}");
}

#[tokio::test]
async fn garbage_and_a_wrong_content_type_are_protocol_errors() {
    let server = Server::start(vec![
        Reply::Sse { body: "\u{0}\u{1}binary garbage\r\nnot: an event\r\n\r\n".into(), chunked: true, piece: 5 },
        Reply::Status { status: 200, reason: "OK", headers: vec![], body: "<html><body>Sign in</body></html>".into() },
    ])
    .await;
    let model = client(&server).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Protocol(_))]), "{events:?}");
    // An HTML page labelled JSON (a captive portal, a misrouted proxy).
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Protocol(m))] if m.contains("invalid response JSON")), "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_server_that_never_answers_times_out() {
    let server = Server::start(vec![Reply::Hang]).await;
    let model = client(&server).timeout(Duration::from_millis(300)).build().unwrap();
    let started = Instant::now();
    let events = collect(&model, user_request("hi")).await;
    assert!(matches!(&events[..], [Err(ModelError::Transport(_))]), "{events:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_stream_that_stalls_times_out() {
    let mut server = Server::start(vec![Reply::StreamThenWait { body: sse_body(&[text("first")]) }]).await;
    let model = client(&server).timeout(Duration::from_millis(300)).build().unwrap();
    let events = collect(&model, user_request("hi")).await;
    assert_eq!(events[0], delta("first"));
    assert!(matches!(&events[1..], [Err(ModelError::Transport(_))]), "{events:?}");
    let seen = tokio::time::timeout(Duration::from_secs(15), server.disconnects.recv()).await;
    assert_eq!(seen, Ok(Some(())), "the client hung up");
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    let mut server = Server::start(vec![Reply::StreamThenWait { body: sse_body(&[text("first")]) }]).await;
    let model = client(&server).build().unwrap();
    let mut stream = model.stream(user_request("hi"));
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    assert_eq!(first, Some(delta("first")));
    drop(stream);
    let seen = tokio::time::timeout(Duration::from_secs(5), server.disconnects.recv()).await;
    assert_eq!(seen, Ok(Some(())), "the server saw the client go away");
}
