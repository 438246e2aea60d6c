//! Typed output on every wire (issue 25, part 1): whole runs of an agent with an output type
//! against the local wire servers of tests/openai.rs, openai_responses.rs, anthropic.rs and
//! gemini.rs, asserting what each request body asks for (the forced or required tool choice of
//! tool mode, the provider's structured output in native mode, no forced choice on Anthropic
//! with thinking on) and that the run ends with the typed value.

use kuralle::{
    AgentDef, OutputError, OutputMode, RunError, Runtime,
    models::{Anthropic, Gemini, OpenAi, OpenAiResponses},
};
use kuralle_tests::{
    FnTool,
    wire_server::{Reply, Server},
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, PartialEq, Deserialize, JsonSchema)]
struct Invoice {
    number: String,
    total_cents: u64,
    note: Option<String>,
}

const ANSWER: &str = r#"{"number":"A-7","total_cents":1250,"note":null}"#;

fn expected() -> Invoice {
    Invoice { number: "A-7".into(), total_cents: 1250, note: None }
}

fn agent(mode: OutputMode) -> AgentDef {
    AgentDef::new("billing", "Read the invoice.").output::<Invoice>().output_mode(mode)
}

/// The schema strict structured output is sent: every property required, the optional one
/// nullable, nothing else allowed, and no `format` (strict mode refuses `uint64`).
fn strict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "number": {"type": "string"},
            "total_cents": {"type": "integer", "minimum": 0},
            "note": {"type": ["string", "null"]}
        },
        "required": ["number", "total_cents", "note"],
        "additionalProperties": false
    })
}

async fn run(agent: AgentDef, model: impl kuralle::Model) -> Result<kuralle::RunOutput, RunError> {
    Runtime::builder().agent(agent).model(model).build().unwrap().run("Invoice A-7, total 12.50").await
}

