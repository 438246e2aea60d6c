//! Gemini response chunks → [`ModelEvent`]s.
//!
//! A streamed answer is a series of `GenerateContentResponse` chunks, each with parts of the
//! first candidate, `usageMetadata` (cumulative; the last one counts) and, near the end, a
//! `finishReason`. How parts become events:
//! - Thought text (`thought: true`) streams as [`ModelEvent::ReasoningDelta`]s; consecutive
//!   thought pieces are one [`Part::Reasoning`], closed by the next other part, by a
//!   signature on a thought piece, or by the end.
//! - Answer text streams as [`ModelEvent::TextDelta`]s; consecutive pieces are one text part.
//!   A `thoughtSignature` on a text piece (usually the last piece of the part, often with
//!   empty text) closes that part: the client sends a [`Part::Text`] with the whole text and
//!   the signature. A signature on a part with no text before it (`{"text": "",
//!   "thoughtSignature"}` after a call, say) is a signature-only [`Part::Reasoning`].
//! - A `functionCall` arrives whole and is emitted at once, with its signature when it has
//!   one (only the first call of a parallel batch does; none is ever copied to another). Its
//!   id is Gemini's when given, else derived from the response: `gemini-call-{index}-{hash}`,
//!   the hash over the turn's place in the run, the call's index in the response, its name and
//!   its argument text, so the same response parsed twice gives the same ids, and ids are
//!   unique within a response and across the turns of a run.
//! - The finish is decided at the end of the stream from the last `finishReason` seen: `STOP`
//!   after calls is [`FinishReason::ToolCalls`]; `MAX_TOKENS` is `Length`; the safety family
//!   (`SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`, `IMAGE_*` blocks) is
//!   `ContentFilter`; a failed call (`MALFORMED_FUNCTION_CALL`, `UNEXPECTED_TOOL_CALL`,
//!   `TOO_MANY_TOOL_CALLS`, `MISSING_THOUGHT_SIGNATURE`, `MALFORMED_RESPONSE`) is a
//!   [`ModelError::Provider`] naming the reason and Gemini's `finishMessage`. A prompt blocked
//!   before any candidate (`promptFeedback.blockReason`) is a `ContentFilter` finish. A stream
//!   that ends without any of these was cut short: [`ModelError::Protocol`].
//! - Usage: `promptTokenCount` (cached tokens included) is the input; `candidatesTokenCount`
//!   excludes thoughts, so the output is candidates plus `thoughtsTokenCount`, which is also
//!   the reasoning count; `cachedContentTokenCount` is the cache read.

use serde::Deserialize;
use serde_json::{Value, value::RawValue};
use sha2::{Digest, Sha256};

