//! Messages API stream events → [`ModelEvent`]s, for one response.
//!
//! Content blocks arrive as `content_block_start`, deltas, `content_block_stop`, keyed by
//! `index`. Text is emitted as it arrives and closed into a [`Part::Text`] at its block's
//! stop; thinking (`thinking_delta` text, then one `signature_delta`) becomes a
//! [`Part::Reasoning`] with its signature; `redacted_thinking` a [`Part::RedactedReasoning`];
//! a `tool_use` block's input is the concatenation of its `input_json_delta` fragments (none,
//! or only empty ones, mean `{}`). Every block is also kept in the API's own shape, so a turn
//! the API paused (`stop_reason: pause_turn`) can be sent back to be continued.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::model::{FinishReason, ModelError, ModelEvent, Part, ToolCallRequest, Usage};
use crate::models::{
    http::{describe_error, excerpt},
    sse::SseEvent,
};

/// One content block while it streams.
#[derive(Debug)]
enum Block {
    Text {
        text: String,
        citations: Vec<Value>,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        start: Value,
        json: String,
    },
    /// A block this client has no part for (a server tool's call or result): kept as the
    /// API sent it, its streamed input filled in, for a paused turn's continuation only.
    Other {
        raw: Value,
        json: String,
    },
}

/// How a response ended, for the client to finish the turn or continue a paused one.
#[derive(Debug)]
pub(super) struct Ended {
    /// The API's `stop_reason`, when it sent one.
    pub(super) stop_reason: Option<String>,
    /// This response's tokens.
    pub(super) usage: Usage,
    /// Its content blocks in the API's shape, in order.
    pub(super) content: Vec<Value>,
    /// Whether it issued tool calls.
    pub(super) called_tools: bool,
}

impl Ended {
    /// The finish reason of `stop_reason`.
    pub(super) fn finish_reason(&self) -> FinishReason {
        match self.stop_reason.as_deref() {
            Some("end_turn" | "stop_sequence") => FinishReason::Stop,
            Some("tool_use") => FinishReason::ToolCalls,
            // Both cut the answer short at a token limit, the output's or the context's.
            Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
            Some("refusal") => FinishReason::Refusal,
            Some(other) => FinishReason::Other(other.to_owned()),
            None if self.called_tools => FinishReason::ToolCalls,
            None => FinishReason::Stop,
        }
    }
}

/// Token counts as the API reports them: `message_start` has them all, `message_delta` the
/// cumulative output count (and, when present, final input counts that replace the first).
#[derive(Debug, Default)]
struct Tokens {
    input: u64,
    cache_write: u64,
    cache_read: u64,
    output: u64,
    thinking: u64,
}

impl Tokens {
    fn update(&mut self, usage: &Value) {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        if let Some(n) = field("input_tokens") {
            self.input = n;
        }
        if let Some(n) = field("cache_creation_input_tokens") {
            self.cache_write = n;
        }
        if let Some(n) = field("cache_read_input_tokens") {
            self.cache_read = n;
        }
        if let Some(n) = field("output_tokens") {
            self.output = n;
        }
        if let Some(n) = usage.pointer("/output_tokens_details/thinking_tokens").and_then(Value::as_u64) {
            self.thinking = n;
        }
    }

    fn usage(&self) -> Usage {
        Usage {
            // The API counts cache reads and writes apart from `input_tokens`.
            input_tokens: self.input.saturating_add(self.cache_write).saturating_add(self.cache_read),
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: self.thinking,
        }
    }
}

/// Turns one response's events into [`ModelEvent`]s.
#[derive(Debug, Default)]
pub(super) struct Assembler {
    open: BTreeMap<u64, Block>,
    content: BTreeMap<u64, Value>,
    tokens: Tokens,
    stop_reason: Option<String>,
    called_tools: bool,
    /// `message_stop` arrived: the response is complete.
    pub(super) stopped: bool,
}

