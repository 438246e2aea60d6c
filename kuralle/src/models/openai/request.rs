//! The chat-completions request body, and the events of a whole (non-streamed) completion.

use serde_json::{Map, Value, json};

use super::{Inner, PROVIDER, assemble::Assembler};
use crate::{
    model::{Message, ModelError, ModelEvent, ModelRequest, Part, ToolChoice, state_goes_to},
    schema,
};

impl Inner {
    /// The chat-completions request body for `request`.
    pub(super) fn body(&self, request: &ModelRequest) -> Result<Value, ModelError> {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if !request.system.is_empty() {
            messages.push(json!({"role": "system", "content": &*request.system}));
        }
        messages.extend(request.messages.iter().map(encode_message));

        let mut body = Map::new();
        body.insert("model".into(), json!(self.model));
        body.insert("messages".into(), Value::Array(messages));
        body.insert("stream".into(), json!(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
        if !request.tools.is_empty() {
            let tools = request
                .tools
                .iter()
                .map(|spec| schema::openai_function(spec, self.strict_tools))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ModelError::InvalidRequest(e.to_string()))?;
            body.insert("tools".into(), Value::Array(tools));
        }
        if let Some(output) = &request.output {
            match &output.tool_choice {
                ToolChoice::Auto => {}
                ToolChoice::Required => {
                    body.insert("tool_choice".into(), json!("required"));
                }
                ToolChoice::Tool { name } => {
                    body.insert("tool_choice".into(), json!({"type": "function", "function": {"name": name}}));
                }
            }
            if output.is_native() {
                // Strict when strict mode can express the schema; else the schema as it is.
                let (schema, strict) =
                    output.strict_schema().map_or_else(|| (output.plain_schema(), false), |s| (s, true));
                body.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": output.name, "schema": schema, "strict": strict}}),
                );
            }
        }
        if let Some(t) = self.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(m) = self.max_tokens {
            body.insert("max_tokens".into(), json!(m));
        }
        Ok(Value::Object(body))
    }
}

/// The events of a non-streamed `chat.completion` object: its message is treated as one delta.
/// Parsed straight into the assembler's types, so the body is held once more at most.
pub(super) fn completion_events(body: &[u8]) -> Result<Vec<ModelEvent>, ModelError> {
    let mut assembler = Assembler::default();
    assembler.done = true;
    let mut events = assembler.on_completion(body)?;
    events.extend(assembler.end()?);
    Ok(events)
}

/// One transcript message in chat-completions form.
fn encode_message(message: &Message) -> Value {
    match message {
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant { parts, origin } => {
            // DeepSeek's thinking and Gemini's signatures go back only to this wire.
            let state = state_goes_to(origin.as_ref(), PROVIDER);
            let mut text = String::new();
            let mut reasoning = String::new();
            let mut calls = Vec::new();
            for part in parts {
                match part {
                    Part::Text { text: t, .. } => text.push_str(t),
                    Part::Reasoning { text: t, .. } if state => reasoning.push_str(t),
                    Part::ToolCall { call, signature, .. } => {
                        let mut c = json!({
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        });
                        if let Some(signature) = signature.as_ref().filter(|_| state) {
                            c["extra_content"] = json!({"google": {"thought_signature": signature}});
                        }
                        calls.push(c);
                    }
                    Part::Reasoning { .. } | Part::RedactedReasoning { .. } => {}
                }
            }
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            m.insert("content".into(), if text.is_empty() { Value::Null } else { json!(text) });
            if !reasoning.is_empty() {
                m.insert("reasoning_content".into(), json!(reasoning));
            }
            if !calls.is_empty() {
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(m)
        }
        Message::Tool { call_id, content, .. } => {
            let text = match content {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            json!({"role": "tool", "tool_call_id": call_id, "content": text})
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::StreamExt;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };
    use tracing::{
        Metadata,
        field::{Field, Visit},
        span::{Attributes, Id, Record},
    };

    use tracing_core::span::Current;

    use crate::{Message, Model, ModelRequest, models::OpenAi};

    /// A subscriber with one span at a time that keeps every value recorded for `attempts`.
    #[derive(Default)]
    struct Attempts {
        values: Arc<Mutex<Vec<u64>>>,
        span: Mutex<Option<&'static Metadata<'static>>>,
        depth: Mutex<usize>,
    }

    struct U64s<'a>(&'a Mutex<Vec<u64>>);

    impl Visit for U64s<'_> {
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "attempts" {
                self.0.lock().unwrap().push(value);
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }

    impl tracing::Subscriber for Attempts {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attrs: &Attributes<'_>) -> Id {
            attrs.record(&mut U64s(&self.values));
            *self.span.lock().unwrap() = Some(attrs.metadata());
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, values: &Record<'_>) {
            values.record(&mut U64s(&self.values));
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &Id) {
            *self.depth.lock().unwrap() += 1;
        }
        fn exit(&self, _: &Id) {
            *self.depth.lock().unwrap() -= 1;
        }
        fn current_span(&self) -> Current {
            match *self.span.lock().unwrap() {
                Some(meta) if *self.depth.lock().unwrap() > 0 => Current::new(Id::from_u64(1), meta),
                _ => Current::none(),
            }
        }
    }

    /// Answers two requests with 503, the third with a short event stream.
    async fn flaky_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move {
            for n in 0..3 {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, then the body by its length.
                loop {
                    let read = socket.read(&mut buf).await.unwrap();
                    request.extend_from_slice(&buf[..read]);
                    let text = String::from_utf8_lossy(&request).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                    if read == 0 {
                        break;
                    }
                }
                let reply = if n < 2 {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
                } else {
                    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
                    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}")
                };
                socket.write_all(reply.as_bytes()).await.unwrap();
                socket.shutdown().await.ok();
            }
        });
        url
    }

    #[tokio::test]
    async fn the_span_records_attempts_once_with_the_final_count() {
        let subscriber = Attempts::default();
        let values = Arc::clone(&subscriber.values);
        let _guard = tracing::subscriber::set_default(subscriber);
        let model = OpenAi::builder()
            .base_url(flaky_server().await)
            .model("m")
            .retry_backoff(std::time::Duration::from_millis(1), std::time::Duration::from_millis(2))
            .build()
            .unwrap();
        let request = ModelRequest {
            system: "".into(),
            messages: vec![Message::User { content: "x".into() }].into(),
            tools: Vec::new().into(),
            output: None,
        };
        let events: Vec<_> = model.stream(request).collect().await;
        assert!(events.iter().all(Result::is_ok), "{events:?}");
        assert_eq!(*values.lock().unwrap(), [3]);
    }
}