fn tool_names(body: &Value) -> Vec<String> {
    let tools = body["tools"].as_array().cloned().unwrap_or_default();
    tools
        .iter()
        .map(|t| {
            // Chat nests the name under `function`; Responses and Anthropic do not.
            t.pointer("/function/name").or_else(|| t.get("name")).and_then(Value::as_str).unwrap().to_owned()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// OpenAI Chat Completions.

mod chat {
    use super::*;

    fn chunk(delta: Value, finish: Value) -> Value {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1_741_570_283,
            "model": "gpt-4o-mini-2024-07-18", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    }

    fn sse(chunks: &[Value]) -> Reply {
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        body.push_str("data: [DONE]\n\n");
        Reply::Sse { body, chunked: true, piece: 29 }
    }

    pub(super) fn text(t: &str) -> Reply {
        sse(&[chunk(json!({"role": "assistant", "content": t}), Value::Null), chunk(json!({}), json!("stop"))])
    }

    pub(super) fn refusal(t: &str) -> Reply {
        sse(&[
            chunk(json!({"role": "assistant", "content": null, "refusal": t}), Value::Null),
            chunk(json!({}), json!("stop")),
        ])
    }

    pub(super) fn call(name: &str, args: &str) -> Reply {
        let start = json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": name, "arguments": args}}]});
        sse(&[chunk(start, Value::Null), chunk(json!({}), json!("tool_calls"))])
    }

    pub(super) fn model(server: &Server) -> OpenAi {
        OpenAi::builder().base_url(&server.base_url).api_key("sk-test").model("gpt-4o-mini").build().unwrap()
    }
}

#[tokio::test]
async fn openai_chat_tool_mode_forces_the_output_tool_or_requires_a_call() {
    let server = Server::start(vec![chat::call("final_result", ANSWER)]).await;
    let out = run(agent(OutputMode::Tool), chat::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(body["tool_choice"], json!({"type": "function", "function": {"name": "final_result"}}));
    assert_eq!(tool_names(body), ["final_result"]);
    assert!(body.get("response_format").is_none());

    let server = Server::start(vec![chat::call("final_result", ANSWER)]).await;
    let lookup = FnTool::new("lookup", |_, _| async { Ok(json!({})) });
    run(agent(OutputMode::Tool).tool(lookup), chat::model(&server)).await.unwrap();
    let body = &server.requests()[0].body;
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(tool_names(body), ["lookup", "final_result"]);
}

#[tokio::test]
async fn openai_chat_native_mode_sends_a_strict_json_schema_response_format() {
    let server = Server::start(vec![chat::text(ANSWER)]).await;
    let out = run(agent(OutputMode::Native), chat::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(
        body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "final_result", "schema": strict_schema(), "strict": true}})
    );
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none(), "{body}");
}

#[tokio::test]
async fn an_openai_chat_refusal_ends_the_run_as_refused() {
    let server = Server::start(vec![chat::refusal("I'm sorry, I can't help with that.")]).await;
    let err = run(agent(OutputMode::Native), chat::model(&server)).await.unwrap_err();
    let RunError::Output(OutputError::Refused { message }) = &err else { panic!("{err:?}") };
    assert_eq!(message, "I'm sorry, I can't help with that.");
    assert_eq!(server.requests().len(), 1, "a refusal is not asked again");
}

#[tokio::test]
async fn prompted_mode_sends_no_structured_output_on_the_wire() {
    let server = Server::start(vec![chat::text(ANSWER)]).await;
    let out = run(agent(OutputMode::Prompted), chat::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    for key in ["tools", "tool_choice", "response_format"] {
        assert!(body.get(key).is_none(), "{key} in {body}");
    }
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("\"total_cents\""), "{system}");
}

// ---------------------------------------------------------------------------------------------
// OpenAI Responses.

mod responses {
    use super::*;

    fn sse(items: &[Value]) -> Reply {
        let response = json!({"id": "resp_1", "object": "response", "status": "completed", "model": "o4-mini",
            "output": items, "usage": {"input_tokens": 20, "output_tokens": 9, "total_tokens": 29}});
        let mut events: Vec<Value> = vec![json!({"type": "response.created", "response": {"id": "resp_1"}})];
        for (i, item) in items.iter().enumerate() {
            events.push(json!({"type": "response.output_item.done", "output_index": i, "item": item}));
        }
        events.push(json!({"type": "response.completed", "response": response}));
        let body = kuralle_tests::wire_server::responses_sse(&events);
        Reply::Sse { body, chunked: true, piece: 37 }
    }

    pub(super) fn text(t: &str) -> Reply {
        sse(&[json!({"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "text": t}]})])
    }

    pub(super) fn call(name: &str, args: &str) -> Reply {
        sse(&[json!({"id": "fc_1", "type": "function_call", "status": "completed", "arguments": args,
            "call_id": "call_1", "name": name})])
    }

    pub(super) fn model(server: &Server) -> OpenAiResponses {
        OpenAiResponses::builder().base_url(&server.base_url).api_key("sk-test").model("o4-mini").build().unwrap()
    }
}

#[tokio::test]
async fn openai_responses_tool_mode_forces_the_output_tool() {
    let server = Server::start(vec![responses::call("final_result", ANSWER)]).await;
    let out = run(agent(OutputMode::Tool), responses::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(body["tool_choice"], json!({"type": "function", "name": "final_result"}));
    assert_eq!(tool_names(body), ["final_result"]);
}

#[tokio::test]
async fn openai_responses_native_mode_sends_text_format_json_schema() {
    let server = Server::start(vec![responses::text(ANSWER)]).await;
    let out = run(agent(OutputMode::Native), responses::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(
        body["text"],
        json!({"format": {"type": "json_schema", "name": "final_result", "schema": strict_schema(), "strict": true}})
    );
    assert!(body.get("tool_choice").is_none(), "{body}");
}

// ---------------------------------------------------------------------------------------------
// Anthropic Messages.

mod anthropic {
    use super::*;

    const SIGNATURE: &str =
        "EqQBCkYIBRgCIkD2hZ1cTr9dC8YbKj/yfN4u0m9e8xR0k3bVd5kq8FfA0x0fJ4pH2yQj1xIbH9pBvKrj6mC4kK8cF3XqHvQ==";

    fn sse(blocks: &[Value], stop_reason: &str) -> Reply {
        let mut events = vec![json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "claude-sonnet-4-5", "stop_reason": null,
            "usage": {"input_tokens": 30, "output_tokens": 1}}})];
        for (i, block) in blocks.iter().enumerate() {
            let (start, deltas) = match block["type"].as_str().unwrap() {
                "text" => {
                    (json!({"type": "text", "text": ""}), vec![json!({"type": "text_delta", "text": block["text"]})])
                }
                "thinking" => (
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    vec![
                        json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                        json!({"type": "signature_delta", "signature": SIGNATURE}),
                    ],
                ),
                _ => (
                    json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                    vec![json!({"type": "input_json_delta", "partial_json": block["input"]})],
                ),
            };
            events.push(json!({"type": "content_block_start", "index": i, "content_block": start}));
            events.extend(deltas.into_iter().map(|d| json!({"type": "content_block_delta", "index": i, "delta": d})));
            events.push(json!({"type": "content_block_stop", "index": i}));
        }
        events.push(
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 12}}),
        );
        events.push(json!({"type": "message_stop"}));
        let body = events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())).collect();
        Reply::Sse { body, chunked: true, piece: 23 }
    }

    pub(super) fn thinking(t: &str) -> Value {
        json!({"type": "thinking", "thinking": t})
    }

    pub(super) fn text_block(t: &str) -> Value {
        json!({"type": "text", "text": t})
    }

    pub(super) fn call_block(id: &str, name: &str, input: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": name, "input": input})
    }

    pub(super) fn reply(blocks: &[Value]) -> Reply {
        let calls = blocks.iter().any(|b| b["type"] == "tool_use");
        sse(blocks, if calls { "tool_use" } else { "end_turn" })
    }

    pub(super) fn builder(server: &Server) -> kuralle::models::AnthropicBuilder {
        Anthropic::builder().base_url(&server.origin).api_key("sk-ant-test").model("claude-sonnet-4-5")
    }
}

