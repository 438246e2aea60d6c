//! Message content in the GenAI conventions' JSON shapes (`gen_ai.input.messages`,
//! `gen_ai.output.messages`, `gen_ai.system_instructions`, tool call arguments and results),
//! recorded only when content capture is on. `tracing` fields are scalars, so each goes on
//! its span as JSON text, which the conventions allow where structured values are not
//! supported.

use serde_json::{Value, json};

use crate::{
    Redactions, Transcript,
    error::ToolError,
    model::{FinishReason, Message, Part},
};

/// `gen_ai.system_instructions`: the agent's instructions as one text part.
pub(super) fn system(text: &str) -> Value {
    json!([{ "type": "text", "content": text }])
}

/// `gen_ai.input.messages`: the transcript sent, in order, its tools' secrets redacted.
pub(super) fn input(messages: &Transcript, redact: &Redactions) -> Value {
    Value::Array(messages.iter().map(|m| message(m, redact)).collect())
}

/// `gen_ai.output.messages`: the response as one assistant message.
pub(super) fn output(parts: &[Part], finish: &FinishReason, redact: &Redactions) -> Value {
    json!([{ "role": "assistant", "parts": assistant_parts(parts, redact), "finish_reason": finish_reason(finish) }])
}

/// `gen_ai.tool.call.result`: the value (redacted when `tool`'s result is a secret), or the
/// error object the model is shown.
pub(super) fn tool_result(tool: &str, result: &Result<Value, ToolError>, redact: &Redactions) -> Value {
    match result {
        Ok(v) => {
            let mut v = v.clone();
            redact.result(tool, &mut v);
            v
        }
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

fn message(m: &Message, redact: &Redactions) -> Value {
    match m {
        Message::User { content } => json!({ "role": "user", "parts": [{ "type": "text", "content": content }] }),
        Message::Assistant { parts, .. } => json!({ "role": "assistant", "parts": assistant_parts(parts, redact) }),
        Message::Tool { call_id, name, content } => {
            let mut content = content.clone();
            redact.result(name, &mut content);
            json!({
                "role": "tool",
                "parts": [{ "type": "tool_call_response", "id": call_id, "response": content }],
            })
        }
    }
}

/// Text, tool calls (arguments parsed where they are JSON) and readable reasoning; opaque
/// provider state (signatures, encrypted or redacted reasoning) is not content.
fn assistant_parts(parts: &[Part], redact: &Redactions) -> Vec<Value> {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } => Some(json!({ "type": "text", "content": text })),
            Part::ToolCall { call, .. } => {
                let mut arguments = serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                redact.args(&call.name, &mut arguments);
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
            input(&transcript, &Redactions::default()),
            json!([
                { "role": "user", "parts": [{ "type": "text", "content": "Weather in Paris?" }] },
                { "role": "assistant", "parts": [
                    { "type": "tool_call", "id": "c1", "name": "weather", "arguments": { "city": "Paris" } }
                ] },
                { "role": "tool", "parts": [{ "type": "tool_call_response", "id": "c1", "response": "rainy" }] },
            ])
        );
        assert_eq!(
            output(&[Part::text("Rainy.")], &FinishReason::Stop, &Redactions::default()),
            json!([{ "role": "assistant", "parts": [{ "type": "text", "content": "Rainy." }], "finish_reason": "stop" }])
        );

        // A tool's secrets never go on a span, even with capture on.
        let secret = Redactions::from_iter([("weather".to_owned(), crate::Redaction::new(["city"], true))]);
        let captured = input(&transcript, &secret);
        assert_eq!(captured[1]["parts"][0]["arguments"], json!({ "city": "[redacted]" }));
        assert_eq!(captured[2]["parts"][0]["response"], "[redacted]");
        assert_eq!(tool_result("weather", &Ok(json!("rainy")), &secret), json!("[redacted]"));
    }
}
