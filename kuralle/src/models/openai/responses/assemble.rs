//! Responses stream events → [`ModelEvent`]s.
//!
//! Text (`response.output_text.delta`, and a refusal's `response.refusal.delta`) and
//! reasoning (`response.reasoning_summary_text.delta`, `response.reasoning_text.delta`)
//! stream at once, for display. Each output item then comes out whole, with its provider
//! state, when `response.output_item.done` closes it: a `reasoning` item as
//! [`Part::Reasoning`] (summary, `encrypted_content`, id), a `message` as [`Part::Text`] with
//! its id (replacing the text streamed for it), a `function_call` as [`Part::ToolCall`] with
//! its item id beside the `call_id` the runtime dispatches by (its argument fragments are
//! gathered, not streamed). `response.completed` / `response.incomplete` end the response
//! with usage; `response.failed` and `error` events become typed errors.
//!
//! A refusal is kept as the turn's text and the response finishes with
//! [`FinishReason::Refusal`] (when it asks for no tool call): the refusal is what the model
//! answered, and it goes back as the assistant's text on a later request.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::model::{FinishReason, ModelError, ModelEvent, Part, ToolCallRequest, Usage};
use crate::models::{
    http::{describe_error, excerpt, send::is_context_overflow},
    sse::SseEvent,
};

/// One event of the stream, by its `type`. Events that carry nothing the turn keeps
/// (`response.created`, `response.in_progress`, `response.content_part.*`, the `*.done`
/// events whose text the item repeats, annotations, ...) are ignored.
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum WireEvent {
    #[serde(rename = "response.output_item.added")]
    ItemAdded(ItemEvent),
    #[serde(rename = "response.output_item.done")]
    ItemDone(ItemEvent),
    #[serde(rename = "response.output_text.delta")]
    TextDelta(Delta),
    #[serde(rename = "response.refusal.delta")]
    RefusalDelta(Delta),
    #[serde(rename = "response.reasoning_summary_part.added")]
    SummaryPartAdded(Delta),
    #[serde(rename = "response.reasoning_summary_text.delta")]
    SummaryDelta(Delta),
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta(Delta),
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta(Delta),
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone(Delta),
    #[serde(rename = "response.completed")]
    Completed(Terminal),
    #[serde(rename = "response.incomplete")]
    Incomplete(Terminal),
    #[serde(rename = "response.failed")]
    Failed(Terminal),
    #[serde(rename = "error")]
    Error(ErrorEvent),
    #[serde(other)]
    Ignored,
}

#[derive(Debug, Deserialize)]
struct ItemEvent {
    #[serde(default)]
    output_index: Option<u64>,
    item: Item,
}

/// The fields of the delta-like events (each has some of them).
#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    item_id: Option<String>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default)]
    summary_index: Option<usize>,
    #[serde(default)]
    delta: String,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Terminal {
    response: WireResponse,
}

