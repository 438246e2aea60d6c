//! What an operator sees of runs, built from the store alone and shared by the text output,
//! `--json` and the console.

use kuralle::{
    PendingApproval, Redactions, RunFilter, RunStatus, RunStore, StepKind, StepRecord, StepStatus, Usage,
    inspect::{RecordedDecision, Utterance, conversation, key_run, pending_approvals, recorded_decisions, step_calls},
};
use serde::Serialize;
use serde_json::Value;

use crate::error::CliError;

/// One line of `runs list`.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    /// Run id.
    pub run_id: String,
    /// The agent that owns the run.
    pub agent_id: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// Journal steps.
    pub steps: usize,
    /// Last update, milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
    /// Approvals the run waits for that nobody has decided yet.
    pub pending_approvals: usize,
}

/// Which runs to list.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only this status.
    pub status: Option<RunStatus>,
    /// Only this agent.
    pub agent: Option<String>,
    /// Only runs whose id starts with this.
    pub prefix: Option<String>,
    /// Skip this many matching runs first (paging).
    pub offset: usize,
    /// At most this many, most recently updated first.
    pub limit: Option<usize>,
}

/// Runs matching `query`, most recently updated first.
pub async fn list(store: &dyn RunStore, query: &ListQuery) -> Result<Vec<RunRow>, CliError> {
    // The store filters by status and limit; the agent and id filters and the offset are
    // applied here, so the limit goes to the store only when nothing else filters.
    let filtered = query.agent.is_some() || query.prefix.is_some();
    let limit = if filtered { None } else { query.limit.map(|l| l.saturating_add(query.offset)) };
    let summaries = store.list_runs(RunFilter { status: query.status, limit }).await?;
    let matching = summaries.into_iter().filter(|s| {
        query.agent.as_ref().is_none_or(|a| *a == s.agent_id)
            && query.prefix.as_ref().is_none_or(|p| s.run_id.starts_with(p.as_str()))
    });
    let page = matching.skip(query.offset).take(query.limit.unwrap_or(usize::MAX));
    let mut rows = Vec::new();
    // Only the page's runs are read whole.
    for s in page {
        let Some(record) = store.get_run(&s.run_id).await? else { continue }; // deleted since listed
        let journal = store.steps(&s.run_id).await?;
        let undecided = pending_approvals(&record).len() - recorded_decisions(&record, &journal).len();
        let steps = journal.len();
        rows.push(RunRow {
            run_id: s.run_id,
            agent_id: s.agent_id,
            status: s.status,
            steps,
            updated_at_ms: s.updated_at_ms,
            pending_approvals: undecided,
        });
    }
    Ok(rows)
}

/// One run, with its journal.
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    /// Run id.
    pub run_id: String,
    /// The agent that owns the run.
    pub agent_id: String,
    /// Lifecycle status.
    pub status: RunStatus,
    /// Current turn epoch.
    pub epoch: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Last update, milliseconds since the Unix epoch.
    pub updated_at_ms: i64,
    /// Tokens of every model step in the journal, summed.
    pub usage: Usage,
    /// Dollars of every priced model step in the journal, summed; `None` when no step was
    /// priced (the runtime had no `Pricing` for its model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// The journal, in ordinal order.
    pub steps: Vec<StepView>,
    /// Approvals the run waits for.
    pub pending: Vec<PendingView>,
    /// Every decision in the journal, in order: who, when, from where, why.
    pub decisions: Vec<DecisionView>,
    /// What was said: user inputs, the model's text and kept reasoning summaries.
    pub conversation: Vec<Utterance>,
}

/// A journaled decision with its audit trail.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionView {
    /// The approval step's position in the journal.
    pub ordinal: u64,
    /// The request decided.
    pub request_id: String,
    /// The tool whose call was decided.
    pub tool: String,
    /// What was decided, by whom, when, from where, why.
    #[serde(flatten)]
    pub decision: RecordedDecision,
}

/// "approved by alice" / "denied by bob: reason".
pub fn decision_text(d: &RecordedDecision) -> String {
    if d.approved {
        format!("approved by {}", d.by)
    } else {
        format!("denied by {}{}", d.by, d.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())
    }
}

/// "via console from 10.0.0.7 at 2026-… (store clock)", as much as was recorded.
pub fn audit_text(d: &RecordedDecision) -> String {
    let mut parts = Vec::new();
    if let Some(c) = &d.channel {
        parts.push(format!("via {c}"));
    }
    if let Some(o) = &d.origin {
        parts.push(format!("from {o}"));
    }
    if let Some(at) = d.at_ms {
        let clock = match d.clock {
            Some(kuralle::inspect::DecisionClock::Store) => " (store clock)",
            Some(kuralle::inspect::DecisionClock::Process) => " (deciding process's clock)",
            None => "",
        };
        parts.push(format!("at {}{clock}", crate::time::timestamp(at)));
    }
    parts.join(" ")
}

