//! `ScriptedModel`: a model that plays scripted turns, for tests and offline demos;
//! [`Replay`], a model that plays a recorded run back; and [`CountingStore`], a store wrapper
//! that counts what the runtime writes.

mod counting;
mod replay;

pub use counting::{CountingStore, WriteCounts};
pub use replay::{Diverged, Divergence, Replay};

use std::sync::{Arc, Mutex, PoisonError};

use futures::stream::{self, BoxStream, StreamExt};

use crate::{
    model::{FinishReason, Model, ModelError, ModelEvent, ModelRequest, Part, SmolStr, ToolCallRequest, Usage},
    transcript::Transcript,
};

/// One scripted model response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    parts: Vec<Part>,
    text: String,
    calls: Vec<ToolCallRequest>,
    error: Option<String>,
    finish: Option<FinishReason>,
}

impl Turn {
    /// A response that answers with `text` and stops.
    pub fn text(text: impl Into<String>) -> Self {
        Self { parts: Vec::new(), text: text.into(), calls: Vec::new(), error: None, finish: None }
    }

    /// A response that calls tools: `(call_id, name, raw_arguments)`; the argument text is
    /// passed on as is, so it may be invalid JSON.
    pub fn tool_calls<I, A, B, C>(calls: I) -> Self
    where
        I: IntoIterator<Item = (A, B, C)>,
        A: Into<SmolStr>,
        B: Into<SmolStr>,
        C: Into<String>,
    {
        let calls = calls
            .into_iter()
            .map(|(id, name, args)| ToolCallRequest { call_id: id.into(), name: name.into(), arguments: args.into() })
            .collect();
        Self { parts: Vec::new(), text: String::new(), calls, error: None, finish: None }
    }

    /// A response that fails with a provider error after its text, if any.
    pub fn error(message: impl Into<String>) -> Self {
        Self { parts: Vec::new(), text: String::new(), calls: Vec::new(), error: Some(message.into()), finish: None }
    }

    /// Adds text before the tool calls.
    #[must_use]
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = text.into();
        self
    }

    /// Ends the turn with `reason` instead of `stop` / `tool_calls`, as a response cut off at
    /// the token limit (`Length`) or refused (`Refusal`) ends.
    ///
    /// ```
    /// use kuralle::{FinishReason, testing::Turn};
    /// let cut = Turn::text(r#"{"number":"A-"#).with_finish(FinishReason::Length);
    /// # let _ = cut;
    /// ```
    #[must_use]
    pub fn with_finish(mut self, reason: FinishReason) -> Self {
        self.finish = Some(reason);
        self
    }

    /// Adds a part (reasoning, say) before the text, sent as a [`ModelEvent::Part`], so tests
    /// can check that provider state is journaled and sent back.
    ///
    /// ```
    /// use kuralle::{Part, testing::Turn};
    /// let turn = Turn::text("42").with_part(Part::Reasoning {
    ///     text: "6 times 7".into(), summary: vec![], signature: Some("sig".into()), encrypted: None, id: None,
    /// });
    /// # let _ = turn;
    /// ```
    #[must_use]
    pub fn with_part(mut self, part: Part) -> Self {
        self.parts.push(part);
        self
    }
}

#[derive(Debug, Default)]
struct Script {
    turns: Vec<Turn>,
    next: usize,
    /// Every request, as received: each shares its transcript and tool specs with the
    /// runtime, so recording costs a few words per request, not a copy of the conversation.
    requests: Vec<ModelRequest>,
    by_transcript: bool,
    /// What the last request's transcript came to, so the next one (usually the same log,
    /// longer) is measured from where it ended instead of from the start.
    seen: Option<Seen>,
}

#[derive(Debug)]
struct Seen {
    transcript: Transcript,
    /// Σ compact-JSON characters of its messages.
    chars: usize,
    /// Assistant messages in it.
    assistants: usize,
}

impl Seen {
    /// Measures `transcript`, reusing `earlier` when `transcript` extends it.
    fn measure(earlier: Option<&Self>, transcript: &Transcript) -> Self {
        let (from, chars, assistants) = match earlier {
            Some(e) if transcript.extends(&e.transcript) => (e.transcript.len(), e.chars, e.assistants),
            _ => (0, 0, 0),
        };
        let mut seen = Self { transcript: transcript.clone(), chars, assistants };
        for m in transcript.iter().skip(from) {
            seen.chars += crate::truncate::json_chars(m);
            seen.assistants += usize::from(matches!(m, crate::model::Message::Assistant { .. }));
        }
        seen
    }