/// An `error` event: `{code, message, param}`, or (some servers) `{error: {..}}`.
#[derive(Debug, Deserialize)]
struct ErrorEvent {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    param: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// The response object of a terminal event, or of a whole non-streamed answer.
#[derive(Debug, Deserialize)]
struct WireResponse {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    output: Option<Vec<Item>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    incomplete_details: Option<IncompleteDetails>,
}

#[derive(Debug, Deserialize)]
struct IncompleteDetails {
    #[serde(default)]
    reason: Option<String>,
}

/// An output item. Content and summary are read leniently (as JSON), so an item type this
/// client does not know never fails the stream.
#[derive(Debug, Deserialize)]
struct Item {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    summary: Option<Value>,
    #[serde(default)]
    encrypted_content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<Details>,
    #[serde(default)]
    output_tokens_details: Option<Details>,
}

#[derive(Debug, Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// What the deltas of one open item have said so far; the item's `done` event usually
/// repeats it whole, and wins. A message's text is not kept here: the runtime gathers the
/// streamed text itself, and holding a second copy would double what a long answer costs.
#[derive(Debug, Default)]
struct Pending {
    kind: String,
    id: Option<String>,
    call_id: Option<String>,
    name: Option<String>,
    arguments: String,
    reasoning: String,
    summary: Vec<String>,
}

impl Pending {
    fn new(item: &Item) -> Self {
        let arguments = match &item.arguments {
            Some(Value::String(s)) => s.clone(),
            _ => String::new(),
        };
        Self {
            kind: item.kind.clone(),
            id: item.id.clone(),
            call_id: item.call_id.clone(),
            name: item.name.clone(),
            arguments,
            ..Self::default()
        }
    }
}

/// Turns the stream's events into [`ModelEvent`]s; see the [module docs](self).
#[derive(Debug, Default)]
pub(super) struct Assembler {
    /// Items opened by `output_item.added` and not yet closed, by output index.
    pending: BTreeMap<u64, Pending>,
    /// Output indexes closed by `output_item.done`.
    closed: BTreeSet<u64>,
    /// The index given to the next item that arrives without an `output_index`.
    next_index: u64,
    /// The item the last `output_item.added` opened (for deltas that name none).
    last_index: Option<u64>,
    calls: usize,
    refusal: bool,
    /// A terminal event arrived; nothing after it is read.
    pub(super) done: bool,
}

impl Assembler {
    pub(super) fn on_event(&mut self, event: &SseEvent) -> Result<Vec<ModelEvent>, ModelError> {
        let data = event.data.trim();
        // The Responses API sends no `[DONE]`; a proxy translating another stream might.
        if data.is_empty() || data == "[DONE]" {
            return Ok(Vec::new());
        }
        let wire = match serde_json::from_str::<WireEvent>(data) {
            Ok(wire) => wire,
            Err(e) => self.untyped(event, data).ok_or_else(|| {
                ModelError::Protocol(format!("invalid event in the response stream ({e}): {}", excerpt(data, 500)))
            })?,
        };
        self.on_wire(wire)
    }

    /// An event whose data has no `type`, named by its SSE `event:` field instead.
    fn untyped(&self, event: &SseEvent, data: &str) -> Option<WireEvent> {
        let name = event.event.as_deref()?;
        let mut value: Value = serde_json::from_str(data).ok()?;
        let map = value.as_object_mut()?;
        if map.contains_key("type") {
            return None;
        }
        map.insert("type".into(), json!(name));
        serde_json::from_value(value).ok()
    }

    /// A whole (non-streamed) response object, as a server that ignored `stream: true` sends.
    pub(super) fn on_response_body(&mut self, body: &[u8]) -> Result<Vec<ModelEvent>, ModelError> {
        let response: WireResponse = serde_json::from_slice(body).map_err(|e| {
            ModelError::Protocol(format!(
                "invalid response JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(&body[..body.len().min(2000)]), 500)
            ))
        })?;
        match response.status.as_deref() {
            Some("completed") => self.on_wire(WireEvent::Completed(Terminal { response })),
            Some("incomplete") => self.on_wire(WireEvent::Incomplete(Terminal { response })),
            Some("failed") => self.on_wire(WireEvent::Failed(Terminal { response })),
            _ if response.error.as_ref().is_some_and(|e| !e.is_null()) => {
                Err(stream_error(response.error.as_ref().unwrap_or(&Value::Null)))
            }
            None if response.output.is_some() => self.on_wire(WireEvent::Completed(Terminal { response })),
            status => Err(ModelError::Protocol(format!(
                "the response is not finished (status {})",
                status.unwrap_or("missing")
            ))),
        }
    }

