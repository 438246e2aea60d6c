//! `Replay`: a model that answers a test run with the responses a recorded run got, in order,
//! and notes every request that differs from the recorded one.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, Mutex, PoisonError},
};

use futures::stream::{self, BoxStream, StreamExt};
use serde_json::Value;

use crate::{
    DEFAULT_MAX_TOOL_RESULT_TOKENS, Redactions, ToolError,
    dispatch::into_model_value,
    export::{ExportError, RunExport},
    inspect::step_calls,
    model::{Message, Model, ModelError, ModelEvent, ModelRequest, Part},
    runtime::response::ModelResponse,
    store::{StepKind, StepStatus},
    truncate::{is_truncation_of, truncate_owned},
};

/// One recorded model response and what the run sent back for its calls.
#[derive(Debug)]
struct Recorded {
    response: ModelResponse,
    /// The value the model was given for each call of the response, by call id, as journaled
    /// (before truncation). Calls the journal holds no result for (never run, denied) are absent.
    results: HashMap<String, Value>,
}

/// How a test run's request differed from the recorded run's.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Divergence {
    /// The request offered other tools than the recorded one (names, sorted).
    ToolsOffered {
        /// The request's index, from 0.
        request: usize,
        /// Offered when recorded, not now.
        missing: Vec<String>,
        /// Offered now, not when recorded.
        added: Vec<String>,
    },
    /// A tool result sent to the model differs from the recorded one (`sent` is `None` when
    /// the request carried no result for the call).
    ToolResult {
        /// The request's index, from 0.
        request: usize,
        /// The call the result answers.
        call_id: String,
        /// The tool.
        name: String,
        /// The result the recorded run sent.
        recorded: Value,
        /// The result the test run sent.
        sent: Option<Value>,
    },
    /// The test run asked the model more often than the recorded run did.
    ExtraRequest {
        /// The request's index, from 0.
        request: usize,
    },
    /// The test run ended before asking for every recorded response.
    Unplayed {
        /// Responses played.
        played: usize,
        /// Responses recorded.
        recorded: usize,
    },
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ToolsOffered { request, missing, added } => {
                write!(f, "request {request}: tools offered differ (missing {missing:?}, added {added:?})")
            }
            Self::ToolResult { request, call_id, name, recorded, sent: Some(sent) } => {
                write!(f, "request {request}: `{name}` ({call_id}) returned {sent}, recorded {recorded}")
            }
            Self::ToolResult { request, call_id, name, recorded, sent: None } => {
                write!(f, "request {request}: no result sent for `{name}` ({call_id}), recorded {recorded}")
            }
            Self::ExtraRequest { request } => write!(f, "request {request}: the recorded run made no such request"),
            Self::Unplayed { played, recorded } => {
                write!(f, "the run asked for {played} of {recorded} recorded responses")
            }
        }
    }
}

/// A test run that did not follow its recording: every difference, in the order seen.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the run diverged from its recording:{}", list(.0))]
pub struct Diverged(pub Vec<Divergence>);

fn list(divergences: &[Divergence]) -> String {
    divergences.iter().map(|d| format!("\n  - {d}")).collect()
}

#[derive(Debug, Default)]
struct Progress {
    played: usize,
    divergences: Vec<Divergence>,
}

