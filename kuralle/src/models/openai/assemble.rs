//! OpenAI chat-completion chunks → [`ModelEvent`]s: text at once, tool-call fragments gathered
//! by `index` until the finish, reasoning (`reasoning_content` of DeepSeek, `reasoning` of
//! OpenRouter and vLLM) as deltas and then one part, and Gemini's thought signatures
//! (`extra_content.google.thought_signature`) kept on their calls.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::model::{FinishReason, ModelError, ModelEvent, Part, ToolCallRequest, Usage};
use crate::models::{
    http::{describe_error, excerpt},
    sse::SseEvent,
};

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

/// A non-streamed `chat.completion`: choices carry a whole `message` instead of a `delta`.
#[derive(Debug, Deserialize)]
struct Completion {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<CompletionChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionChoice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    message: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    /// DeepSeek's thinking text.
    #[serde(default)]
    reasoning_content: Option<String>,
    /// The same, as OpenRouter and vLLM name it.
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
    /// Gemini's OpenAI-compatible endpoint: `{"google": {"thought_signature": ".."}}`.
    #[serde(default)]
    extra_content: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    /// A string fragment; a server that sends a whole JSON object instead gets it re-encoded.
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
    #[serde(default)]
    completion_tokens_details: Option<Details>,
}

#[derive(Debug, Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
    signature: Option<String>,
}

/// Turns chunks into events: text at once, tool calls gathered by `index` until the finish.
#[derive(Debug, Default)]
pub(super) struct Assembler {
    calls: BTreeMap<usize, PartialCall>,
    last_index: Option<usize>,
    emitted_calls: bool,
    /// Reasoning text not yet closed into a part.
    reasoning: String,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// A `refusal` arrived (kept as text): the response finishes with `Refusal`.
    refused: bool,
    /// `data: [DONE]` arrived.
    pub(super) done: bool,
}

impl Assembler {
    pub(super) fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, ModelError> {
        let data = event.data.trim();
        if event.event.as_deref() == Some("error") {
            let message = serde_json::from_str::<Value>(data)
                .map(|v| describe_error(v.get("error").unwrap_or(&v)))
                .unwrap_or_else(|_| excerpt(data, 2000));
            return Err(ModelError::Provider(message));
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| {
            ModelError::Protocol(format!("invalid chunk in the event stream ({e}): {}", excerpt(data, 500)))
        })?;
        self.on_chunk(chunk)
    }

    /// A whole non-streamed `chat.completion` body: its message is one delta.
    pub(super) fn on_completion(&mut self, body: &[u8]) -> Result<Vec<ModelEvent>, ModelError> {
        let completion: Completion = serde_json::from_slice(body).map_err(|e| {
            ModelError::Protocol(format!(
                "invalid completion JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(&body[..body.len().min(2000)]), 500)
            ))
        })?;
        let Some(choices) = completion.choices else {
            if let Some(error) = completion.error.filter(|e| !e.is_null()) {
                return Err(ModelError::Provider(describe_error(&error)));
            }
            return Err(ModelError::Protocol("a completion without choices".into()));
        };
        let choices = choices
            .into_iter()
            .map(|c| Choice { index: c.index, delta: c.message, finish_reason: c.finish_reason })
            .collect::<Vec<_>>();
        if choices.is_empty() {
            return Err(ModelError::Protocol("a completion without choices".into()));
        }
        self.on_chunk(Chunk {
            id: completion.id,
            model: completion.model,
            choices: Some(choices),
            usage: completion.usage,
            error: completion.error,
        })
    }