    fn on_wire(&mut self, wire: WireEvent) -> Result<Vec<ModelEvent>, ModelError> {
        let mut out = Vec::new();
        if let WireEvent::Completed(Terminal { response })
        | WireEvent::Incomplete(Terminal { response })
        | WireEvent::Failed(Terminal { response }) = &wire
        {
            crate::trace::report_response(response.model.as_deref(), response.id.as_deref());
        }
        match wire {
            WireEvent::ItemAdded(ItemEvent { output_index, item }) => {
                let index = output_index.unwrap_or(self.next_index);
                self.next_index = self.next_index.max(index.saturating_add(1));
                self.last_index = Some(index);
                self.pending.insert(index, Pending::new(&item));
            }
            WireEvent::ItemDone(ItemEvent { output_index, item }) => {
                let index = output_index.or_else(|| self.index_of(item.id.as_deref())).unwrap_or_else(|| {
                    let index = self.next_index;
                    self.next_index = index.saturating_add(1);
                    index
                });
                self.closed.insert(index);
                let pending = self.pending.remove(&index);
                out.extend(self.close(Some(item), pending)?);
            }
            WireEvent::TextDelta(d) | WireEvent::RefusalDelta(d) if d.delta.is_empty() => {}
            WireEvent::TextDelta(d) => out.push(ModelEvent::TextDelta { delta: d.delta }),
            WireEvent::RefusalDelta(d) => {
                self.refusal = true;
                out.push(ModelEvent::TextDelta { delta: d.delta });
            }
            WireEvent::SummaryPartAdded(d) => {
                // Summary parts are separate paragraphs; shown as such.
                if let Some(p) = self.open(&d) {
                    let had_text = p.summary.iter().any(|s| !s.is_empty());
                    summary_entry(&mut p.summary, d.summary_index);
                    if had_text {
                        out.push(ModelEvent::ReasoningDelta { delta: "\n\n".into() });
                    }
                }
            }
            WireEvent::SummaryDelta(d) => {
                if d.delta.is_empty() {
                    return Ok(out);
                }
                if let Some(p) = self.open(&d) {
                    summary_entry(&mut p.summary, d.summary_index).push_str(&d.delta);
                }
                out.push(ModelEvent::ReasoningDelta { delta: d.delta });
            }
            WireEvent::ReasoningTextDelta(d) => {
                if d.delta.is_empty() {
                    return Ok(out);
                }
                if let Some(p) = self.open(&d) {
                    p.reasoning.push_str(&d.delta);
                }
                out.push(ModelEvent::ReasoningDelta { delta: d.delta });
            }
            WireEvent::ArgumentsDelta(d) => {
                if let Some(p) = self.open(&d) {
                    p.arguments.push_str(&d.delta);
                }
            }
            WireEvent::ArgumentsDone(d) => {
                if let (Some(arguments), Some(p)) = (d.arguments.clone(), self.open(&d)) {
                    p.arguments = arguments;
                }
            }
            WireEvent::Completed(Terminal { response }) => {
                out.extend(self.close_all(response.output)?);
                let reason = if self.calls > 0 {
                    FinishReason::ToolCalls
                } else if self.refusal {
                    FinishReason::Refusal
                } else {
                    FinishReason::Stop
                };
                out.push(ModelEvent::Finish { reason, usage: usage(response.usage) });
                self.done = true;
            }
            WireEvent::Incomplete(Terminal { response }) => {
                out.extend(self.close_all(response.output)?);
                let reason = match response.incomplete_details.and_then(|d| d.reason).as_deref() {
                    Some("max_output_tokens") => FinishReason::Length,
                    Some("content_filter") => FinishReason::ContentFilter,
                    Some(other) => FinishReason::Other(other.to_owned()),
                    None => FinishReason::Other("incomplete".into()),
                };
                out.push(ModelEvent::Finish { reason, usage: usage(response.usage) });
                self.done = true;
            }
            WireEvent::Failed(Terminal { response }) => {
                self.done = true;
                return Err(match response.error.filter(|e| !e.is_null()) {
                    Some(error) => stream_error(&error),
                    None => ModelError::Provider("the response failed without an error message".into()),
                });
            }
            WireEvent::Error(event) => {
                self.done = true;
                let error = match event.error.filter(|e| !e.is_null()) {
                    Some(error) => error,
                    None => json!({"message": event.message, "code": event.code, "param": event.param}),
                };
                return Err(stream_error(&error));
            }
            WireEvent::Ignored => {}
        }
        Ok(out)
    }

    /// The end of the body. A stream that ends before a terminal event was cut short.
    pub(super) fn end(&self) -> Result<(), ModelError> {
        if self.done {
            Ok(())
        } else {
            Err(ModelError::Protocol("the event stream ended before response.completed (truncated response)".into()))
        }
    }

    fn index_of(&self, id: Option<&str>) -> Option<u64> {
        let id = id?;
        self.pending.iter().find(|(_, p)| p.id.as_deref() == Some(id)).map(|(i, _)| *i)
    }

    /// The open item a delta belongs to: by output index, else by item id, else the last
    /// one opened.
    fn open(&mut self, d: &Delta) -> Option<&mut Pending> {
        let index = d
            .output_index
            .filter(|i| self.pending.contains_key(i))
            .or_else(|| self.index_of(d.item_id.as_deref()))
            .or(self.last_index)?;
        self.pending.get_mut(&index)
    }