/// A [`Model`] that answers with a recorded run's model responses, in order, and compares each
/// request with the recorded one: the tools offered and the tool results sent back. A run
/// recorded in production (`kuralle runs export RUN_ID`) becomes a regression test.
///
/// Clones share their progress: hand one to the runtime, keep one to [`check`](Self::check).
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{AgentDef, Runtime, export::RunExport, testing::{Replay, ScriptedModel, Turn}, tool};
///
/// /// Look up an order's status.
/// #[tool]
/// async fn order_status(order: String) -> String { format!("{order}: shipped") }
///
/// let agent = || AgentDef::new("support", "Answer about orders.").tool(OrderStatus);
/// // A recorded run (in practice: `kuralle runs export RUN_ID -o incident.json`).
/// let live = Runtime::builder()
///     .agent(agent())
///     .model(ScriptedModel::new([
///         Turn::tool_calls([("c1", "order_status", r#"{"order":"A1"}"#)]),
///         Turn::text("A1 has shipped."),
///     ]))
///     .build()
///     .unwrap();
/// let run_id = live.run("Where is A1?").await.unwrap().run_id;
/// let export = RunExport::from_store(live.store().as_ref(), &run_id).await.unwrap();
///
/// // The test: the same agent, answered by the recording.
/// let replay = Replay::from_export(&export).unwrap();
/// let runtime = Runtime::builder().agent(agent()).model(replay.clone()).build().unwrap();
/// let out = runtime.run(replay.inputs()[0].as_str()).await.unwrap();
/// assert_eq!(out.text, "A1 has shipped.");
/// replay.check().unwrap();
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Replay {
    recorded: Arc<[Recorded]>,
    inputs: Arc<[String]>,
    name: Arc<str>,
    provider: Arc<str>,
    max_tool_result_tokens: usize,
    /// The recorded run's sensitive values: the export holds them redacted, so a sent result
    /// is compared redacted too.
    redact: Redactions,
    progress: Arc<Mutex<Progress>>,
}