    /// The compact JSON length of the whole transcript as an array.
    fn array_chars(&self) -> usize {
        2 + self.transcript.len().saturating_sub(1) + self.chars
    }
}

/// Replays scripted [`Turn`]s in order, one per request, and records every request.
///
/// Clones share the script and the recorded requests, so a test can hand one clone to the
/// runtime and inspect the other.
///
/// ```
/// use kuralle::testing::{ScriptedModel, Turn};
/// let model = ScriptedModel::new([
///     Turn::tool_calls([("call_1", "echo", r#"{"text":"hi"}"#)]),
///     Turn::text("Done."),
/// ]);
/// let seen = model.clone();
/// assert!(seen.requests().is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct ScriptedModel {
    script: Arc<Mutex<Script>>,
}

impl ScriptedModel {
    /// A model that plays `turns` in order; a request past the end fails with
    /// [`ModelError::ScriptExhausted`].
    pub fn new(turns: impl IntoIterator<Item = Turn>) -> Self {
        Self { script: Arc::new(Mutex::new(Script { turns: turns.into_iter().collect(), ..Script::default() })) }
    }

    /// A model that answers each request with the turn whose index is the number of assistant
    /// messages already in the request's transcript, instead of the next unplayed turn.
    ///
    /// That makes the answer a function of the conversation, so a run resumed in a new process
    /// (whose earlier model responses replay from the journal) gets the same answers as a run
    /// that never stopped.
    ///
    /// ```
    /// use kuralle::testing::{ScriptedModel, Turn};
    /// let model = ScriptedModel::by_transcript([Turn::text("first"), Turn::text("second")]);
    /// # let _ = model;
    /// ```
    pub fn by_transcript(turns: impl IntoIterator<Item = Turn>) -> Self {
        let model = Self::new(turns);
        model.lock().by_transcript = true;
        model
    }

    /// Every request the model received, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.lock().requests.clone()
    }

    /// How many scripted turns have been played (in transcript mode: one past the highest
    /// turn index played).
    pub fn played(&self) -> usize {
        self.lock().next
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        // A panic elsewhere while holding the lock leaves the script consistent (every
        // mutation is a single push or increment), so a poisoned lock is still usable.
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}

impl Model for ScriptedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    fn provider(&self) -> &str {
        "scripted"
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let mut script = self.lock();
        let seen = Seen::measure(script.seen.as_ref(), &request.messages);
        let input_tokens = (seen.array_chars() as u64).div_ceil(4);
        let index = if script.by_transcript { seen.assistants } else { script.next };
        script.seen = Some(seen);
        script.requests.push(request);
        let Some(turn) = script.turns.get(index).cloned() else {
            return stream::iter([Err(ModelError::ScriptExhausted(index))]).boxed();
        };
        script.next = script.next.max(index + 1);
        drop(script);

        let mut events: Vec<_> = turn.parts.into_iter().map(|part| Ok(ModelEvent::Part { part })).collect();
        // Stream word by word so consumers see real incremental deltas.
        let mut rest = turn.text.as_str();
        while !rest.is_empty() {
            let cut = rest.char_indices().skip(1).find(|&(_, c)| c == ' ').map_or(rest.len(), |(i, _)| i);
            events.push(Ok(ModelEvent::TextDelta { delta: rest[..cut].to_owned() }));
            rest = &rest[cut..];
        }
        if let Some(message) = turn.error {
            events.push(Err(ModelError::Provider(message)));
            return stream::iter(events).boxed();
        }
        let output_tokens =
            estimate_tokens(&turn.text) + turn.calls.iter().map(|c| estimate_tokens(&c.arguments) + 1).sum::<u64>();
        let reason =
            turn.finish.unwrap_or(if turn.calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls });
        events.extend(turn.calls.into_iter().map(|c| Ok(ModelEvent::ToolCall(c))));
        events
            .push(Ok(ModelEvent::Finish { reason, usage: Usage { input_tokens, output_tokens, ..Usage::default() } }));
        stream::iter(events).boxed()
    }
}