use crate::model::{FinishReason, ModelError, ModelEvent, Part, ToolCallRequest, Usage};
use crate::models::{
    http::{describe_error, excerpt, send::is_context_overflow},
    sse::SseEvent,
};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk {
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    response_id: Option<String>,
    #[serde(default)]
    candidates: Option<Vec<Candidate>>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    usage_metadata: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    finish_message: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Content {
    #[serde(default)]
    parts: Option<Vec<WirePart>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: Option<bool>,
    #[serde(default)]
    thought_signature: Option<String>,
    #[serde(default)]
    function_call: Option<FunctionCall>,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    #[serde(default)]
    name: Option<String>,
    /// Kept as the bytes Gemini sent, so the argument text (and the id derived from it) is
    /// exactly the wire's.
    #[serde(default)]
    args: Option<Box<RawValue>>,
    #[serde(default)]
    id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    prompt_token_count: Option<u64>,
    #[serde(default)]
    candidates_token_count: Option<u64>,
    #[serde(default)]
    thoughts_token_count: Option<u64>,
    #[serde(default)]
    cached_content_token_count: Option<u64>,
}

/// Turns chunks into events; see the [module docs](self).
#[derive(Debug)]
pub(super) struct Assembler {
    /// Where the turn stands in the run (the request's transcript length), for call ids.
    turn: usize,
    /// Calls emitted so far.
    calls: usize,
    /// Answer text streamed since the last part event: the text part still open. Mirrors what
    /// the runtime holds, so a [`Part::Text`] replaces exactly this.
    text: String,
    /// Thought text not yet closed into a part (`Some` once a thought piece arrived).
    reasoning: Option<String>,
    /// The last `finishReason` seen, with its `finishMessage`.
    finish: Option<(String, Option<String>)>,
    /// `promptFeedback.blockReason`.
    blocked: Option<String>,
    usage: Option<Usage>,
}

impl Assembler {
    pub(super) fn new(turn: usize) -> Self {
        Self { turn, calls: 0, text: String::new(), reasoning: None, finish: None, blocked: None, usage: None }
    }

    pub(super) fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, ModelError> {
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(Vec::new());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!("invalid chunk in the event stream ({e}): {}", excerpt(data, 500)))
        })?;
        self.on_chunk(chunk)
    }

    fn on_chunk(&mut self, chunk: Chunk) -> Result<Vec<ModelEvent>, ModelError> {
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(stream_error(&error));
        }
        crate::trace::report_response(chunk.model_version.as_deref(), chunk.response_id.as_deref());
        if let Some(usage) = chunk.usage_metadata {
            let thoughts = usage.thoughts_token_count.unwrap_or(0);
            self.usage = Some(Usage {
                input_tokens: usage.prompt_token_count.unwrap_or(0),
                output_tokens: usage.candidates_token_count.unwrap_or(0) + thoughts,
                cache_read_tokens: usage.cached_content_token_count.unwrap_or(0),
                cache_write_tokens: 0,
                reasoning_tokens: thoughts,
            });
        }
        if let Some(reason) = chunk.prompt_feedback.and_then(|f| f.block_reason) {
            self.blocked = Some(reason);
        }
        let mut out = Vec::new();
        // Only one candidate is asked for (`candidateCount` is never sent); others are ignored.
        for candidate in chunk.candidates.unwrap_or_default().into_iter().filter(|c| c.index.unwrap_or(0) == 0) {
            for part in candidate.content.and_then(|c| c.parts).unwrap_or_default() {
                self.on_part(part, &mut out)?;
            }
            if let Some(reason) = candidate.finish_reason.filter(|r| !r.is_empty()) {
                self.finish = Some((reason, candidate.finish_message));
            }
        }
        Ok(out)
    }

    fn on_part(&mut self, part: WirePart, out: &mut Vec<ModelEvent>) -> Result<(), ModelError> {
        let signature = part.thought_signature.filter(|s| !s.is_empty());
        if let Some(call) = part.function_call {
            self.close_reasoning(None, out);
            return self.on_call(call, signature, out);
        }
        let text = part.text.unwrap_or_default();
        if part.thought == Some(true) {
            let reasoning = self.reasoning.get_or_insert_with(String::new);
            if !text.is_empty() {
                reasoning.push_str(&text);
                out.push(ModelEvent::ReasoningDelta { delta: text });
            }
            if signature.is_some() {
                self.close_reasoning(signature, out);
            }
            return Ok(());
        }
        // Answer text, or a signature-only part: either way the thought before it is over.
        self.close_reasoning(None, out);
        if !text.is_empty() {
            self.text.push_str(&text);
            out.push(ModelEvent::TextDelta { delta: text });
        }
        if let Some(signature) = signature {
            let part = if self.text.is_empty() {
                Part::Reasoning {
                    text: String::new(),
                    summary: Vec::new(),
                    signature: Some(signature),
                    encrypted: None,
                    id: None,
                }
            } else {
                Part::Text { text: self.text.clone(), signature: Some(signature), id: None }
            };
            self.emit(part, out);
        }
        Ok(())
    }

    fn on_call(
        &mut self,
        call: FunctionCall,
        signature: Option<String>,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        let index = self.calls;
        let name = call
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ModelError::Protocol(format!("function call {index} has no name")))?;
        let arguments = match call.args {
            Some(raw) if raw.get() != "null" => raw.get().to_owned(),
            _ => "{}".to_owned(),
        };
        let provider_id = call.id.filter(|id| !id.is_empty());
        let call_id = provider_id.clone().unwrap_or_else(|| derived_id(self.turn, index, &name, &arguments));
        self.calls += 1;
        let request = ToolCallRequest { call_id: call_id.into(), name: name.into(), arguments };
        if signature.is_none() && provider_id.is_none() {
            self.text.clear();
            out.push(ModelEvent::ToolCall(request));
        } else {
            self.emit(Part::ToolCall { call: request, signature, id: provider_id }, out);
        }
        Ok(())
    }

    /// Closes the open thought into a part (when it holds text or a signature).
    fn close_reasoning(&mut self, signature: Option<String>, out: &mut Vec<ModelEvent>) {
        let text = self.reasoning.take().unwrap_or_default();
        if !text.is_empty() || signature.is_some() {
            self.emit(Part::Reasoning { text, summary: Vec::new(), signature, encrypted: None, id: None }, out);
        }
    }

    /// A part event: the runtime closes (or, for a [`Part::Text`], replaces) the open text.
    fn emit(&mut self, part: Part, out: &mut Vec<ModelEvent>) {
        self.text.clear();
        out.push(ModelEvent::Part { part });
    }

    /// The end of the answer: the open thought, and the [`ModelEvent::Finish`] decided from
    /// the last finish reason (or a typed error).
    pub(super) fn end(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        let mut out = Vec::new();
        self.close_reasoning(None, &mut out);
        let reason = match self.finish.take() {
            Some((reason, message)) => finish_reason(&reason, message.as_deref())?,
            None if self.blocked.is_some() => FinishReason::ContentFilter,
            None => {
                return Err(ModelError::Protocol(
                    "the response ended without a finishReason (truncated response)".into(),
                ));
            }
        };
        let reason = match reason {
            // Gemini says STOP on a function-call turn; the model is waiting for results.
            FinishReason::Stop if self.calls > 0 => FinishReason::ToolCalls,
            other => other,
        };
        out.push(ModelEvent::Finish { reason, usage: self.usage.unwrap_or_default() });
        Ok(out)
    }
}