impl Assembler {
    /// One server-sent event.
    pub(super) fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, ModelError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!("invalid JSON in the event stream ({e}): {}", excerpt(data, 500)))
        })?;
        // The data's `type` names the event; the SSE `event:` line repeats it.
        let kind = value.get("type").and_then(Value::as_str).or(event.event.as_deref()).unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                crate::trace::report_response(
                    value.pointer("/message/model").and_then(Value::as_str),
                    value.pointer("/message/id").and_then(Value::as_str),
                );
                if let Some(usage) = value.pointer("/message/usage") {
                    self.tokens.update(usage);
                }
            }
            "content_block_start" => {
                let index = index_of(&value)?;
                let block = value.get("content_block").cloned().unwrap_or(Value::Null);
                self.start(index, block, &mut out)?;
            }
            "content_block_delta" => {
                let index = index_of(&value)?;
                self.delta(index, value.get("delta").unwrap_or(&Value::Null), &mut out)?;
            }
            "content_block_stop" => {
                let index = index_of(&value)?;
                let block = self.open.remove(&index).ok_or_else(|| {
                    ModelError::Protocol(format!("content_block_stop for block {index}, which is not open"))
                })?;
                self.close(index, block, &mut out)?;
            }
            "message_delta" => {
                if let Some(reason) = value.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = value.get("usage") {
                    self.tokens.update(usage);
                }
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(stream_error(&value)),
            // `ping`, and event types added after this client: the API's versioning policy
            // says new ones may appear, and they carry nothing this client needs.
            _ => {}
        }
        Ok(out)
    }

    /// A whole (non-streamed) `message` object, as a server that ignored `stream: true` sends.
    pub(super) fn on_message(&mut self, body: &[u8]) -> Result<Vec<ModelEvent>, ModelError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ModelError::Protocol(format!(
                "invalid message JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(&body[..body.len().min(2000)]), 500)
            ))
        })?;
        if value.get("type").and_then(Value::as_str) == Some("error") {
            return Err(stream_error(&value));
        }
        let Some(blocks) = value.get("content").and_then(Value::as_array) else {
            return Err(ModelError::Protocol(format!(
                "a message without content: {}",
                excerpt(&value.to_string(), 500)
            )));
        };
        if let Some(usage) = value.get("usage") {
            self.tokens.update(usage);
        }
        let mut out = Vec::new();
        for (index, block) in (0u64..).zip(blocks) {
            self.start(index, block.clone(), &mut out)?;
            let block = self.open.remove(&index).unwrap_or(Block::Other { raw: Value::Null, json: String::new() });
            self.close(index, block, &mut out)?;
        }
        self.stop_reason = value.get("stop_reason").and_then(Value::as_str).map(str::to_owned);
        self.stopped = true;
        Ok(out)
    }

    fn start(&mut self, index: u64, block: Value, out: &mut Vec<ModelEvent>) -> Result<(), ModelError> {
        if self.open.contains_key(&index) || self.content.contains_key(&index) {
            return Err(ModelError::Protocol(format!("content block {index} started twice")));
        }
        let string = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
        let block = match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                // Normally empty at the start; a whole message has its text here.
                let text = string("text");
                if !text.is_empty() {
                    out.push(ModelEvent::TextDelta { delta: text.clone() });
                }
                let citations = block.get("citations").and_then(Value::as_array).cloned().unwrap_or_default();
                Block::Text { text, citations }
            }
            Some("thinking") => {
                let thinking = string("thinking");
                if !thinking.is_empty() {
                    out.push(ModelEvent::ReasoningDelta { delta: thinking.clone() });
                }
                Block::Thinking { thinking, signature: string("signature") }
            }
            Some("redacted_thinking") => Block::Redacted { data: string("data") },
            Some("tool_use") => Block::ToolUse {
                id: string("id"),
                name: string("name"),
                start: block.get("input").cloned().unwrap_or(Value::Null),
                json: String::new(),
            },
            _ => Block::Other { raw: block, json: String::new() },
        };
        self.open.insert(index, block);
        Ok(())
    }

    fn delta(&mut self, index: u64, delta: &Value, out: &mut Vec<ModelEvent>) -> Result<(), ModelError> {
        let block = self
            .open
            .get_mut(&index)
            .ok_or_else(|| ModelError::Protocol(format!("content_block_delta for block {index}, which is not open")))?;
        let string = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or("");
        // A delta of another block's kind is ignored, as the API's own SDKs do.
        match (delta.get("type").and_then(Value::as_str), block) {
            (Some("text_delta"), Block::Text { text, .. }) => {
                let piece = string("text");
                if !piece.is_empty() {
                    text.push_str(piece);
                    out.push(ModelEvent::TextDelta { delta: piece.to_owned() });
                }
            }
            (Some("citations_delta"), Block::Text { citations, .. }) => {
                if let Some(citation) = delta.get("citation") {
                    citations.push(citation.clone());
                }
            }
            (Some("thinking_delta"), Block::Thinking { thinking, .. }) => {
                let piece = string("thinking");
                if !piece.is_empty() {
                    thinking.push_str(piece);
                    out.push(ModelEvent::ReasoningDelta { delta: piece.to_owned() });
                }
            }
            // The signature arrives whole, in one delta, just before the block's stop.
            (Some("signature_delta"), Block::Thinking { signature, .. }) => string("signature").clone_into(signature),
            (Some("input_json_delta"), Block::ToolUse { json, .. } | Block::Other { json, .. }) => {
                json.push_str(string("partial_json"));
            }
            _ => {}
        }
        Ok(())
    }

    fn close(&mut self, index: u64, block: Block, out: &mut Vec<ModelEvent>) -> Result<(), ModelError> {
        let wire = match block {
            Block::Text { text, citations } => {
                if text.is_empty() {
                    // The API refuses an empty text block; there is nothing to keep.
                    return Ok(());
                }
                let mut wire = json!({"type": "text", "text": text});
                if !citations.is_empty() {
                    wire["citations"] = Value::Array(citations);
                }
                // The block's text, whole: it replaces the deltas, so two text blocks in a
                // row stay two parts.
                out.push(ModelEvent::Part { part: Part::text(text) });
                wire
            }
            Block::Thinking { thinking, signature } => {
                if thinking.is_empty() && signature.is_empty() {
                    return Ok(());
                }
                let wire = json!({"type": "thinking", "thinking": thinking, "signature": signature});
                out.push(ModelEvent::Part {
                    part: Part::Reasoning {
                        text: thinking,
                        summary: Vec::new(),
                        signature: (!signature.is_empty()).then_some(signature),
                        encrypted: None,
                        id: None,
                    },
                });
                wire
            }
            Block::Redacted { data } => {
                let wire = json!({"type": "redacted_thinking", "data": data});
                out.push(ModelEvent::Part { part: Part::RedactedReasoning { data } });
                wire
            }
            Block::ToolUse { id, name, start, json } => {
                if name.is_empty() {
                    return Err(ModelError::Protocol(format!("tool_use block {index} has no name")));
                }
                // The start block's `input` is `{}` while fragments follow; a call without
                // arguments streams no fragment, or only an empty one.
                let arguments = if !json.trim().is_empty() {
                    json
                } else if start.as_object().is_some_and(|o| !o.is_empty()) {
                    start.to_string()
                } else {
                    "{}".to_owned()
                };
                let input = object_or_empty(&arguments);
                self.called_tools = true;
                out.push(ModelEvent::ToolCall(ToolCallRequest {
                    call_id: id.as_str().into(),
                    name: name.as_str().into(),
                    arguments,
                }));
                json!({"type": "tool_use", "id": id, "name": name, "input": input})
            }
            Block::Other { mut raw, json } => {
                if !json.trim().is_empty()
                    && let Value::Object(map) = &mut raw
                {
                    map.insert("input".into(), object_or_empty(&json));
                }
                raw
            }
        };
        self.content.insert(index, wire);
        Ok(())
    }

    /// The end of the response: blocks left open are closed in order (their events
    /// returned), then how it ended; a protocol error when `message_stop` never came.
    pub(super) fn end(mut self) -> Result<(Vec<ModelEvent>, Ended), ModelError> {
        if !self.stopped {
            return Err(ModelError::Protocol("the event stream ended before message_stop (truncated response)".into()));
        }
        let mut out = Vec::new();
        for (index, block) in std::mem::take(&mut self.open) {
            self.close(index, block, &mut out)?;
        }
        let ended = Ended {
            stop_reason: self.stop_reason,
            usage: self.tokens.usage(),
            content: self.content.into_values().collect(),
            called_tools: self.called_tools,
        };
        Ok((out, ended))
    }
}