#[tokio::test]
async fn anthropic_tool_mode_forces_the_output_tool_with_thinking_off() {
    let server =
        Server::start(vec![anthropic::reply(&[anthropic::call_block("toolu_1", "final_result", ANSWER)])]).await;
    let out = run(agent(OutputMode::Tool), anthropic::builder(&server).build().unwrap()).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "final_result"}));
    assert_eq!(tool_names(body), ["final_result"]);

    let server =
        Server::start(vec![anthropic::reply(&[anthropic::call_block("toolu_1", "final_result", ANSWER)])]).await;
    let lookup = FnTool::new("lookup", |_, _| async { Ok(json!({})) });
    run(agent(OutputMode::Tool).tool(lookup), anthropic::builder(&server).build().unwrap()).await.unwrap();
    assert_eq!(server.requests()[0].body["tool_choice"], json!({"type": "any"}));
}

/// The API refuses a forced tool choice with thinking on, so none is sent (the default,
/// `auto`); a text answer instead of the output call goes back for repair, and the run ends
/// with the value.
#[tokio::test]
async fn anthropic_with_thinking_on_is_never_forced_and_the_repair_loop_gets_the_value() {
    let server = Server::start(vec![
        anthropic::reply(&[anthropic::thinking("The total is 12.50."), anthropic::text_block("Invoice A-7: 12.50.")]),
        anthropic::reply(&[
            anthropic::thinking("I must call the tool."),
            anthropic::call_block("toolu_2", "final_result", ANSWER),
        ]),
    ])
    .await;
    let model = anthropic::builder(&server).max_tokens(8192).thinking(4096).build().unwrap();
    let out = run(agent(OutputMode::Tool), model).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.body["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
        let choice = r.body.get("tool_choice");
        assert!(choice.is_none() || choice == Some(&json!({"type": "auto"})), "forced with thinking on: {choice:?}");
        assert_eq!(tool_names(&r.body), ["final_result"]);
    }
    // The repair prompt closes the second request: the text answer was not the tool call.
    let last = requests[1].body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "user");
    assert!(last.to_string().contains("instead of calling the `final_result` tool"), "{last}");
}

#[tokio::test]
async fn anthropic_native_mode_sends_output_config() {
    let server = Server::start(vec![anthropic::reply(&[anthropic::text_block(ANSWER)])]).await;
    let out = run(agent(OutputMode::Native), anthropic::builder(&server).build().unwrap()).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(body["output_config"], json!({"format": {"type": "json_schema", "schema": strict_schema()}}));
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none(), "{body}");
}

// ---------------------------------------------------------------------------------------------
// Gemini.

mod gemini {
    use super::*;

    fn sse(parts: Value) -> Reply {
        let chunk = json!({
            "candidates": [{"content": {"parts": parts, "role": "model"}, "index": 0, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 9, "totalTokenCount": 29},
            "modelVersion": "gemini-2.5-flash",
        });
        Reply::Sse { body: format!("data: {chunk}\r\n\r\n"), chunked: true, piece: 23 }
    }

    pub(super) fn text(t: &str) -> Reply {
        sse(json!([{"text": t}]))
    }

    pub(super) fn call(name: &str, args: &str) -> Reply {
        sse(json!([{"functionCall": {"name": name, "args": serde_json::from_str::<Value>(args).unwrap()}}]))
    }

    pub(super) fn model(server: &Server) -> Gemini {
        Gemini::builder().base_url(&server.origin).api_key("AIza-test").model("gemini-2.5-flash").build().unwrap()
    }
}

#[tokio::test]
async fn gemini_tool_mode_allows_only_the_output_function() {
    let server = Server::start(vec![gemini::call("final_result", ANSWER)]).await;
    let out = run(agent(OutputMode::Tool), gemini::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let body = &server.requests()[0].body;
    assert_eq!(
        body["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["final_result"]}})
    );
    assert_eq!(body["tools"][0]["functionDeclarations"][0]["name"], "final_result");
}

#[tokio::test]
async fn gemini_native_mode_sends_response_json_schema() {
    let server = Server::start(vec![gemini::text(ANSWER)]).await;
    let out = run(agent(OutputMode::Native), gemini::model(&server)).await.unwrap();
    assert_eq!(out.typed::<Invoice>().unwrap(), expected());
    let config = &server.requests()[0].body["generationConfig"];
    assert_eq!(config["responseMimeType"], "application/json");
    // JSON Schema as it is (not made strict): Gemini takes `$ref` and nullable types there.
    let schema = &config["responseJsonSchema"];
    assert_eq!(schema["required"], json!(["number", "total_cents"]));
    assert_eq!(schema["properties"]["note"]["type"], json!(["string", "null"]));
    assert!(schema.get("$schema").is_none(), "{schema}");
}
