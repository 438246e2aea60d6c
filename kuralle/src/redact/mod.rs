//! Sensitive tool arguments and results: which ones a tool has ([`Redaction`]), and hiding
//! them in what a run shows ([`Redactions`]): events, the CLI, the console and exports.
//!
//! The journal keeps the values: a resumed run sends the model the same conversation and
//! gives a replayed call the same result, so they cannot be dropped at the source. What is
//! redacted is every *view* of the run. A tool marks a value sensitive with
//! [`Secret<T>`](crate::Secret) as a parameter or result type; the runtime writes the agent's
//! redactions into the run record, so a reader with only the store (the CLI, the console, an
//! export) hides the same values the runtime does.

mod secret;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use secret::Secret;

use crate::{
    json::JsonText,
    store::{RunRecord, StepKind, StepRecord},
    tool::Tool,
};

/// What a redacted value shows instead.
pub const REDACTED: &str = "[redacted]";

/// Which of one tool's values are sensitive: top-level argument names, and the result.
///
/// `#[tool]` fills it from the parameter and result types ([`Secret<T>`](crate::Secret));
/// a hand-written [`Tool`] returns it from [`Tool::redaction`].
///
/// ```
/// use kuralle::{Secret, Tool, tool};
///
/// /// Charge a card.
/// #[tool]
/// async fn charge(card: Secret<String>, cents: u64) -> String {
///     format!("charged {cents}")
/// }
///
/// let r = Charge.redaction();
/// assert_eq!(r.args, ["card"]);
/// assert!(!r.result);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redaction {
    /// The sensitive top-level argument names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Whether the whole result is sensitive.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub result: bool,
}

impl Redaction {
    /// Sensitive `args` and, when `result`, the result.
    ///
    /// ```
    /// let r = kuralle::Redaction::new(["token"], true);
    /// assert_eq!((r.args.len(), r.result), (1, true));
    /// ```
    pub fn new<S: Into<String>>(args: impl IntoIterator<Item = S>, result: bool) -> Self {
        Self { args: args.into_iter().map(Into::into).collect(), result }
    }

    /// Whether nothing is sensitive.
    ///
    /// ```
    /// assert!(kuralle::Redaction::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.args.is_empty() && !self.result
    }

    /// Hides the sensitive arguments in `args`. Arguments that are not an object (the model's
    /// text when it was not JSON) are hidden whole when any argument is sensitive.
    ///
    /// ```
    /// let mut args = serde_json::json!({"card": "4242", "cents": 500});
    /// kuralle::Redaction::new(["card"], false).args(&mut args);
    /// assert_eq!(args, serde_json::json!({"card": "[redacted]", "cents": 500}));
    /// ```
    pub fn args(&self, args: &mut Value) {
        if self.args.is_empty() {
            return;
        }
        match args {
            Value::Object(map) => {
                for name in &self.args {
                    if let Some(v) = map.get_mut(name) {
                        *v = Value::from(REDACTED);
                    }
                }
            }
            other => *other = Value::from(REDACTED),
        }
    }

    /// Hides `result` whole when the result is sensitive.
    pub fn result(&self, result: &mut Value) {
        if self.result {
            *result = Value::from(REDACTED);
        }
    }
}

/// The redactions of one run's tools, by tool name, and what applies them to each view of
/// the run.
///
/// ```
/// use kuralle::{Redaction, Redactions};
/// use serde_json::json;
///
/// let r = Redactions::from_iter([("charge".to_owned(), Redaction::new(["card"], false))]);
/// let mut args = json!({"card": "4242", "cents": 500});
/// r.args("charge", &mut args);
/// assert_eq!(args, json!({"card": "[redacted]", "cents": 500}));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Redactions(BTreeMap<String, Redaction>);

impl FromIterator<(String, Redaction)> for Redactions {
    fn from_iter<I: IntoIterator<Item = (String, Redaction)>>(iter: I) -> Self {
        Self(iter.into_iter().filter(|(_, r)| !r.is_empty()).collect())
    }
}