    fn on_chunk(&mut self, chunk: Chunk) -> Result<Vec<ModelEvent>, ModelError> {
        if let Some(error) = chunk.error.filter(|e| !e.is_null()) {
            return Err(ModelError::Provider(describe_error(&error)));
        }
        crate::trace::report_response(chunk.model.as_deref(), chunk.id.as_deref());
        if let Some(usage) = chunk.usage {
            self.usage = Some(Usage {
                input_tokens: usage.prompt_tokens.unwrap_or(0),
                output_tokens: usage.completion_tokens.unwrap_or(0),
                cache_read_tokens: usage.prompt_tokens_details.as_ref().and_then(|d| d.cached_tokens).unwrap_or(0),
                cache_write_tokens: 0,
                reasoning_tokens: usage
                    .completion_tokens_details
                    .as_ref()
                    .and_then(|d| d.reasoning_tokens)
                    .unwrap_or(0),
            });
        }
        let mut out = Vec::new();
        // Only the first choice is requested (`n` is never sent); others are ignored.
        for choice in chunk.choices.unwrap_or_default().into_iter().filter(|c| c.index.unwrap_or(0) == 0) {
            if let Some(delta) = choice.delta {
                for thinking in [delta.reasoning_content, delta.reasoning].into_iter().flatten() {
                    if !thinking.is_empty() {
                        self.reasoning.push_str(&thinking);
                        out.push(ModelEvent::ReasoningDelta { delta: thinking });
                    }
                }
                self.refused |= delta.refusal.as_ref().is_some_and(|r| !r.is_empty());
                for text in [delta.content, delta.refusal].into_iter().flatten() {
                    if !text.is_empty() {
                        self.close_reasoning(&mut out);
                        out.push(ModelEvent::TextDelta { delta: text });
                    }
                }
                for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    self.merge(position, call);
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(finish_reason(&reason));
                out.extend(self.flush_calls()?);
            }
        }
        Ok(out)
    }

