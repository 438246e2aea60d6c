//! The Responses request body: the system text as `instructions`, the transcript as input
//! items, the tools flattened to the Responses shape.

use serde_json::{Map, Value, json};

use super::{Inner, PROVIDER};
use crate::{
    model::{Message, ModelError, ModelRequest, Part, ToolChoice, state_goes_to},
    schema,
};

/// What the client asks to have returned inline, since nothing is stored: the reasoning
/// items' encrypted content, which the next request sends back.
const INCLUDE_ENCRYPTED_REASONING: &str = "reasoning.encrypted_content";

impl Inner {
    /// The Responses request body for `request`.
    pub(super) fn body(&self, request: &ModelRequest) -> Result<Value, ModelError> {
        let mut input = Vec::with_capacity(request.messages.len() + 1);
        for message in request.messages.iter() {
            encode_message(message, &mut input);
        }
        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        if !request.system.is_empty() {
            body.insert("instructions".into(), json!(&*request.system));
        }
        body.insert("input".into(), Value::Array(input));
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(|spec| schema::openai_function(spec, self.strict_tools).map(flatten_tool))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ModelError::InvalidRequest(e.to_string()))?;
            body.insert("tools".into(), Value::Array(tools));
            // Only with tools: the flag is about tool calls, and the chat API refuses it
            // without them.
            body.insert("parallel_tool_calls".into(), json!(true));
        }
        body.insert("stream".into(), json!(true));
        // Stateless: the transcript is the state, so a resumed run sends the same input.
        body.insert("store".into(), json!(false));
        if self.encrypted_reasoning {
            body.insert("include".into(), json!([INCLUDE_ENCRYPTED_REASONING]));
        }
        let mut reasoning = Map::new();
        if let Some(effort) = &self.reasoning_effort {
            reasoning.insert("effort".into(), json!(effort));
        }
        if let Some(summary) = &self.reasoning_summary {
            reasoning.insert("summary".into(), json!(summary));
        }
        if !reasoning.is_empty() {
            body.insert("reasoning".into(), Value::Object(reasoning));
        }
        if let Some(output) = &request.output {
            match &output.tool_choice {
                ToolChoice::Auto => {}
                ToolChoice::Required => {
                    body.insert("tool_choice".into(), json!("required"));
                }
                ToolChoice::Tool { name } => {
                    body.insert("tool_choice".into(), json!({"type": "function", "name": name}));
                }
            }
            if output.is_native() {
                // Strict when strict mode can express the schema; else the schema as it is.
                let (schema, strict) =
                    output.strict_schema().map_or_else(|| (output.plain_schema(), false), |s| (s, true));
                body.insert(
                    "text".into(),
                    json!({"format": {"type": "json_schema", "name": output.name, "schema": schema, "strict": strict}}),
                );
            }
        }
        if let Some(m) = self.max_output_tokens {
            body.insert("max_output_tokens".into(), json!(m));
        }
        if let Some(t) = self.temperature {
            body.insert("temperature".into(), json!(t));
        }
        Ok(Value::Object(body))
    }
}

/// The chat-completions tool shape (`{type, function: {name, ..}}`) as the Responses API
/// wants it: the function's fields beside `type`.
fn flatten_tool(tool: Value) -> Value {
    match tool {
        Value::Object(mut map) => match map.remove("function") {
            Some(Value::Object(function)) => {
                let mut flat = Map::with_capacity(function.len() + 1);
                flat.insert("type".into(), json!("function"));
                flat.extend(function);
                Value::Object(flat)
            }
            _ => Value::Object(map),
        },
        other => other,
    }
}