    /// At the end: the items of the response's `output` that no `output_item.done` closed,
    /// then whatever is still open, in output order.
    fn close_all(&mut self, output: Option<Vec<Item>>) -> Result<Vec<ModelEvent>, ModelError> {
        let mut out = Vec::new();
        for (index, item) in (0u64..).zip(output.unwrap_or_default()) {
            if self.closed.insert(index) {
                let pending = self.pending.remove(&index);
                out.extend(self.close(Some(item), pending)?);
            }
        }
        for (_, pending) in std::mem::take(&mut self.pending) {
            out.extend(self.close(None, Some(pending))?);
        }
        Ok(out)
    }

    /// One finished item as the part it becomes (`None` for items with nothing to keep, and
    /// for item types the client did not ask for).
    fn close(&mut self, item: Option<Item>, pending: Option<Pending>) -> Result<Option<ModelEvent>, ModelError> {
        let pending = pending.unwrap_or_default();
        let (kind, id) = match &item {
            Some(item) => (item.kind.as_str(), item.id.clone().or(pending.id.clone())),
            None => (pending.kind.as_str(), pending.id.clone()),
        };
        let id = id.filter(|id| !id.is_empty());
        match kind {
            "message" => {
                // Without content to read, the streamed text stays as the runtime gathered it
                // (a text part without the item id): an empty part would replace it.
                let Some((text, refusal)) = item.as_ref().and_then(|i| message_text(i.content.as_ref())) else {
                    return Ok(None);
                };
                self.refusal |= refusal;
                if id.is_none() && text.is_empty() {
                    return Ok(None);
                }
                Ok(Some(ModelEvent::Part { part: Part::Text { text, signature: None, id } }))
            }
            "reasoning" => {
                let text = item
                    .as_ref()
                    .and_then(|i| texts(i.content.as_ref(), "reasoning_text"))
                    .map(|t| t.concat())
                    .unwrap_or(pending.reasoning);
                let summary = item
                    .as_ref()
                    .and_then(|i| texts(i.summary.as_ref(), "summary_text"))
                    .unwrap_or_else(|| pending.summary.into_iter().filter(|s| !s.is_empty()).collect());
                let encrypted = item.and_then(|i| i.encrypted_content).filter(|e| !e.is_empty());
                if id.is_none() && encrypted.is_none() && text.is_empty() && summary.is_empty() {
                    return Ok(None);
                }
                Ok(Some(ModelEvent::Part { part: Part::Reasoning { text, summary, signature: None, encrypted, id } }))
            }
            "function_call" => {
                let (name, call_id, arguments) = match item {
                    Some(item) => (
                        item.name.filter(|n| !n.is_empty()).or(pending.name),
                        item.call_id.filter(|c| !c.is_empty()).or(pending.call_id),
                        match item.arguments {
                            Some(Value::String(s)) if !s.is_empty() => s,
                            Some(Value::String(_) | Value::Null) | None => pending.arguments,
                            // A server that sends the arguments as an object: re-encoded.
                            Some(other) => other.to_string(),
                        },
                    ),
                    None => (pending.name, pending.call_id, pending.arguments),
                };
                let Some(name) = name.filter(|n| !n.is_empty()) else {
                    return Err(ModelError::Protocol(format!(
                        "function call {} has no name",
                        id.as_deref().unwrap_or("without an id")
                    )));
                };
                self.calls += 1;
                // The runtime names a call without a call id itself; the item id is the
                // best stand-in when only that arrived.
                let call_id = call_id.or_else(|| id.clone()).unwrap_or_default();
                let call = ToolCallRequest { call_id: call_id.into(), name: name.into(), arguments };
                Ok(Some(match id {
                    Some(id) => ModelEvent::Part { part: Part::ToolCall { call, signature: None, id: Some(id) } },
                    None => ModelEvent::ToolCall(call),
                }))
            }
            _ => Ok(None),
        }
    }
}

/// The summary entry `index` names: an existing one, else a new one at the end. Never more
/// than one new entry per event, whatever index a server sends.
fn summary_entry(summary: &mut Vec<String>, index: Option<usize>) -> &mut String {
    let index = index.unwrap_or(0);
    if index >= summary.len() {
        summary.push(String::new());
        let last = summary.len() - 1;
        return &mut summary[last];
    }
    &mut summary[index]
}

/// A message's text (`output_text` and `refusal` parts, in order) and whether it refused;
/// `None` when the item carries no content to read.
fn message_text(content: Option<&Value>) -> Option<(String, bool)> {
    let parts = content?.as_array()?;
    if parts.is_empty() {
        return None;
    }
    let mut text = String::new();
    let mut refusal = false;
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("output_text") => text.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("refusal") => {
                refusal = true;
                text.push_str(part.get("refusal").and_then(Value::as_str).unwrap_or(""));
            }
            _ => {}
        }
    }
    Some((text, refusal))
}