/// A pending approval, and its decision once one is recorded (the run stays paused until its
/// owner resumes it).
#[derive(Debug, Clone, Serialize)]
pub struct PendingView {
    /// The request.
    #[serde(flatten)]
    pub request: PendingApproval,
    /// The recorded decision, if any.
    pub decision: Option<RecordedDecision>,
}

impl PendingView {
    /// "approved by alice" / "denied by bob: reason".
    pub fn decision_text(&self) -> Option<String> {
        self.decision.as_ref().map(decision_text)
    }
}

/// How a journaled step behaves when the run resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Replay {
    /// Finished or failed: a resumed run is answered from the journal.
    Replays,
    /// Intent without an outcome: a resumed run executes it again (or reports it
    /// indeterminate, for an `at_most_once` tool).
    Reruns,
    /// A `replay = false` tool: journaled for the record, always executed live.
    Live,
}

impl Replay {
    /// Short label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replays => "replays",
            Self::Reruns => "re-runs",
            Self::Live => "live",
        }
    }
}

/// One journal step as shown.
#[derive(Debug, Clone, Serialize)]
pub struct StepView {
    /// Position in the journal.
    pub ordinal: u64,
    /// model, tool, now, uuid or approval.
    pub kind: StepKind,
    /// Tool name, or `model`, `now`, `uuid`.
    pub name: String,
    /// running, finished or failed.
    pub status: StepStatus,
    /// The turn the step belongs to.
    pub epoch: u64,
    /// Effect key.
    pub key: String,
    /// Start time, milliseconds since the Unix epoch.
    pub started_at_ms: i64,
    /// Finish time, when finished.
    pub finished_at_ms: Option<i64>,
    /// `finished_at_ms - started_at_ms`, when finished.
    pub duration_ms: Option<i64>,
    /// The model's id for the call, for tool and approval steps it can be traced to.
    pub call_id: Option<String>,
    /// The call's arguments, when they can be traced to a model response.
    pub args: Option<Value>,
    /// The result, when finished.
    pub result: Option<Value>,
    /// The serialized typed error, when failed.
    pub error: Option<Value>,
    /// Tokens the step used, for a finished model step.
    pub usage: Option<Usage>,
    /// What the step cost in dollars, for a finished model step of a priced model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// What a resumed run does with this step.
    pub replay: Replay,
}

impl StepView {
    /// The first characters of the key.
    pub fn key_prefix(&self) -> &str {
        self.key.get(..12).unwrap_or(&self.key)
    }

    /// A one-line summary of what went in: the call's arguments.
    pub fn args_preview(&self, width: usize) -> String {
        self.args.as_ref().map(|a| preview(a, width)).unwrap_or_default()
    }

    /// A one-line summary of what came out.
    pub fn result_preview(&self, width: usize) -> String {
        if let Some(e) = &self.error {
            let message = e.get("message").and_then(Value::as_str).map(str::to_owned);
            let kind = e.get("kind").and_then(Value::as_str).unwrap_or("error");
            return clip(&format!("{kind}: {}", message.unwrap_or_else(|| e.to_string())), width);
        }
        let Some(r) = &self.result else { return String::new() };
        match self.kind {
            StepKind::Model => {
                // A response's parts, or the text and calls of one journaled before parts.
                let (calls, text): (Vec<&str>, String) = match r["parts"].as_array() {
                    Some(parts) => (
                        parts
                            .iter()
                            .filter(|p| p["type"] == "tool_call")
                            .filter_map(|p| p["call"]["name"].as_str())
                            .collect(),
                        parts.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect(),
                    ),
                    None => (
                        r["tool_calls"]
                            .as_array()
                            .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
                            .unwrap_or_default(),
                        r["text"].as_str().unwrap_or_default().to_owned(),
                    ),
                };
                if calls.is_empty() {
                    clip(&format!("\"{text}\""), width)
                } else {
                    clip(&format!("calls {}", calls.join(", ")), width)
                }
            }
            StepKind::Approval => {
                let by = r["by"].as_str().unwrap_or("?");
                if r["approved"].as_bool() == Some(true) {
                    clip(&format!("approved by {by}"), width)
                } else {
                    let reason = r["reason"].as_str().map(|x| format!(": {x}")).unwrap_or_default();
                    clip(&format!("denied by {by}{reason}"), width)
                }
            }
            _ => preview(r, width),
        }
    }
}

