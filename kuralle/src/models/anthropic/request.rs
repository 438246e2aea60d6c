//! The Messages API request body: the transcript as alternating user and assistant
//! messages of content blocks, the system prompt, the tools, and the thinking settings.

use serde_json::{Map, Value, json};

use super::{Inner, PROVIDER, assemble::object_or_empty};
use crate::model::{Message, ModelError, ModelRequest, Part, ToolChoice, state_goes_to};

/// One message of the body while the transcript is encoded. A user message's `tool_result`
/// blocks always come before its other blocks, as the API requires.
struct Wire {
    role: &'static str,
    content: Vec<Value>,
}

impl Inner {
    /// The request body for `request`.
    pub(super) fn body(&self, request: &ModelRequest) -> Result<Value, ModelError> {
        let mut messages = encode_messages(request.messages.iter());
        answer_every_call(&mut messages);

        // The API wants a tool-use turn in progress in one thinking mode: with thinking on,
        // its assistant message starts with a thinking block; with thinking off, it has none.
        // A turn that cannot start with one (another provider's, or one produced without
        // thinking) is continued with thinking off for this request, which is what the API
        // documents doing itself for such a conversation.
        let current = current_turn(&messages);
        let thinking =
            self.thinking.filter(|_| current.is_none_or(|i| messages[i].content.first().is_some_and(is_thinking)));
        if thinking.is_none()
            && let Some(i) = current
        {
            messages[i].content.retain(|b| !is_thinking(b));
        }

        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert("max_tokens".into(), json!(self.max_tokens));
        body.insert("stream".into(), json!(true));
        if !request.system.is_empty() {
            let system = if self.cache_control {
                json!([{"type": "text", "text": &*request.system, "cache_control": {"type": "ephemeral"}}])
            } else {
                json!(&*request.system)
            };
            body.insert("system".into(), system);
        }
        let messages = messages
            .into_iter()
            .filter(|m| !m.content.is_empty())
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        body.insert("messages".into(), Value::Array(messages));
        if !request.tools.is_empty() {
            let mut tools: Vec<Value> = request
                .tools
                .iter()
                .map(|spec| {
                    let mut schema = spec.input_schema.clone();
                    if let Value::Object(map) = &mut schema {
                        map.remove("$schema");
                    }
                    let mut tool = json!({"name": spec.name, "input_schema": schema});
                    if !spec.description.is_empty() {
                        tool["description"] = json!(spec.description);
                    }
                    tool
                })
                .collect();
            if self.cache_control
                && let Some(last) = tools.last_mut()
            {
                last["cache_control"] = json!({"type": "ephemeral"});
            }
            body.insert("tools".into(), Value::Array(tools));
            // A forced choice only with thinking off: the API refuses forced tool use with
            // thinking on, so there the default (`auto`) stands and the runtime's repair loop
            // asks again for an answer that is not the output tool's call.
            let forced = match request.output.as_ref().map(|o| &o.tool_choice) {
                Some(ToolChoice::Required) => Some(json!({"type": "any"})),
                Some(ToolChoice::Tool { name }) => Some(json!({"type": "tool", "name": name})),
                Some(ToolChoice::Auto) | None => None,
            };
            if let Some(choice) = forced.filter(|_| thinking.is_none()) {
                body.insert("tool_choice".into(), choice);
            }
        }
        if let Some(output) = request.output.as_ref().filter(|o| o.is_native()) {
            let schema = output.strict_schema().unwrap_or_else(|| output.plain_schema());
            body.insert("output_config".into(), json!({"format": {"type": "json_schema", "schema": schema}}));
        }
        if let Some(budget_tokens) = thinking {
            body.insert("thinking".into(), json!({"type": "enabled", "budget_tokens": budget_tokens}));
        } else if let Some(t) = self.temperature {
            // The API accepts no temperature with thinking on.
            body.insert("temperature".into(), json!(t));
        }
        Ok(Value::Object(body))
    }
}

/// `body` with the response so far (`content`) as its last assistant message, so the API
/// continues a turn it paused.
pub(super) fn continuation(body: &Value, content: &[Value]) -> Value {
    let mut body = body.clone();
    if let Some(Value::Array(messages)) = body.get_mut("messages") {
        match messages.last_mut() {
            Some(last) if last["role"] == "assistant" => {
                if let Some(Value::Array(blocks)) = last.get_mut("content") {
                    blocks.extend_from_slice(content);
                }
            }
            _ => messages.push(json!({"role": "assistant", "content": content})),
        }
    }
    body
}

fn is_thinking(block: &Value) -> bool {
    matches!(block["type"].as_str(), Some("thinking" | "redacted_thinking"))
}