    /// Adds one tool-call fragment. OpenAI sends `index` on every fragment and `id`/`name` on the
    /// first; servers that omit `index` are matched by `id`, else by the last call touched.
    fn merge(&mut self, position: usize, call: ToolCallDelta) {
        let index = call.index.unwrap_or_else(|| match &call.id {
            Some(id) => self
                .calls
                .iter()
                .find(|(_, c)| c.id.as_deref() == Some(id))
                .map(|(i, _)| *i)
                .unwrap_or_else(|| self.calls.keys().next_back().map_or(position, |last| last.saturating_add(1))),
            None => self.last_index.unwrap_or(position),
        });
        self.last_index = Some(index);
        let entry = self.calls.entry(index).or_default();
        if let Some(id) = call.id.filter(|id| !id.is_empty()) {
            entry.id.get_or_insert(id);
        }
        if let Some(signature) =
            call.extra_content.as_ref().and_then(|e| e.pointer("/google/thought_signature")).and_then(Value::as_str)
        {
            entry.signature.get_or_insert_with(|| signature.to_owned());
        }
        if let Some(function) = call.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty())
                && entry.name.is_empty()
            {
                entry.name = name;
            }
            match function.arguments {
                Some(Value::String(fragment)) => entry.arguments.push_str(&fragment),
                Some(Value::Null) | None => {}
                Some(other) => entry.arguments.push_str(&other.to_string()),
            }
        }
    }

    /// The reasoning streamed so far, as one part that goes back with the turn.
    fn close_reasoning(&mut self, out: &mut Vec<ModelEvent>) {
        if !self.reasoning.is_empty() {
            let text = std::mem::take(&mut self.reasoning);
            out.push(ModelEvent::Part {
                part: Part::Reasoning { text, summary: Vec::new(), signature: None, encrypted: None, id: None },
            });
        }
    }

    /// The gathered tool calls, in `index` order.
    fn flush_calls(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        let calls = std::mem::take(&mut self.calls);
        self.last_index = None;
        let mut out = Vec::with_capacity(calls.len() + 1);
        self.close_reasoning(&mut out);
        for (index, call) in calls {
            if call.name.is_empty() {
                return Err(ModelError::Protocol(format!("tool call at index {index} has no function name")));
            }
            self.emitted_calls = true;
            let request = ToolCallRequest {
                call_id: call.id.unwrap_or_else(|| format!("call_{index}")).into(),
                name: call.name.into(),
                arguments: call.arguments,
            };
            out.push(match call.signature {
                Some(signature) => {
                    ModelEvent::Part { part: Part::ToolCall { call: request, signature: Some(signature), id: None } }
                }
                None => ModelEvent::ToolCall(request),
            });
        }
        Ok(out)
    }

    /// The end of the stream: pending tool calls and the [`ModelEvent::Finish`], or a protocol
    /// error when the response was cut short (neither a finish reason nor `[DONE]` arrived).
    pub(super) fn end(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        if !self.done && self.finish.is_none() {
            return Err(ModelError::Protocol(
                "the event stream ended without a finish_reason or [DONE] (truncated response)".into(),
            ));
        }
        let mut out = self.flush_calls()?;
        let reason = match self.finish.take() {
            // Some servers report `stop` after tool calls; the model is waiting for results.
            Some(FinishReason::Stop) | None if self.emitted_calls => FinishReason::ToolCalls,
            // A refusal is text the model gave instead of an answer.
            Some(FinishReason::Stop) | None if self.refused => FinishReason::Refusal,
            Some(reason) => reason,
            None => FinishReason::Stop,
        };
        out.push(ModelEvent::Finish { reason, usage: self.usage.unwrap_or_default() });
        Ok(out)
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::models::assemble_events;

    /// A streamed response: per call an id, a name and its argument text cut into fragments;
    /// the order in which the calls' fragments are interleaved; and text pieces.
    /// `(id, name, argument fragments)` of one call.
    type Call = (String, String, Vec<String>);

    fn response() -> impl Strategy<Value = (Vec<Call>, Vec<usize>, Vec<String>)> {
        let call = ("call_[a-zA-Z0-9]{1,8}", "[a-z_]{1,8}", proptest::collection::vec("(?s).{0,6}", 0..5));
        (proptest::collection::vec(call, 0..4), proptest::collection::vec("(?s).{1,5}", 0..4)).prop_flat_map(
            |(calls, text)| {
                let order: Vec<usize> =
                    calls.iter().enumerate().flat_map(|(i, (_, _, f))| std::iter::repeat_n(i, f.len())).collect();
                (Just(calls), Just(order).prop_shuffle(), Just(text))
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// However the fragments interleave, each call comes out once, in index order, with its
        /// fragments joined unchanged; text comes out as sent; the finish says tool calls.
        #[test]
        fn interleaved_fragments_assemble_into_whole_calls((calls, order, text) in response()) {
            let mut data = vec![json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}).to_string()];
            for (i, (id, name, _)) in calls.iter().enumerate() {
                data.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}
                ]}}]}).to_string());
            }
            let mut next = vec![0usize; calls.len()];
            for (step, &i) in order.iter().enumerate() {
                let fragment = &calls[i].2[next[i]];
                next[i] += 1;
                data.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": i, "function": {"arguments": fragment}}
                ]}}]}).to_string());
                if let Some(t) = text.get(step) {
                    data.push(json!({"choices": [{"index": 0, "delta": {"content": t}}]}).to_string());
                }
            }
            let finish = if calls.is_empty() { "stop" } else { "tool_calls" };
            data.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}).to_string());
            data.push(json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}).to_string());
            data.push("[DONE]".to_owned());

            let events = assemble_events(data.iter().map(String::as_str)).unwrap();
            let got_calls: Vec<(String, String, String)> = events.iter().filter_map(|e| match e {
                ModelEvent::ToolCall(c) => Some((c.call_id.to_string(), c.name.to_string(), c.arguments.clone())),
                _ => None,
            }).collect();
            let want: Vec<(String, String, String)> =
                calls.iter().map(|(id, name, f)| (id.clone(), name.clone(), f.concat())).collect();
            prop_assert_eq!(got_calls, want);
            let got_text: String = events.iter().filter_map(|e| match e {
                ModelEvent::TextDelta { delta } => Some(delta.as_str()),
                _ => None,
            }).collect();
            let sent_text: String = text.iter().take(order.len()).map(String::as_str).collect();
            prop_assert_eq!(got_text, sent_text);
            let reason = if calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
            prop_assert_eq!(events.last(), Some(&ModelEvent::Finish { reason, usage: Usage { input_tokens: 3, output_tokens: 4, ..Usage::default() } }));
        }

        /// Arbitrary chunk payloads (JSON-ish or not): events or a typed error, never a panic.
        #[test]
        fn arbitrary_payloads_never_panic(data in proptest::collection::vec(prop_oneof![
            "(?s).{0,24}",
            crate::strategies::json_value().prop_map(|v| json!({"choices": [{"index": 0, "delta": {"tool_calls": [v]}}]}).to_string()),
            crate::strategies::json_value().prop_map(|v| json!({"choices": [v], "usage": v}).to_string()),
            (any::<u64>(), any::<Option<u64>>()).prop_map(|(i, j)| json!({"choices": [{"delta": {"tool_calls": [
                {"index": i, "function": {"name": "x", "arguments": "{"}}, {"index": j, "id": "a"}]}, "finish_reason": "length"}]}).to_string()),
        ], 0..6)) {
            let _ = assemble_events(data.iter().map(String::as_str));
        }
    }
}