/// The run `run_id` with its steps and pending approvals.
pub async fn show(store: &dyn RunStore, run_id: &str) -> Result<RunDetail, CliError> {
    let mut record = store.get_run(run_id).await?.ok_or_else(|| CliError::UnknownRun(run_id.to_owned()))?;
    let mut steps = store.steps(run_id).await?;
    // Everything below is for display: the tools' sensitive values never reach it.
    let redact = Redactions::of(&record);
    redact.record(&mut record);
    steps.iter_mut().for_each(|s| redact.step(s));
    let mut calls = step_calls(&key_run(&record), &steps);
    let conversation = conversation(&record, &steps);
    let mut decided = recorded_decisions(&record, &steps);
    let pending = pending_approvals(&record)
        .into_iter()
        .map(|request| PendingView { decision: decided.remove(&request.request_id), request })
        .collect();
    let decisions = steps
        .iter()
        .filter(|s| s.kind == StepKind::Approval && s.status == StepStatus::Finished)
        .filter_map(|s| {
            let decision = s.result.as_ref()?.decode::<RecordedDecision>().ok()?;
            // A request id is `approval-` and the first 24 hex digits of its decision's key.
            let request_id = format!("approval-{}", s.key.get(..24).unwrap_or(&s.key));
            Some(DecisionView { ordinal: s.ordinal, request_id, tool: s.name.clone(), decision })
        })
        .collect();
    let steps: Vec<StepView> = steps.into_iter().map(|s| step_view(s, &mut calls)).collect();
    let mut usage = Usage::default();
    for u in steps.iter().filter_map(|s| s.usage) {
        usage += u;
    }
    let cost_usd = steps.iter().filter_map(|s| s.cost_usd).reduce(|a, b| a + b);
    Ok(RunDetail {
        usage,
        cost_usd,
        run_id: record.run_id.clone(),
        agent_id: record.agent_id.clone(),
        status: record.status,
        epoch: record.epoch,
        created_at_ms: record.created_at_ms,
        updated_at_ms: record.updated_at_ms,
        steps,
        pending,
        decisions,
        conversation,
    })
}

fn step_view(s: StepRecord, calls: &mut std::collections::HashMap<u64, kuralle::inspect::StepCall>) -> StepView {
    let call = calls.remove(&s.ordinal);
    let replay = if s.key.contains(":nonreplay:") {
        Replay::Live
    } else if s.status == StepStatus::Running {
        Replay::Reruns
    } else {
        Replay::Replays
    };
    let spent = match (s.kind, &s.result) {
        (StepKind::Model, Some(text)) => text.decode::<ModelUsage>().ok(),
        _ => None,
    };
    StepView {
        usage: spent.as_ref().map(|m| m.usage),
        cost_usd: spent.and_then(|m| m.cost_usd),
        ordinal: s.ordinal,
        kind: s.kind,
        name: s.name,
        status: s.status,
        epoch: s.epoch,
        key: s.key,
        started_at_ms: s.started_at_ms,
        finished_at_ms: s.finished_at_ms,
        duration_ms: s.finished_at_ms.map(|f| (f - s.started_at_ms).max(0)),
        call_id: call.as_ref().map(|c| c.call_id.clone()),
        args: call.map(|c| c.args),
        // A tree for display: previews and pages walk into it.
        result: s.result.map(|text| text.to_value()),
        error: s.error.map(|text| text.to_value()),
        replay,
    }
}

/// The usage of a journaled model response, read without the rest of it.
#[derive(serde::Deserialize)]
struct ModelUsage {
    #[serde(default)]
    usage: Usage,
    #[serde(default)]
    cost_usd: Option<f64>,
}

/// Dollars for a person: `$0.0123` (four decimals below a dollar, two above).
pub fn dollars(usd: f64) -> String {
    if usd.abs() < 1.0 { format!("${usd:.4}") } else { format!("${usd:.2}") }
}

/// Tokens as one line: `1200 in (800 cached, 100 written), 56 out (12 reasoning)`.
pub fn tokens(u: &Usage) -> String {
    let mut input = Vec::new();
    if u.cache_read_tokens > 0 {
        input.push(format!("{} cached", u.cache_read_tokens));
    }
    if u.cache_write_tokens > 0 {
        input.push(format!("{} written to cache", u.cache_write_tokens));
    }
    let input = if input.is_empty() { String::new() } else { format!(" ({})", input.join(", ")) };
    let output = if u.reasoning_tokens > 0 { format!(" ({} reasoning)", u.reasoning_tokens) } else { String::new() };
    format!("{} in{input}, {} out{output}", u.input_tokens, u.output_tokens)
}

/// Compact JSON, clipped to `width` characters.
pub fn preview(value: &Value, width: usize) -> String {
    match value {
        Value::String(s) => clip(&format!("\"{s}\""), width),
        other => clip(&other.to_string(), width),
    }
}

/// At most `width` characters, with `…` when cut; never splits a character, never spans lines.
/// Escapes and control characters are removed and hidden characters shown (see
/// [`crate::clean::terminal`]) before the cut, so a cut never hides them.
pub fn clip(s: &str, width: usize) -> String {
    let one_line = crate::clean::terminal(s, false);
    if one_line.chars().count() <= width {
        return one_line;
    }
    let mut out: String = one_line.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_counts_characters_and_flattens_lines() {
        assert_eq!(clip("héllo wörld", 6), "héllo…");
        assert_eq!(clip("a\nb", 10), "a b");
        assert_eq!(clip("short", 10), "short");
    }
}