fn is_tool_result(block: &Value) -> bool {
    block["type"] == "tool_result"
}

/// The transcript as API messages, consecutive messages of one role merged.
fn encode_messages<'a>(transcript: impl Iterator<Item = &'a Message>) -> Vec<Wire> {
    let mut messages: Vec<Wire> = Vec::new();
    for message in transcript {
        match message {
            Message::User { content } => {
                if !content.is_empty() {
                    user(&mut messages).push(json!({"type": "text", "text": content}));
                }
            }
            Message::Assistant { parts, origin } => {
                let blocks = assistant_blocks(parts, state_goes_to(origin.as_ref(), PROVIDER));
                if blocks.is_empty() {
                    continue;
                }
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" => last.content.extend(blocks),
                    _ => messages.push(Wire { role: "assistant", content: blocks }),
                }
            }
            Message::Tool { call_id, content, .. } => {
                let blocks = user(&mut messages);
                let at = blocks.iter().take_while(|b| is_tool_result(b)).count();
                blocks.insert(at, tool_result(call_id, content));
            }
        }
    }
    messages
}

/// The content of the user message being built (a new one after an assistant message).
fn user(messages: &mut Vec<Wire>) -> &mut Vec<Value> {
    if messages.last().is_none_or(|m| m.role != "user") {
        messages.push(Wire { role: "user", content: Vec::new() });
    }
    &mut messages.last_mut().expect("just pushed").content
}

/// An assistant turn's blocks, in its order. Thinking and redacted thinking go back as they
/// came, only to this wire (`state`); another provider's turn sends its text and calls.
fn assistant_blocks(parts: &[Part], state: bool) -> Vec<Value> {
    let mut blocks = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            // The API refuses empty text blocks.
            Part::Text { text, .. } if text.is_empty() => {}
            Part::Text { text, .. } => blocks.push(json!({"type": "text", "text": text})),
            Part::ToolCall { call, .. } => blocks.push(json!({
                "type": "tool_use",
                "id": call.call_id,
                "name": call.name,
                "input": object_or_empty(&call.arguments),
            })),
            // Thinking without its signature would be refused; none is ever streamed, but a
            // hand-built turn may have one.
            Part::Reasoning { text, signature: Some(signature), .. } if state => {
                blocks.push(json!({"type": "thinking", "thinking": text, "signature": signature}));
            }
            Part::RedactedReasoning { data } if state => {
                blocks.push(json!({"type": "redacted_thinking", "data": data}));
            }
            Part::Reasoning { .. } | Part::RedactedReasoning { .. } => {}
        }
    }
    blocks
}

/// A tool's result as a `tool_result` block: text as is, other values as JSON text, and
/// `is_error` for the runtime's error and denial objects.
fn tool_result(call_id: &str, content: &Value) -> Value {
    let text = match content {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut block = json!({"type": "tool_result", "tool_use_id": call_id, "content": text});
    let failed = content.as_object().is_some_and(|o| {
        o.get("error").is_some_and(|e| !matches!(e, Value::Null | Value::Bool(false)))
            || o.get("__denied") == Some(&Value::Bool(true))
    });
    if failed {
        block["is_error"] = json!(true);
    }
    block
}

/// Every `tool_use` of an assistant message answered in the next message, as the API
/// requires: a call the transcript has no result for (a hand-built or truncated one) gets an
/// error result, after the results it has.
fn answer_every_call(messages: &mut [Wire]) {
    for i in 0..messages.len().saturating_sub(1) {
        if messages[i].role != "assistant" || messages[i + 1].role != "user" {
            continue;
        }
        let calls: Vec<String> = messages[i]
            .content
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .filter_map(|b| b["id"].as_str().map(str::to_owned))
            .collect();
        let next = &mut messages[i + 1].content;
        let mut at = next.iter().take_while(|b| is_tool_result(b)).count();
        for id in calls {
            if !next[..at].iter().any(|b| b["tool_use_id"] == id.as_str()) {
                next.insert(
                    at,
                    json!({"type": "tool_result", "tool_use_id": id, "content": "No result was recorded for this call.", "is_error": true}),
                );
                at += 1;
            }
        }
    }
}

/// The assistant message of a tool-use turn still in progress: the last message, or the one
/// before a last user message made only of tool results.
fn current_turn(messages: &[Wire]) -> Option<usize> {
    let last = messages.len().checked_sub(1)?;
    match messages[last].role {
        "assistant" => Some(last),
        _ if !messages[last].content.is_empty()
            && messages[last].content.iter().all(is_tool_result)
            && last > 0
            && messages[last - 1].role == "assistant" =>
        {
            Some(last - 1)
        }
        _ => None,
    }
}
