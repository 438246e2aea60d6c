//! What a run reports while it runs ([`Event`], sent on an [`EventSender`]), and what it ends
//! with ([`RunOutput`]). Below dispatch: dispatch reports calls with it, the run loop turns.

use flume::TrySendError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use smol_str::SmolStr;

use crate::{
    approval::PendingApproval,
    limits::{Amount, Limit},
    model::Usage,
    output::OutputError,
    store::RunStatus,
};

/// A tool call named in a [`Event::ToolBatchStart`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCall {
    /// The model's id for the call.
    pub call_id: SmolStr,
    /// Tool name.
    pub name: SmolStr,
}

/// One thing that happened in a run, in order.
///
/// Serialized with `"type"` as the tag, in kebab-case:
/// ```
/// let e = kuralle::Event::TextDelta { delta: "hi".into() };
/// assert_eq!(serde_json::to_value(&e).unwrap(), serde_json::json!({"type": "text-delta", "delta": "hi"}));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Event {
    /// The run is open.
    RunStarted {
        /// Run id.
        run_id: String,
    },
    /// A piece of model text.
    TextDelta {
        /// The text.
        delta: String,
    },
    /// A piece of the model's reasoning or thinking text, as the provider streams it (not
    /// repeated when a step is replayed from the journal).
    ReasoningDelta {
        /// The text.
        delta: String,
    },
    /// A batch of tool calls is about to run (one call for a serial call).
    ToolBatchStart {
        /// The calls, in source order.
        calls: Vec<BatchCall>,
    },
    /// A tool call, before it runs. `args` is the parsed arguments, or the raw text as a
    /// string when it was not valid JSON.
    ToolCall {
        /// The model's id for the call.
        call_id: SmolStr,
        /// Tool name.
        name: SmolStr,
        /// Arguments.
        args: Value,
    },
    /// A progress value from a streaming tool, emitted as it happens.
    ToolProgress {
        /// The model's id for the call.
        call_id: SmolStr,
        /// Tool name.
        name: SmolStr,
        /// The yielded value.
        value: Value,
    },
    /// A tool call's outcome, untruncated: the result, or (with `is_error`) the error object
    /// the model receives.
    ToolResult {
        /// The model's id for the call.
        call_id: SmolStr,
        /// Tool name.
        name: SmolStr,
        /// The result or error object.
        result: Value,
        /// Whether the call failed.
        is_error: bool,
        /// Whether the outcome came from the journal instead of running the tool.
        replayed: bool,
    },
    /// The run is waiting for human decisions.
    Paused {
        /// Run id.
        run_id: String,
        /// The calls waiting for a decision.
        pending: Vec<PendingApproval>,
    },
    /// The run was stopped before a model request or tool batch that would have passed one of
    /// its [`RunLimits`](crate::RunLimits); it ends with status
    /// [`LimitExceeded`](RunStatus::LimitExceeded).
    ///
    /// ```
    /// use kuralle::{Event, Limit};
    /// let e = Event::LimitExceeded { run_id: "run-1".into(), limit: Limit::ToolCalls, used: 3u64.into(), max: 4u64.into() };
    /// assert_eq!(
    ///     serde_json::to_value(&e).unwrap(),
    ///     serde_json::json!({"type": "limit-exceeded", "run_id": "run-1", "limit": "tool_calls", "used": 3, "max": 4}),
    /// );
    /// ```
    LimitExceeded {
        /// Run id.
        run_id: String,
        /// The cap the next request or batch would have passed.
        limit: Limit,
        /// What the run had used of it, in the limit's [`unit`](Limit::unit).
        used: Amount,
        /// The cap.
        max: Amount,
    },
    /// Something went wrong; the run may go on (a tool error) or end (see the output).
    Error {
        /// What happened.
        message: String,
    },
    /// The run's turn is over.
    Done {
        /// Run id.
        run_id: String,
        /// Tokens used in this turn.
        usage: Usage,
    },
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOutput {
    /// Run id.
    pub run_id: String,
    /// The model's final text (empty when the turn did not end with an answer). With a typed
    /// output, the accepted value as JSON text.
    pub text: String,
    /// Finished, max steps reached, interrupted or paused.
    pub status: RunStatus,
    /// Tokens used in this turn.
    pub usage: Usage,
    /// The accepted typed output as JSON, when the agent declares one and the turn finished
    /// (see [`RunOutput::typed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

impl RunOutput {
    /// The accepted typed output as a `T` (the agent's `output` type, or any type it
    /// deserializes into).
    ///
    /// # Errors
    /// [`OutputError::Missing`] when the turn holds no typed value (the agent declares no
    /// output, or the turn did not finish); [`OutputError::Decode`] when it is not a `T`.
    ///
    /// ```
    /// use kuralle::{OutputError, RunOutput, RunStatus, Usage};
    /// let out = RunOutput {
    ///     run_id: "run-1".into(), text: "[1,2]".into(), status: RunStatus::Finished,
    ///     usage: Usage::default(), value: Some(serde_json::json!([1, 2])),
    /// };
    /// assert_eq!(out.typed::<Vec<u8>>().unwrap(), vec![1, 2]);
    /// assert!(matches!(out.typed::<String>(), Err(OutputError::Decode { .. })));
    /// ```
    pub fn typed<T: serde::de::DeserializeOwned>(&self) -> Result<T, OutputError> {
        let value =
            self.value.as_ref().ok_or_else(|| OutputError::Missing { status: self.status.as_str().to_owned() })?;
        T::deserialize(value).map_err(|e| OutputError::Decode {
            type_name: std::any::type_name::<T>().to_owned(),
            message: e.to_string(),
        })
    }
}

/// The sending side of a run's event channel: bounded, so a consumer that lags cannot make a
/// run buffer events without limit.
///
/// When the buffer is full, [`EventSender::send`] waits for the consumer (the run slows to the
/// consumer's pace). [`Event::ToolProgress`] never waits and never takes more than half the
/// buffer: it is dropped instead ([`EventSender::progress`]), because progress is advisory and
/// never journaled, and a chatty tool must neither stall on a slow reader nor crowd out the
/// events that matter. Once the handle is dropped or awaited, sends return at once.
///
/// Events travel boxed (a buffered event takes 8 bytes, not the event's 128). The channel is
/// flume's: one per run in flight, its buffer grows only as events wait in it, and it is about
/// 150 bytes where tokio's bounded channel takes 0.8 KiB when it is made.
#[derive(Debug, Clone)]
pub(crate) struct EventSender(flume::Sender<Box<Event>>);

/// The receiving side of a run's event channel.
pub(crate) type EventReceiver = flume::Receiver<Box<Event>>;

impl EventSender {
    /// A bounded channel holding up to `capacity` events (at least 1).
    pub(crate) fn channel(capacity: usize) -> (Self, EventReceiver) {
        let (tx, rx) = flume::bounded(capacity.max(1));
        (Self(tx), rx)
    }

    /// Sends `event`, waiting while the buffer is full. A closed channel (the caller dropped or
    /// awaited the handle) is not an error: the run still completes and journals.
    ///
    /// The event is offered when this is called; the future only waits for room. Not an
    /// `async fn`, whose future would hold the 128-byte event and the channel's waiting send
    /// inside every future that sends one (a run's task among them, for its whole life).
    pub(crate) fn send(&self, event: Event) -> impl Future<Output = ()> + Send + '_ {
        let waiting = match self.0.is_disconnected() {
            true => None,
            false => match self.0.try_send(Box::new(event)) {
                Err(TrySendError::Full(event)) => Some(event),
                Ok(()) | Err(TrySendError::Disconnected(_)) => None,
            },
        };
        async move {
            if let Some(event) = waiting {
                let _ = Box::pin(self.0.send_async(event)).await;
            }
        }
    }

    /// Whether anyone can still receive events. Once the handle is awaited or dropped, an
    /// event would be built only to be dropped: callers skip building the costly ones (each
    /// call's arguments and result are cloned into its events).
    pub(crate) fn is_listening(&self) -> bool {
        !self.0.is_disconnected()
    }

    /// Sends a progress event if less than half the buffer is in use; returns whether it was
    /// sent.
    pub(crate) fn progress(&self, event: Event) -> bool {
        let max = self.0.capacity().unwrap_or(usize::MAX);
        max.saturating_sub(self.0.len()) > max / 2 && self.0.try_send(Box::new(event)).is_ok()
    }
}
