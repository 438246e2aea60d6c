//! Message content in the GenAI conventions' JSON shapes (`gen_ai.input.messages`,
//! `gen_ai.output.messages`, `gen_ai.system_instructions`, tool call arguments and results),
//! recorded only when content capture is on. `tracing` fields are scalars, so each goes on
//! its span as JSON text, which the conventions allow where structured values are not
//! supported.

use serde_json::{Value, json};

use crate::{
    Transcript,
    error::ToolError,
    model::{FinishReason, Message, Part},
};

/// `gen_ai.system_instructions`: the agent's instructions as one text part.
pub(super) fn system(text: &str) -> Value {
    json!([{ "type": "text", "content": text }])
}

/// `gen_ai.input.messages`: the transcript sent, in order.
pub(super) fn input(messages: &Transcript) -> Value {
    Value::Array(messages.iter().map(message).collect())
}

/// `gen_ai.output.messages`: the response as one assistant message.
pub(super) fn output(parts: &[Part], finish: &FinishReason) -> Value {
    json!([{ "role": "assistant", "parts": assistant_parts(parts), "finish_reason": finish_reason(finish) }])
}

/// `gen_ai.tool.call.result`: the value, or the error object the model is shown.
pub(super) fn tool_result(result: &Result<Value, ToolError>) -> Value {
    match result {
        Ok(v) => v.clone(),
        Err(e) => serde_json::to_value(e).unwrap_or_else(|_| Value::String(e.to_string())),
    }
}

/// The conventions' finish reason: `stop`, `length`, `content_filter`, `tool_call`, or the
/// provider's own word.
pub(super) fn finish_reason(finish: &FinishReason) -> &str {
    match finish {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool_call",
        FinishReason::Length => "length",
        FinishReason::ContentFilter | FinishReason::Refusal => "content_filter",
        FinishReason::Other(other) => other,
    }
}

fn message(m: &Message) -> Value {
    match m {
        Message::User { content } => json!({ "role": "user", "parts": [{ "type": "text", "content": content }] }),
        Message::Assistant { parts, .. } => json!({ "role": "assistant", "parts": assistant_parts(parts) }),
        Message::Tool { call_id, content, .. } => json!({
            "role": "tool",
            "parts": [{ "type": "tool_call_response", "id": call_id, "response": content }],
        }),
    }
}

/// Text, tool calls (arguments parsed where they are JSON) and readable reasoning; opaque
/// provider state (signatures, encrypted or redacted reasoning) is not content.
fn assistant_parts(parts: &[Part]) -> Vec<Value> {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } => Some(json!({ "type": "text", "content": text })),
            Part::ToolCall { call, .. } => {
                let arguments = serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                Some(json!({ "type": "tool_call", "id": call.call_id, "name": call.name, "arguments": arguments }))
            }
            Part::Reasoning { text, summary, .. } => {
                let content = if text.is_empty() { summary.join("\n") } else { text.clone() };
                (!content.is_empty()).then(|| json!({ "type": "reasoning", "content": content }))
            }
            Part::RedactedReasoning { .. } => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::ToolCallRequest;

    #[test]
    fn messages_take_the_conventions_shapes() {
        let transcript: Transcript = vec![
            Message::User { content: "Weather in Paris?".into() },
            Message::Assistant {
                parts: vec![Part::call(ToolCallRequest {
                    call_id: "c1".into(),
                    name: "weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                })],
                origin: None,
            },
            Message::Tool { call_id: "c1".into(), name: "weather".into(), content: json!("rainy") },
        ]
        .into();
        assert_eq!(
            input(&transcript),
            json!([
                { "role": "user", "parts": [{ "type": "text", "content": "Weather in Paris?" }] },
                { "role": "assistant", "parts": [
                    { "type": "tool_call", "id": "c1", "name": "weather", "arguments": { "city": "Paris" } }
                ] },
                { "role": "tool", "parts": [{ "type": "tool_call_response", "id": "c1", "response": "rainy" }] },
            ])
        );
        assert_eq!(
            output(&[Part::text("Rainy.")], &FinishReason::Stop),
            json!([{ "role": "assistant", "parts": [{ "type": "text", "content": "Rainy." }], "finish_reason": "stop" }])
        );
    }
}