fn index_of(event: &Value) -> Result<u64, ModelError> {
    event.get("index").and_then(Value::as_u64).ok_or_else(|| {
        ModelError::Protocol(format!("a content block event without an index: {}", excerpt(&event.to_string(), 300)))
    })
}

/// A tool call's arguments as the object `tool_use.input` must be: arguments that are not
/// a JSON object (a call cut off at `max_tokens`) become `{}`; the tool's answer to that
/// call has already told the model its input was invalid.
pub(super) fn object_or_empty(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => Value::Object(map),
        _ => Value::Object(Map::new()),
    }
}

/// An `error` event (`{"type":"error","error":{"type","message"}}`): the API was overloaded,
/// or failed otherwise, after answering 200.
fn stream_error(value: &Value) -> ModelError {
    let error = value.get("error").unwrap_or(value);
    let message = describe_error(error);
    match error.get("type").and_then(Value::as_str) {
        Some("overloaded_error") => ModelError::Overloaded(message),
        _ => ModelError::Provider(message),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn run(events: &[Value]) -> Result<(Vec<ModelEvent>, Ended), ModelError> {
        let mut assembler = Assembler::default();
        let mut out = Vec::new();
        for event in events {
            out.extend(assembler.on_event(&SseEvent { event: None, data: event.to_string() })?);
        }
        let (tail, ended) = assembler.end()?;
        out.extend(tail);
        Ok((out, ended))
    }

    fn start() -> Value {
        json!({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant",
            "content": [], "model": "claude-sonnet-4-5", "stop_reason": null,
            "usage": {"input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}}})
    }

    fn stop(reason: &str) -> [Value; 2] {
        [
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": 7}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[test]
    fn a_block_left_open_at_message_stop_is_closed_in_order() {
        let mut events = vec![
            start(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"a\":1}"}}),
        ];
        events.extend(stop("tool_use"));
        let (out, ended) = run(&events).unwrap();
        assert_eq!(
            out,
            vec![ModelEvent::ToolCall(ToolCallRequest {
                call_id: "toolu_1".into(),
                name: "t".into(),
                arguments: "{\"a\":1}".into()
            })]
        );
        assert_eq!(ended.content, vec![json!({"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"a": 1}})]);
        assert_eq!(ended.finish_reason(), FinishReason::ToolCalls);
    }

    #[test]
    fn events_for_blocks_that_are_not_open_are_protocol_errors() {
        let delta = json!({"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": "x"}});
        assert!(matches!(run(&[start(), delta]), Err(ModelError::Protocol(m)) if m.contains("block 3")));
        let stop = json!({"type": "content_block_stop", "index": 0});
        assert!(matches!(run(&[start(), stop]), Err(ModelError::Protocol(_))));
        let twice = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
        assert!(matches!(run(&[start(), twice.clone(), twice]), Err(ModelError::Protocol(m)) if m.contains("twice")));
        let nameless = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "", "input": {}}});
        let close = json!({"type": "content_block_stop", "index": 0});
        assert!(matches!(run(&[start(), nameless, close]), Err(ModelError::Protocol(m)) if m.contains("no name")));
    }

    #[test]
    fn server_tool_blocks_are_kept_for_a_continuation_without_parts() {
        let mut events = vec![
            start(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"query\": \"rust\"}"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}}),
            json!({"type": "content_block_stop", "index": 1}),
        ];
        events.extend(stop("pause_turn"));
        let (out, ended) = run(&events).unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(
            ended.content,
            vec![
                json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rust"}}),
                json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}),
            ]
        );
        assert_eq!(ended.finish_reason(), FinishReason::Other("pause_turn".into()));
    }

    #[test]
    fn thinking_tokens_are_read_from_the_usage_details() {
        let mut events = vec![start()];
        events.push(json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 90, "output_tokens_details": {"thinking_tokens": 60}}}));
        events.push(json!({"type": "message_stop"}));
        let (_, ended) = run(&events).unwrap();
        assert_eq!(
            ended.usage,
            Usage { input_tokens: 10, output_tokens: 90, reasoning_tokens: 60, ..Usage::default() }
        );
    }

    /// `text` cut at the given points (char boundaries).
    fn cut(text: &str, points: &[prop::sample::Index]) -> Vec<String> {
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let mut at: Vec<usize> = points.iter().map(|p| bounds[p.index(bounds.len())]).collect();
        at.sort_unstable();
        let mut pieces = Vec::new();
        let mut last = 0;
        for p in at {
            pieces.push(text[last..p].to_owned());
            last = p;
        }
        pieces.push(text[last..].to_owned());
        pieces
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// However a call's input is cut into `input_json_delta` fragments (empty ones
        /// included), the call carries the input text whole, and the kept block its object;
        /// text and thinking come out as sent, in block order.
        #[test]
        fn fragments_assemble_into_whole_blocks(
            input in crate::strategies::json_value().prop_map(|v| json!({"v": v}).to_string()),
            text in "(?s).{1,40}",
            thinking in "(?s).{0,40}",
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut events = vec![
                start(),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            ];
            for piece in cut(&thinking, &cuts) {
                events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": piece}}));
            }
            events.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}));
            events.push(json!({"type": "content_block_stop", "index": 0}));
            events.push(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}));
            for piece in cut(&text, &cuts) {
                events.push(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": piece}}));
            }
            events.push(json!({"type": "content_block_stop", "index": 1}));
            events.push(json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}}}));
            events.push(json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}));
            for piece in cut(&input, &cuts) {
                events.push(json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": piece}}));
            }
            events.push(json!({"type": "content_block_stop", "index": 2}));
            events.extend(stop("tool_use"));

            let (out, ended) = run(&events).unwrap();
            let streamed: String = out.iter().filter_map(|e| match e {
                ModelEvent::TextDelta { delta } => Some(delta.as_str()),
                _ => None,
            }).collect();
            prop_assert_eq!(&streamed, &text);
            let parts: Vec<&ModelEvent> = out.iter().filter(|e| !matches!(e, ModelEvent::TextDelta { .. } | ModelEvent::ReasoningDelta { .. })).collect();
            let reasoning = ModelEvent::Part { part: Part::Reasoning {
                text: thinking.clone(), summary: vec![], signature: Some("c2ln".into()), encrypted: None, id: None,
            }};
            let text_part = ModelEvent::Part { part: Part::text(text.clone()) };
            let call = ModelEvent::ToolCall(ToolCallRequest { call_id: "toolu_9".into(), name: "f".into(), arguments: input.clone() });
            prop_assert_eq!(parts, vec![&reasoning, &text_part, &call]);
            let parsed: Value = serde_json::from_str(&input).unwrap();
            prop_assert_eq!(&ended.content[2]["input"], &parsed);
            prop_assert_eq!(ended.finish_reason(), FinishReason::ToolCalls);
        }

        /// Arbitrary event payloads (JSON-ish or not): events or a typed error, never a panic.
        #[test]
        fn arbitrary_payloads_never_panic(data in proptest::collection::vec(prop_oneof![
            "(?s).{0,24}",
            crate::strategies::json_value().prop_map(|v| json!({"type": "content_block_start", "index": 0, "content_block": v}).to_string()),
            crate::strategies::json_value().prop_map(|v| json!({"type": "content_block_delta", "index": 0, "delta": v}).to_string()),
            crate::strategies::json_value().prop_map(|v| json!({"type": "message_delta", "delta": v, "usage": v}).to_string()),
            (any::<u64>(), "[a-z_]{0,12}").prop_map(|(i, t)| json!({"type": t, "index": i}).to_string()),
            Just(json!({"type": "message_stop"}).to_string()),
        ], 0..8)) {
            let mut assembler = Assembler::default();
            for d in &data {
                if assembler.on_event(&SseEvent { event: None, data: d.clone() }).is_err() {
                    return Ok(());
                }
            }
            let _ = assembler.end();
        }
    }
}