/// The events of a whole JSON answer: a `GenerateContentResponse` (`:generateContent`), or an
/// array of them (`:streamGenerateContent` without `alt=sse`).
pub(super) fn whole_body(body: &[u8], turn: usize) -> Result<Vec<ModelEvent>, ModelError> {
    let invalid = |e: serde_json::Error| {
        ModelError::Protocol(format!(
            "invalid response JSON ({e}): {}",
            excerpt(&String::from_utf8_lossy(&body[..body.len().min(2000)]), 500)
        ))
    };
    // Not an untagged enum: serde's buffering for those cannot hold the raw `args`.
    let chunks: Vec<Chunk> = if body.trim_ascii_start().starts_with(b"[") {
        serde_json::from_slice(body).map_err(invalid)?
    } else {
        vec![serde_json::from_slice(body).map_err(invalid)?]
    };
    let mut assembler = Assembler::new(turn);
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(assembler.on_chunk(chunk)?);
    }
    events.extend(assembler.end()?);
    Ok(events)
}

/// The id of a call Gemini gave none: stable for the same response at the same place in the
/// run, distinct for another call.
fn derived_id(turn: usize, index: usize, name: &str, arguments: &str) -> String {
    let mut hash = Sha256::new();
    hash.update((turn as u64).to_be_bytes());
    hash.update((index as u64).to_be_bytes());
    hash.update(name.as_bytes());
    hash.update([0]);
    hash.update(arguments.as_bytes());
    let digest = hash.finalize();
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("gemini-call-{index}-{hex}")
}

fn finish_reason(reason: &str, message: Option<&str>) -> Result<FinishReason, ModelError> {
    Ok(match reason {
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => FinishReason::ContentFilter,
        "MALFORMED_FUNCTION_CALL"
        | "UNEXPECTED_TOOL_CALL"
        | "TOO_MANY_TOOL_CALLS"
        | "MISSING_THOUGHT_SIGNATURE"
        | "MALFORMED_RESPONSE" => {
            let detail = message.filter(|m| !m.is_empty()).map(|m| format!(": {}", excerpt(m, 2000)));
            return Err(ModelError::Provider(format!("Gemini stopped with {reason}{}", detail.unwrap_or_default())));
        }
        other => FinishReason::Other(other.to_owned()),
    })
}