/// The `text` of each entry of `kind` in a list (a reasoning item's summary or content);
/// `None` when there is no list.
fn texts(list: Option<&Value>, kind: &str) -> Option<Vec<String>> {
    let list = list?.as_array()?;
    Some(
        list.iter()
            .filter(|e| e.get("type").and_then(Value::as_str).is_none_or(|t| t == kind))
            .filter_map(|e| e.get("text").and_then(Value::as_str).map(str::to_owned))
            .collect(),
    )
}

fn usage(usage: Option<WireUsage>) -> Usage {
    let Some(usage) = usage else { return Usage::default() };
    Usage {
        input_tokens: usage.input_tokens.unwrap_or(0),
        output_tokens: usage.output_tokens.unwrap_or(0),
        cache_read_tokens: usage.input_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0),
        cache_write_tokens: 0,
        reasoning_tokens: usage.output_tokens_details.and_then(|d| d.reasoning_tokens).unwrap_or(0),
    }
}

/// The typed error for an error the stream reported (`response.failed`'s `response.error`,
/// or an `error` event): a rate limit or an overloaded server is worth asking again (the
/// client does, before anything was emitted); a prompt too long is not.
fn stream_error(error: &Value) -> ModelError {
    let code = error.get("code").and_then(Value::as_str).unwrap_or("");
    let message = describe_error(error);
    match code {
        "context_length_exceeded" => ModelError::ContextWindowExceeded(message),
        "rate_limit_exceeded" => ModelError::RateLimited { attempts: 1, message },
        "server_is_overloaded" | "overloaded" => ModelError::Overloaded(message),
        _ if is_context_overflow(&message) => ModelError::ContextWindowExceeded(message),
        _ if message.to_ascii_lowercase().contains("overloaded") => ModelError::Overloaded(message),
        _ => ModelError::Provider(message),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// Runs the assembler over `data` payloads, as the client does after parsing the stream.
    fn assemble(data: &[String]) -> Result<Vec<ModelEvent>, ModelError> {
        let mut assembler = Assembler::default();
        let mut out = Vec::new();
        for data in data {
            out.extend(assembler.on_event(&SseEvent { event: None, data: data.clone() })?);
            if assembler.done {
                return Ok(out);
            }
        }
        assembler.end()?;
        Ok(out)
    }

    fn completed(output: Value) -> String {
        json!({"type": "response.completed", "response": {"status": "completed", "output": output,
            "usage": {"input_tokens": 10, "output_tokens": 5}}})
        .to_string()
    }

    #[test]
    fn failures_are_typed() {
        let failed = |code: &str, message: &str| {
            json!({"type": "response.failed", "response": {"status": "failed", "error": {"code": code, "message": message}}})
                .to_string()
        };
        let cases = [
            (failed("context_length_exceeded", "Your input exceeds the context window."), "context"),
            (failed("rate_limit_exceeded", "Rate limit reached for o4-mini."), "rate"),
            (failed("server_error", "The server is overloaded."), "overloaded"),
            (failed("server_error", "An error occurred while processing your request."), "provider"),
            (
                json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null})
                    .to_string(),
                "rate",
            ),
            (
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}).to_string(),
                "provider",
            ),
        ];
        for (data, want) in cases {
            let got = assemble(std::slice::from_ref(&data)).unwrap_err();
            let kind = match got {
                ModelError::ContextWindowExceeded(_) => "context",
                ModelError::RateLimited { .. } => "rate",
                ModelError::Overloaded(_) => "overloaded",
                ModelError::Provider(_) => "provider",
                ref other => panic!("{data}: {other:?}"),
            };
            assert_eq!(kind, want, "{data}");
        }
    }

    #[test]
    fn items_missing_their_done_events_come_from_the_completed_output() {
        let data = vec![
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}})
            .to_string(),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "delta": "Hi"}).to_string(),
            json!({"type": "response.output_item.added", "output_index": 1,
                   "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": ""}})
            .to_string(),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": "{}"})
                .to_string(),
            completed(json!([{"type": "message", "id": "msg_1", "role": "assistant",
                              "content": [{"type": "output_text", "text": "Hi", "annotations": []}]}])),
        ];
        let events = assemble(&data).unwrap();
        assert_eq!(
            events,
            vec![
                ModelEvent::TextDelta { delta: "Hi".into() },
                ModelEvent::Part { part: Part::Text { text: "Hi".into(), signature: None, id: Some("msg_1".into()) } },
                ModelEvent::Part {
                    part: Part::ToolCall {
                        call: ToolCallRequest { call_id: "call_1".into(), name: "f".into(), arguments: "{}".into() },
                        signature: None,
                        id: Some("fc_1".into()),
                    }
                },
                ModelEvent::Finish {
                    reason: FinishReason::ToolCalls,
                    usage: Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() }
                },
            ]
        );
    }

    #[test]
    fn a_message_closed_without_content_leaves_its_streamed_text_alone() {
        let data = vec![
            json!({"type": "response.output_item.added", "output_index": 0,
                   "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}})
            .to_string(),
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"}).to_string(),
            json!({"type": "response.output_item.done", "output_index": 0,
                   "item": {"type": "message", "id": "msg_1", "role": "assistant"}})
            .to_string(),
            completed(json!([])),
        ];
        // No part: an empty text part with the id would replace "Hi"; the runtime keeps it.
        assert_eq!(
            assemble(&data).unwrap(),
            vec![
                ModelEvent::TextDelta { delta: "Hi".into() },
                ModelEvent::Finish {
                    reason: FinishReason::Stop,
                    usage: Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() }
                },
            ]
        );
    }

    #[test]
    fn an_event_named_only_by_its_sse_field_is_read() {
        let mut assembler = Assembler::default();
        let events = assembler
            .on_event(&SseEvent {
                event: Some("response.output_text.delta".into()),
                data: json!({"item_id": "msg_1", "output_index": 0, "delta": "ok"}).to_string(),
            })
            .unwrap();
        assert_eq!(events, vec![ModelEvent::TextDelta { delta: "ok".into() }]);
    }

    /// An item the stream will produce: a reasoning item (summary pieces), a message (text
    /// pieces) or a function call (argument pieces).
    #[derive(Debug, Clone)]
    enum Out {
        Reasoning(Vec<String>),
        Message(Vec<String>),
        Call(String, Vec<String>),
    }

    fn out_item() -> impl Strategy<Value = Out> {
        let pieces = || proptest::collection::vec("(?s).{0,6}", 0..4);
        prop_oneof![
            pieces().prop_map(Out::Reasoning),
            pieces().prop_map(Out::Message),
            ("[a-z_]{1,8}", pieces()).prop_map(|(n, a)| Out::Call(n, a)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Whatever the items and however their text is cut: every item comes out once, in
        /// output order, whole (a message replacing its streamed text with the same text),
        /// the streamed text equals the messages' text, and the finish says tool calls
        /// exactly when there was a call.
        #[test]
        fn items_come_out_whole_and_in_order(items in proptest::collection::vec(out_item(), 0..5)) {
            let mut data = vec![json!({"type": "response.created", "response": {"status": "in_progress", "output": []}}).to_string()];
            let mut want = Vec::new();
            let mut streamed = String::new();
            for (i, item) in items.iter().enumerate() {
                let (added, done) = match item {
                    Out::Reasoning(pieces) => {
                        let id = format!("rs_{i}");
                        for p in pieces {
                            data.push(json!({"type": "response.reasoning_summary_text.delta", "item_id": id,
                                "output_index": i, "summary_index": 0, "delta": p}).to_string());
                        }
                        let summary = pieces.concat();
                        let summary: Vec<String> = if summary.is_empty() { vec![] } else { vec![summary] };
                        want.push(Part::Reasoning { text: String::new(), summary: summary.clone(), signature: None,
                            encrypted: Some(format!("enc{i}")), id: Some(id.clone()) });
                        (json!({"type": "reasoning", "id": id, "summary": []}),
                         json!({"type": "reasoning", "id": id, "encrypted_content": format!("enc{i}"),
                                "summary": summary.iter().map(|s| json!({"type": "summary_text", "text": s})).collect::<Vec<_>>()}))
                    }
                    Out::Message(pieces) => {
                        let id = format!("msg_{i}");
                        for p in pieces {
                            data.push(json!({"type": "response.output_text.delta", "item_id": id,
                                "output_index": i, "content_index": 0, "delta": p}).to_string());
                        }
                        streamed.push_str(&pieces.concat());
                        want.push(Part::Text { text: pieces.concat(), signature: None, id: Some(id.clone()) });
                        (json!({"type": "message", "id": id, "role": "assistant", "content": []}),
                         json!({"type": "message", "id": id, "role": "assistant",
                                "content": [{"type": "output_text", "text": pieces.concat(), "annotations": []}]}))
                    }
                    Out::Call(name, pieces) => {
                        let id = format!("fc_{i}");
                        for p in pieces {
                            data.push(json!({"type": "response.function_call_arguments.delta", "item_id": id,
                                "output_index": i, "delta": p}).to_string());
                        }
                        want.push(Part::ToolCall { call: ToolCallRequest { call_id: format!("call_{i}").into(), name: name.as_str().into(),
                            arguments: pieces.concat() }, signature: None, id: Some(id.clone()) });
                        (json!({"type": "function_call", "id": id, "call_id": format!("call_{i}"), "name": name, "arguments": ""}),
                         json!({"type": "function_call", "id": id, "call_id": format!("call_{i}"), "name": name, "arguments": pieces.concat()}))
                    }
                };
                // The added event goes before the deltas pushed above.
                let at = data.len() - match item { Out::Reasoning(p) | Out::Message(p) | Out::Call(_, p) => p.len() };
                data.insert(at, json!({"type": "response.output_item.added", "output_index": i, "item": added}).to_string());
                data.push(json!({"type": "response.output_item.done", "output_index": i, "item": done}).to_string());
            }
            data.push(completed(json!([])));
            let events = assemble(&data).unwrap();
            let parts: Vec<Part> = events.iter().filter_map(|e| match e {
                ModelEvent::Part { part } => Some(part.clone()),
                _ => None,
            }).collect();
            prop_assert_eq!(parts, want);
            let text: String = events.iter().filter_map(|e| match e {
                ModelEvent::TextDelta { delta } => Some(delta.as_str()),
                _ => None,
            }).collect();
            prop_assert_eq!(text, streamed);
            let calls = items.iter().any(|i| matches!(i, Out::Call(..)));
            let reason = if calls { FinishReason::ToolCalls } else { FinishReason::Stop };
            prop_assert_eq!(events.last(), Some(&ModelEvent::Finish { reason, usage: Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() } }));
        }

        /// Arbitrary payloads, JSON-ish or not, with real event types: events or a typed
        /// error, never a panic.
        #[test]
        fn arbitrary_payloads_never_panic(data in proptest::collection::vec(prop_oneof![
            "(?s).{0,24}",
            (prop::sample::select(vec![
                "response.output_item.added", "response.output_item.done", "response.output_text.delta",
                "response.reasoning_summary_text.delta", "response.reasoning_summary_part.added",
                "response.function_call_arguments.delta", "response.function_call_arguments.done",
                "response.completed", "response.incomplete", "response.failed", "error",
            ]), crate::strategies::json_value(), prop_oneof![any::<Option<u8>>().prop_map(|i| i.map(u64::from)), any::<Option<u64>>()],
               prop_oneof![any::<Option<u8>>().prop_map(|i| i.map(u64::from)), any::<Option<u64>>()]).prop_map(|(t, v, i, s)| json!({
                "type": t, "item": v, "output_index": i, "summary_index": s, "delta": v, "response": v,
                "arguments": v, "error": v,
            }).to_string()),
            (crate::strategies::json_value(), crate::strategies::json_value()).prop_map(|(a, b)| json!({
                "type": "response.output_item.done", "output_index": 0,
                "item": {"type": "function_call", "id": a, "name": b, "arguments": a, "content": b, "summary": a},
            }).to_string()),
        ], 0..8)) {
            let _ = assemble(&data);
        }
    }
}