impl Replay {
    /// A model that plays `export`'s model responses.
    ///
    /// # Errors
    /// [`ExportError::State`] when a journaled model response or the run's state cannot be
    /// read.
    pub fn from_export(export: &RunExport) -> Result<Self, ExportError> {
        let calls = step_calls(&export.run.run_id, &export.steps);
        let models: Vec<usize> = export
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == StepKind::Model && s.status == StepStatus::Finished)
            .map(|(i, _)| i)
            .collect();
        let mut recorded = Vec::with_capacity(models.len());
        for (n, &at) in models.iter().enumerate() {
            let step = &export.steps[at];
            let response = step
                .result
                .as_ref()
                .ok_or_else(|| ExportError::State(format!("model step {} has no result", step.ordinal)))?
                .decode::<ModelResponse>()
                .map_err(|e| ExportError::State(format!("model step {} is unreadable: {e}", step.ordinal)))?;
            // A response's calls are journaled after it, before the next response.
            let end = models.get(n + 1).copied().unwrap_or(export.steps.len());
            let mut results = HashMap::new();
            for s in &export.steps[at + 1..end] {
                let Some(call) = calls.get(&s.ordinal) else { continue };
                if s.kind != StepKind::Tool {
                    continue;
                }
                let value = match (s.status, &s.result, &s.error) {
                    (StepStatus::Finished, Some(r), _) => r.decode::<Value>().ok().map(|v| into_model_value(Ok(v))),
                    (StepStatus::Failed, _, Some(e)) => e.decode::<ToolError>().ok().map(|e| into_model_value(Err(e))),
                    _ => None,
                };
                if let Some(value) = value {
                    // A call run more than once (`replay = false`) answers with its last run.
                    results.insert(call.call_id.clone(), value);
                }
            }
            recorded.push(Recorded { response, results });
        }
        let origin = recorded.iter().find_map(|r| r.response.origin.as_ref());
        Ok(Self {
            name: origin.map_or("replay", |o| o.model.as_str()).into(),
            provider: origin.map_or("replay", |o| o.provider.as_str()).into(),
            inputs: export.inputs()?.into(),
            recorded: recorded.into(),
            max_tool_result_tokens: DEFAULT_MAX_TOOL_RESULT_TOKENS,
            redact: Redactions::of(&export.run),
            progress: Arc::default(),
        })
    }

    /// The per-result token cap the test's agent uses, when it is not the default: recorded
    /// results are compared after the same truncation.
    #[must_use]
    pub fn max_tool_result_tokens(mut self, tokens: usize) -> Self {
        self.max_tool_result_tokens = tokens;
        self
    }

    /// The recorded run's user inputs, one per turn, in order.
    pub fn inputs(&self) -> &[String] {
        &self.inputs
    }

    /// How many model responses the recording holds.
    pub fn recorded(&self) -> usize {
        self.recorded.len()
    }

    /// How many have been played.
    pub fn played(&self) -> usize {
        self.lock().played
    }

    /// Every difference seen so far.
    pub fn divergences(&self) -> Vec<Divergence> {
        self.lock().divergences.clone()
    }

    /// `Ok` when every recorded response was played and no request differed.
    ///
    /// # Errors
    /// [`Diverged`], listing each difference.
    pub fn check(&self) -> Result<(), Diverged> {
        let progress = self.lock();
        let mut all = progress.divergences.clone();
        if progress.played < self.recorded.len() {
            all.push(Divergence::Unplayed { played: progress.played, recorded: self.recorded.len() });
        }
        if all.is_empty() { Ok(()) } else { Err(Diverged(all)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        // Every mutation is a push or an increment: a poisoned lock is still consistent.
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn compare(&self, index: usize, request: &ModelRequest, out: &mut Vec<Divergence>) {
        if let Some(offered) = &self.recorded[index].response.offered {
            let mut before: Vec<&str> = offered.names();
            let mut now: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
            before.sort_unstable();
            now.sort_unstable();
            if before != now {
                let missing = before.iter().filter(|n| !now.contains(n)).map(|n| (*n).to_owned()).collect();
                let added = now.iter().filter(|n| !before.contains(n)).map(|n| (*n).to_owned()).collect();
                out.push(Divergence::ToolsOffered { request: index, missing, added });
            }
        }
        let Some(previous) = index.checked_sub(1).map(|i| &self.recorded[i]) else { return };
        // The results this request sends: the tool messages after the last assistant turn.
        let sent: HashMap<&str, &Value> = request
            .messages
            .iter()
            .rev()
            .take_while(|m| !matches!(m, Message::Assistant { .. }))
            .filter_map(|m| match m {
                Message::Tool { call_id, content, .. } => Some((call_id.as_str(), content)),
                _ => None,
            })
            .collect();
        for part in &previous.response.parts {
            let Part::ToolCall { call, .. } = part else { continue };
            let Some(recorded) = previous.results.get(call.call_id.as_str()) else { continue };
            let sent = sent.get(call.call_id.as_str()).map(|s| {
                let mut s = (*s).clone();
                self.redact.result(&call.name, &mut s);
                s
            });
            let same = sent.as_ref().is_some_and(|s| {
                *s == truncate_owned(recorded.clone(), self.max_tool_result_tokens) || is_truncation_of(s, recorded)
            });
            if !same {
                out.push(Divergence::ToolResult {
                    request: index,
                    call_id: call.call_id.to_string(),
                    name: call.name.to_string(),
                    recorded: recorded.clone(),
                    sent,
                });
            }
        }
    }
}

impl Model for Replay {
    fn name(&self) -> &str {
        &self.name
    }

    fn provider(&self) -> &str {
        &self.provider
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let mut progress = self.lock();
        let index = progress.played;
        progress.played += 1;
        if index >= self.recorded.len() {
            progress.played = self.recorded.len();
            progress.divergences.push(Divergence::ExtraRequest { request: index });
            return stream::iter([Err(ModelError::ScriptExhausted(index))]).boxed();
        }
        let mut found = Vec::new();
        self.compare(index, &request, &mut found);
        progress.divergences.extend(found);
        let response = &self.recorded[index].response;
        let mut events = Vec::with_capacity(response.parts.len() * 2 + 1);
        for part in &response.parts {
            if let Part::Text { text, .. } = part {
                events.push(Ok(ModelEvent::TextDelta { delta: text.clone() }));
            }
            events.push(Ok(ModelEvent::Part { part: part.clone() }));
        }
        events.push(Ok(ModelEvent::Finish { reason: response.finish.clone(), usage: response.usage }));
        stream::iter(events).boxed()
    }
}