/// An `{"error": {code, message, status}}` inside a 200 answer, typed like an HTTP one.
fn stream_error(error: &Value) -> ModelError {
    let message = describe_error(error);
    let status = error.get("status").and_then(Value::as_str);
    let code = error.get("code").and_then(Value::as_u64);
    match (status, code) {
        (Some("UNAVAILABLE"), _) | (_, Some(503)) => ModelError::Overloaded(message),
        (Some("RESOURCE_EXHAUSTED"), _) | (_, Some(429)) => ModelError::RateLimited { attempts: 1, message },
        _ if is_context_overflow(&message) => ModelError::ContextWindowExceeded(message),
        _ => ModelError::Provider(message),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run(chunks: &[Value], turn: usize) -> Result<Vec<ModelEvent>, ModelError> {
        let mut assembler = Assembler::new(turn);
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(assembler.on_event(&SseEvent { event: None, data: chunk.to_string() })?);
        }
        out.extend(assembler.end()?);
        Ok(out)
    }

    fn parts(parts: Value) -> Value {
        json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}]})
    }

    #[test]
    fn call_ids_are_derived_stable_and_distinct() {
        let call = |args: Value| json!({"functionCall": {"name": "lookup", "args": args}});
        let chunks = [
            parts(json!([call(json!({"order": "A-1"})), call(json!({"order": "A-1"}))])),
            json!({"candidates": [{"finishReason": "STOP", "index": 0}]}),
        ];
        let ids = |turn| -> Vec<String> {
            run(&chunks, turn)
                .unwrap()
                .into_iter()
                .filter_map(|e| match e {
                    ModelEvent::ToolCall(c) => Some(c.call_id.to_string()),
                    _ => None,
                })
                .collect()
        };
        let first = ids(3);
        assert_eq!(first, ids(3), "the same response parsed twice gives the same ids");
        assert_eq!(first.len(), 2);
        assert_ne!(first[0], first[1], "the same call twice in one response");
        assert!(first[0].starts_with("gemini-call-0-") && first[1].starts_with("gemini-call-1-"), "{first:?}");
        assert!(first.iter().all(|id| id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')));
        let later = ids(5);
        assert!(first.iter().all(|id| !later.contains(id)), "another turn of the run gets other ids");
    }

    #[test]
    fn finish_reasons() {
        let text = parts(json!([{"text": "Hi"}]));
        for (wire, want) in [
            ("STOP", Ok(FinishReason::Stop)),
            ("MAX_TOKENS", Ok(FinishReason::Length)),
            ("SAFETY", Ok(FinishReason::ContentFilter)),
            ("RECITATION", Ok(FinishReason::ContentFilter)),
            ("PROHIBITED_CONTENT", Ok(FinishReason::ContentFilter)),
            ("BLOCKLIST", Ok(FinishReason::ContentFilter)),
            ("SPII", Ok(FinishReason::ContentFilter)),
            ("LANGUAGE", Ok(FinishReason::Other("LANGUAGE".into()))),
            ("OTHER", Ok(FinishReason::Other("OTHER".into()))),
            ("MALFORMED_FUNCTION_CALL", Err("MALFORMED_FUNCTION_CALL: bad call")),
            ("UNEXPECTED_TOOL_CALL", Err("UNEXPECTED_TOOL_CALL: bad call")),
            ("TOO_MANY_TOOL_CALLS", Err("TOO_MANY_TOOL_CALLS: bad call")),
        ] {
            let end = json!({"candidates": [{"finishReason": wire, "finishMessage": "bad call", "index": 0}]});
            let got = run(&[text.clone(), end], 0).map(|e| e.last().cloned());
            match (got, want) {
                (Ok(Some(ModelEvent::Finish { reason, .. })), Ok(want)) => assert_eq!(reason, want, "{wire}"),
                (Err(ModelError::Provider(m)), Err(want)) => assert!(m.contains(want), "{wire}: {m}"),
                (got, _) => panic!("{wire}: {got:?}"),
            }
        }
    }

    #[test]
    fn in_stream_errors_are_typed() {
        let error = |code: u64, status: &str, message: &str| json!({"error": {"code": code, "message": message, "status": status}});
        let cases = [
            (error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."), "overloaded"),
            (error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."), "rate"),
            (
                error(
                    400,
                    "INVALID_ARGUMENT",
                    "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
                ),
                "context",
            ),
            (error(500, "INTERNAL", "An internal error has occurred."), "provider"),
        ];
        for (chunk, kind) in cases {
            let err = run(&[chunk], 0).unwrap_err();
            let ok = match kind {
                "overloaded" => matches!(err, ModelError::Overloaded(_)),
                "rate" => matches!(err, ModelError::RateLimited { .. }),
                "context" => matches!(err, ModelError::ContextWindowExceeded(_)),
                _ => matches!(&err, ModelError::Provider(m) if m.contains("INTERNAL")),
            };
            assert!(ok, "{kind}: {err:?}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// One wire part of a response.
    #[derive(Debug, Clone)]
    enum Piece {
        Thought(String),
        Text(String),
        /// Text (possibly empty) with a signature.
        Signed(String, String),
        Call {
            name: String,
            args: Value,
            id: Option<String>,
            signature: Option<String>,
        },
    }

    impl Piece {
        fn wire(&self) -> Value {
            match self {
                Self::Thought(t) => json!({"text": t, "thought": true}),
                Self::Text(t) => json!({"text": t}),
                Self::Signed(t, s) => json!({"text": t, "thoughtSignature": s}),
                Self::Call { name, args, id, signature } => {
                    let mut call = json!({"functionCall": {"name": name, "args": args}});
                    if let Some(id) = id {
                        call["functionCall"]["id"] = json!(id);
                    }
                    if let Some(s) = signature {
                        call["thoughtSignature"] = json!(s);
                    }
                    call
                }
            }
        }
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            "(?s).{1,6}".prop_map(Piece::Thought),
            "(?s).{1,6}".prop_map(Piece::Text),
            ("(?s).{0,4}", "[A-Za-z0-9+/]{4,12}=?").prop_map(|(t, s)| Piece::Signed(t, s)),
            (
                "[a-z_]{1,6}",
                crate::strategies::json_value(),
                proptest::option::of("fc_[a-z0-9]{4}"),
                proptest::option::of("[A-Za-z0-9+/]{4,12}")
            )
                .prop_map(|(name, v, id, signature)| Piece::Call {
                    name,
                    args: json!({"v": v}),
                    id,
                    signature
                }),
        ]
    }

    /// What the runtime makes of the events (`model_step`): the turn's parts.
    fn assemble(events: &[ModelEvent]) -> Vec<Part> {
        let mut parts = Vec::new();
        let mut open = String::new();
        let close = |parts: &mut Vec<Part>, open: &mut String| {
            if !open.is_empty() {
                parts.push(Part::text(std::mem::take(open)));
            }
        };
        for event in events {
            match event {
                ModelEvent::TextDelta { delta } => open.push_str(delta),
                ModelEvent::ReasoningDelta { .. } | ModelEvent::Finish { .. } => {}
                ModelEvent::ToolCall(call) => {
                    close(&mut parts, &mut open);
                    parts.push(Part::call(call.clone()));
                }
                ModelEvent::Part { part } => {
                    if matches!(part, Part::Text { .. }) {
                        open.clear();
                    } else {
                        close(&mut parts, &mut open);
                    }
                    parts.push(part.clone());
                }
            }
        }
        close(&mut parts, &mut open);
        parts
    }

    fn chunks(pieces: &[Piece], cuts: &[usize]) -> Vec<Value> {
        let mut chunks = Vec::new();
        let mut rest: &[Piece] = pieces;
        for &cut in cuts {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at(cut.clamp(1, rest.len()));
            chunks.push(json!({"candidates": [{"content": {"role": "model", "parts": now.iter().map(Piece::wire).collect::<Vec<_>>()}, "index": 0}]}));
            rest = later;
        }
        if !rest.is_empty() {
            chunks.push(json!({"candidates": [{"content": {"role": "model", "parts": rest.iter().map(Piece::wire).collect::<Vec<_>>()}, "index": 0}]}));
        }
        chunks.push(json!({"candidates": [{"finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 3}}));
        chunks
    }

    fn events(chunks: &[Value]) -> Vec<ModelEvent> {
        let mut assembler = Assembler::new(7);
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend(assembler.on_event(&SseEvent { event: None, data: chunk.to_string() }).unwrap());
        }
        out.extend(assembler.end().unwrap());
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// However the parts are spread over chunks: the same events; all text and thought text
        /// as sent; every signature exactly once, in order, on a part of the kind it came with;
        /// calls in order with unique ids (Gemini's where given); the finish says tool calls
        /// when there were calls.
        #[test]
        fn parts_survive_any_chunking(pieces in proptest::collection::vec(piece(), 0..10), cuts in proptest::collection::vec(1usize..4, 0..10)) {
            let one_chunk = events(&chunks(&pieces, &[]));
            let got = events(&chunks(&pieces, &cuts));
            prop_assert_eq!(&got, &one_chunk);

            let parts = assemble(&got);
            let text: String = parts.iter().filter_map(|p| match p { Part::Text { text, .. } => Some(text.as_str()), _ => None }).collect();
            let sent_text: String = pieces.iter().filter_map(|p| match p { Piece::Text(t) | Piece::Signed(t, _) => Some(t.as_str()), _ => None }).collect();
            prop_assert_eq!(text, sent_text);
            let thoughts: String = parts.iter().filter_map(|p| match p { Part::Reasoning { text, .. } => Some(text.as_str()), _ => None }).collect();
            let sent_thoughts: String = pieces.iter().filter_map(|p| match p { Piece::Thought(t) => Some(t.as_str()), _ => None }).collect();
            prop_assert_eq!(thoughts, sent_thoughts);

            let signatures: Vec<(bool, &str)> = parts.iter().filter_map(|p| match p {
                Part::ToolCall { signature: Some(s), .. } => Some((true, s.as_str())),
                Part::Text { signature: Some(s), .. } | Part::Reasoning { signature: Some(s), .. } => Some((false, s.as_str())),
                _ => None,
            }).collect();
            let sent_signatures: Vec<(bool, &str)> = pieces.iter().filter_map(|p| match p {
                Piece::Call { signature: Some(s), .. } => Some((true, s.as_str())),
                Piece::Signed(_, s) => Some((false, s.as_str())),
                _ => None,
            }).collect();
            prop_assert_eq!(signatures, sent_signatures);

            let calls: Vec<(&str, Option<&str>, Option<&str>)> = parts.iter().filter_map(|p| match p {
                Part::ToolCall { call, id, .. } => Some((call.call_id.as_str(), id.as_deref(), None)),
                _ => None,
            }).collect();
            let sent_calls: Vec<Option<&str>> = pieces.iter().filter_map(|p| match p { Piece::Call { id, .. } => Some(id.as_deref()), _ => None }).collect();
            prop_assert_eq!(calls.len(), sent_calls.len());
            for ((call_id, id, _), sent) in calls.iter().zip(&sent_calls) {
                prop_assert_eq!(*id, *sent);
                if let Some(sent) = sent { prop_assert_eq!(*call_id, *sent); }
            }
            let derived: Vec<&str> = calls.iter().filter(|(_, id, _)| id.is_none()).map(|(c, _, _)| *c).collect();
            let mut unique = derived.clone();
            unique.sort_unstable();
            unique.dedup();
            prop_assert_eq!(unique.len(), derived.len());

            let reason = if sent_calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
            prop_assert_eq!(got.last(), Some(&ModelEvent::Finish { reason, usage: Usage { input_tokens: 10, output_tokens: 7, reasoning_tokens: 3, ..Usage::default() } }));
        }

        /// Arbitrary payloads (JSON-ish or not): events or a typed error, never a panic.
        #[test]
        fn arbitrary_payloads_never_panic(data in proptest::collection::vec(prop_oneof![
            "(?s).{0,24}",
            crate::strategies::json_value().prop_map(|v| json!({"candidates": [{"content": {"parts": [v]}}]}).to_string()),
            crate::strategies::json_value().prop_map(|v| json!({"candidates": [v], "usageMetadata": v, "error": v}).to_string()),
            crate::strategies::json_value().prop_map(|v| json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": v}, "thoughtSignature": "s"}]}, "finishReason": "STOP"}]}).to_string()),
        ], 0..6)) {
            let mut assembler = Assembler::new(0);
            for d in &data {
                if assembler.on_event(&SseEvent { event: None, data: d.clone() }).is_err() {
                    break;
                }
            }
            let _ = assembler.end();
            let _ = whole_body(data.concat().as_bytes(), 0);
        }
    }
}