/// One transcript message as input items, appended to `input`.
fn encode_message(message: &Message, input: &mut Vec<Value>) {
    match message {
        Message::User { content } => input.push(json!({"type": "message", "role": "user", "content": content})),
        Message::Assistant { parts, origin } => {
            if state_goes_to(origin.as_ref(), PROVIDER) {
                encode_own_turn(parts, input);
            } else {
                // Another wire's turn (or one without an origin): its text and calls, with no
                // item ids and no reasoning, which only their provider can read.
                for part in parts {
                    match part {
                        Part::Text { text, .. } if !text.is_empty() => input.push(assistant_text(text)),
                        Part::ToolCall { call, .. } => input.push(function_call(call, None)),
                        Part::Text { .. } | Part::Reasoning { .. } | Part::RedactedReasoning { .. } => {}
                    }
                }
            }
        }
        Message::Tool { call_id, content, .. } => {
            let output = match content {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            input.push(json!({"type": "function_call_output", "call_id": call_id, "output": output}));
        }
    }
}

/// A turn this wire produced: every item back in order, with its id, each reasoning item
/// right before the items that followed it.
///
/// The API refuses a reasoning item without the item it produced after it ("provided without
/// its required following item"), and an item whose id names a reasoning item it was not sent
/// ("provided without its required 'reasoning' item"); with `store: false` it also cannot
/// look up a reasoning item by id alone. So a reasoning item that cannot stand on its own (no
/// encrypted content or text, or no id) is left out and the items after it go without their
/// ids, as plain input; and a reasoning item with nothing after it in the turn (a response
/// cut off while reasoning) is left out.
fn encode_own_turn(parts: &[Part], input: &mut Vec<Value>) {
    let last_output = parts.iter().rposition(|p| matches!(p, Part::Text { .. } | Part::ToolCall { .. }));
    let mut keep_ids = true;
    for (index, part) in parts.iter().enumerate() {
        match part {
            Part::Reasoning { text, summary, encrypted, id: Some(id), .. }
                if (encrypted.is_some() || !text.is_empty()) && last_output.is_some_and(|last| last > index) =>
            {
                let mut item = Map::new();
                item.insert("type".into(), json!("reasoning"));
                item.insert("id".into(), json!(id));
                if let Some(encrypted) = encrypted {
                    item.insert("encrypted_content".into(), json!(encrypted));
                }
                item.insert(
                    "summary".into(),
                    summary.iter().map(|s| json!({"type": "summary_text", "text": s})).collect(),
                );
                if !text.is_empty() {
                    // Reasoning text (servers running open-weight models return it).
                    item.insert("content".into(), json!([{"type": "reasoning_text", "text": text}]));
                }
                input.push(Value::Object(item));
                keep_ids = true;
            }
            Part::Reasoning { .. } => keep_ids = false,
            Part::RedactedReasoning { .. } => {}
            Part::Text { text, id, .. } => match id.as_ref().filter(|_| keep_ids) {
                Some(id) => input.push(json!({
                    "type": "message",
                    "role": "assistant",
                    "id": id,
                    // `annotations` is required by the output-text schema; strict validators
                    // (Azure) refuse the item without it.
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                })),
                None if !text.is_empty() => input.push(assistant_text(text)),
                None => {}
            },
            Part::ToolCall { call, id, .. } => {
                input.push(function_call(call, id.as_deref().filter(|_| keep_ids)));
            }
        }
    }
}

/// Assistant text with no item id.
fn assistant_text(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": text})
}

/// A `function_call` item; `id` is its item id (`fc_…`) when it goes back to its own wire.
fn function_call(call: &crate::ToolCallRequest, id: Option<&str>) -> Value {
    let mut item = Map::new();
    item.insert("type".into(), json!("function_call"));
    if let Some(id) = id {
        item.insert("id".into(), json!(id));
    }
    item.insert("call_id".into(), json!(call.call_id));
    item.insert("name".into(), json!(call.name));
    item.insert("arguments".into(), json!(call.arguments));
    Value::Object(item)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Origin, ToolCallRequest};

    fn call(id: &str) -> ToolCallRequest {
        ToolCallRequest { call_id: id.into(), name: "lookup".into(), arguments: "{}".into() }
    }

    fn reasoning(id: Option<&str>, encrypted: Option<&str>) -> Part {
        Part::Reasoning {
            text: String::new(),
            summary: vec!["Looked it up.".into()],
            signature: None,
            encrypted: encrypted.map(Into::into),
            id: id.map(Into::into),
        }
    }

    fn encode(parts: Vec<Part>, provider: &str) -> Vec<Value> {
        let mut input = Vec::new();
        encode_message(&Message::Assistant { parts, origin: Some(Origin::new(provider, "o4-mini")) }, &mut input);
        input
    }

    #[test]
    fn a_reasoning_item_without_encrypted_content_goes_with_the_ids_after_it() {
        let parts = vec![
            reasoning(Some("rs_1"), None),
            Part::ToolCall { call: call("call_1"), signature: None, id: Some("fc_1".into()) },
            reasoning(Some("rs_2"), Some("gAAA2")),
            Part::ToolCall { call: call("call_2"), signature: None, id: Some("fc_2".into()) },
        ];
        assert_eq!(
            encode(parts, PROVIDER),
            vec![
                json!({"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}),
                json!({"type": "reasoning", "id": "rs_2", "encrypted_content": "gAAA2",
                       "summary": [{"type": "summary_text", "text": "Looked it up."}]}),
                json!({"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "lookup", "arguments": "{}"}),
            ]
        );
    }

    #[test]
    fn a_trailing_reasoning_item_and_redacted_reasoning_are_left_out() {
        let parts = vec![
            Part::Text { text: "Partial".into(), signature: None, id: Some("msg_1".into()) },
            Part::RedactedReasoning { data: "x".into() },
            reasoning(Some("rs_9"), Some("gAAA9")),
        ];
        assert_eq!(
            encode(parts, PROVIDER),
            vec![json!({"type": "message", "role": "assistant", "id": "msg_1",
                        "content": [{"type": "output_text", "text": "Partial", "annotations": []}]})]
        );
    }

    #[test]
    fn a_turn_of_another_wire_sends_text_and_calls_only() {
        let parts = vec![
            reasoning(Some("rs_1"), Some("gAAA1")),
            Part::Text { text: "Checking.".into(), signature: Some("sig".into()), id: Some("msg_1".into()) },
            Part::ToolCall { call: call("call_1"), signature: Some("sig".into()), id: Some("fc_1".into()) },
        ];
        let expected = vec![
            json!({"type": "message", "role": "assistant", "content": "Checking."}),
            json!({"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"}),
        ];
        assert_eq!(encode(parts.clone(), "openai"), expected);
        let mut input = Vec::new();
        encode_message(&Message::Assistant { parts, origin: None }, &mut input);
        assert_eq!(input, expected);
    }

    #[test]
    fn reasoning_text_goes_back_as_content() {
        let parts = vec![
            Part::Reasoning {
                text: "step by step".into(),
                summary: vec![],
                signature: None,
                encrypted: None,
                id: Some("rs_1".into()),
            },
            Part::Text { text: "4".into(), signature: None, id: Some("msg_1".into()) },
        ];
        assert_eq!(
            encode(parts, PROVIDER)[0],
            json!({"type": "reasoning", "id": "rs_1", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "step by step"}]})
        );
    }
}