impl Redactions {
    /// The redactions of `tools`.
    pub fn of_tools<'a>(tools: impl IntoIterator<Item = &'a dyn Tool>) -> Self {
        tools.into_iter().map(|t| (t.name().to_owned(), t.redaction())).collect()
    }

    /// The redactions the runtime wrote into `record` (none for runs written before they
    /// were kept, or whose tools have no sensitive values).
    ///
    /// ```
    /// let record = kuralle::RunRecord::new("run-1", "support");
    /// assert!(kuralle::Redactions::of(&record).is_empty());
    /// ```
    pub fn of(record: &RunRecord) -> Self {
        #[derive(Deserialize)]
        struct Kept {
            #[serde(default)]
            redact: Redactions,
        }
        record.state.decode::<Kept>().map(|k| k.redact).unwrap_or_default()
    }

    /// Whether no tool has a sensitive value.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The redaction of `tool`, if it has one.
    pub fn get(&self, tool: &str) -> Option<&Redaction> {
        self.0.get(tool)
    }

    /// Hides `tool`'s sensitive arguments in `args` (see [`Redaction::args`]).
    pub fn args(&self, tool: &str, args: &mut Value) {
        if let Some(r) = self.get(tool) {
            r.args(args);
        }
    }

    /// [`args`](Self::args) on the model's raw argument text.
    pub fn args_text(&self, tool: &str, text: &mut String) {
        if self.get(tool).is_none_or(|r| r.args.is_empty()) {
            return;
        }
        let mut value = serde_json::from_str::<Value>(text).unwrap_or(Value::Null);
        self.args(tool, &mut value);
        *text = value.to_string();
    }

    /// Hides `tool`'s result when it is sensitive.
    pub fn result(&self, tool: &str, result: &mut Value) {
        if let Some(r) = self.get(tool) {
            r.result(result);
        }
    }

    /// Hides the sensitive values in a journal entry: a tool step's result, the call
    /// arguments in a model step.
    pub fn step(&self, step: &mut StepRecord) {
        if self.is_empty() {
            return;
        }
        let Some(text) = step.result.as_mut() else { return };
        let mut value = text.to_value();
        match step.kind {
            StepKind::Tool => self.result(&step.name, &mut value),
            StepKind::Model => self.response(&mut value),
            _ => return,
        }
        *text = JsonText::from(value);
    }

    /// Hides the sensitive values in a run record's state: the conversation's calls and
    /// results, and the arguments of calls waiting for approval.
    pub fn record(&self, record: &mut RunRecord) {
        if self.is_empty() {
            return;
        }
        let mut state = record.state.to_value();
        if let Some(messages) = state.get_mut("messages").and_then(Value::as_array_mut) {
            messages.iter_mut().for_each(|m| self.message(m));
        }
        if let Some(pending) = state.get_mut("pending").and_then(Value::as_array_mut) {
            for request in pending.iter_mut().filter_map(|p| p.get_mut("request")) {
                let name = request["name"].as_str().unwrap_or_default().to_owned();
                if let Some(args) = request.get_mut("args") {
                    self.args(&name, args);
                }
            }
        }
        record.state = JsonText::from(state);
    }

    /// A journaled model response (or an assistant message): its calls' arguments.
    fn response(&self, response: &mut Value) {
        if let Some(parts) = response.get_mut("parts").and_then(Value::as_array_mut) {
            for call in parts.iter_mut().filter(|p| p["type"] == "tool_call").filter_map(|p| p.get_mut("call")) {
                self.call(call);
            }
        }
        // Journals from before parts were kept list the calls on their own.
        if let Some(calls) = response.get_mut("tool_calls").and_then(Value::as_array_mut) {
            calls.iter_mut().for_each(|c| self.call(c));
        }
    }

    fn call(&self, call: &mut Value) {
        let name = call["name"].as_str().unwrap_or_default().to_owned();
        if let Some(Value::String(text)) = call.get_mut("arguments") {
            self.args_text(&name, text);
        }
    }

    fn message(&self, message: &mut Value) {
        match message["role"].as_str() {
            Some("assistant") => self.response(message),
            Some("tool") => {
                let name = message["name"].as_str().unwrap_or_default().to_owned();
                if let Some(content) = message.get_mut("content") {
                    self.result(&name, content);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn charge() -> Redactions {
        Redactions::from_iter([
            ("charge".to_owned(), Redaction::new(["card"], false)),
            ("token".to_owned(), Redaction::new(Vec::<String>::new(), true)),
            ("plain".to_owned(), Redaction::default()),
        ])
    }

    #[test]
    fn empty_redactions_are_not_kept() {
        assert!(charge().get("plain").is_none());
    }

    #[test]
    fn raw_text_that_is_not_json_is_hidden_whole() {
        let mut text = "{\"card\": \"4242".to_owned();
        charge().args_text("charge", &mut text);
        assert_eq!(text, "\"[redacted]\"");
        let mut other = "{\"card\": \"4242\"}".to_owned();
        charge().args_text("plain", &mut other);
        assert_eq!(other, "{\"card\": \"4242\"}");
    }

    #[test]
    fn model_steps_and_state_are_redacted() {
        let r = charge();
        let response = json!({"parts": [
            {"type": "text", "text": "paying"},
            {"type": "tool_call", "call": {"call_id": "c1", "name": "charge", "arguments": "{\"card\":\"4242\",\"cents\":5}"}}
        ], "finish": "tool_calls"});
        let mut step = StepRecord {
            ordinal: 0,
            key: "m".into(),
            kind: StepKind::Model,
            name: "model".into(),
            epoch: 0,
            status: crate::StepStatus::Finished,
            result: Some(JsonText::from(response)),
            error: None,
            started_at_ms: 0,
            finished_at_ms: Some(1),
        };
        r.step(&mut step);
        let text = step.result.as_ref().map(JsonText::as_str).unwrap_or_default().to_owned();
        assert!(!text.contains("4242") && text.contains("cents"), "{text}");

        let state = json!({
            "messages": [
                {"role": "user", "content": "pay"},
                {"role": "tool", "call_id": "c2", "name": "token", "content": "tok_live_1"}
            ],
            "pending": [{"request": {"request_id": "a", "call_id": "c3", "name": "charge", "args": {"card": "4242"}}, "decision_key": "k"}]
        });
        let mut record = RunRecord::new("run-1", "support").with_state(JsonText::from(state));
        r.record(&mut record);
        let text = record.state.as_str();
        assert!(!text.contains("4242") && !text.contains("tok_live_1") && text.contains("pay"), "{text}");
    }
}
