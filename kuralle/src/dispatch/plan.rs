//! Planning a model response's calls: parsing and validating arguments, deriving journal
//! keys, applying the approval policy and recorded decisions, and answering replays, all
//! before anything runs.

use std::{panic::AssertUnwindSafe, sync::Arc};

use serde_json::Value;

use super::{Pending, RecordedDecision, TurnCtx};
use crate::{
    PreparedCall, Tool, ToolCallRequest, ToolError, Verdict,
    journal::{Journal, Lookup, approval_key, override_key},
    runtime::event::PendingApproval,
    tool::parse_args,
};

/// A model-issued call after parsing and classification.
pub(crate) struct Planned {
    pub(crate) req: ToolCallRequest,
    pub(crate) callsite: String,
    /// The tool and its parsed arguments, or why the call cannot run (unknown tool, bad JSON).
    pub(crate) parsed: Result<(Arc<dyn Tool>, Value), ToolError>,
    pub(crate) parallel: bool,
}

/// Whether `tool` allows this call to run beside its siblings. A panicking predicate fails
/// closed: the model can never make a call parallel-safe.
fn is_parallel_safe(tool: &dyn Tool, args: &Value) -> bool {
    std::panic::catch_unwind(AssertUnwindSafe(|| tool.parallel_safe(args))).unwrap_or(false)
}

/// Parses and classifies one model response's calls, in source order; the `i`-th call gets
/// callsite `first_callsite + i`.
pub(super) fn parse(turn: &TurnCtx, calls: Vec<ToolCallRequest>, first_callsite: u64) -> Vec<Planned> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, req)| {
            let parsed = match turn.tools.get(&req.name) {
                None => Err(ToolError::UnknownTool { tool: req.name.clone(), available: turn.tools.names() }),
                Some(tool) => parse_args(&req.name, &req.arguments).map(|args| (Arc::clone(tool), args)),
            };
            let parallel = parsed.as_ref().is_ok_and(|(tool, args)| is_parallel_safe(tool.as_ref(), args));
            Planned { req, callsite: (first_callsite + i as u64).to_string(), parsed, parallel }
        })
        .collect()
}

/// A call ready to execute: validated, keyed, and with its journal position known.
pub(crate) struct Ready {
    pub(crate) tool: Arc<dyn Tool>,
    pub(crate) call: Box<dyn PreparedCall>,
    pub(crate) key: String,
    pub(crate) ordinal: Option<u64>,
    /// Whether the key is the user's idempotency key, which another call of this turn may
    /// share (and then replays this one's result).
    pub(crate) reused: bool,
}

/// How a call is answered, decided before anything runs.
pub(crate) enum Plan {
    /// Answered without running: a validation error, or a replay (`true`).
    Done(Result<Value, ToolError>, bool),
    /// A `needs_approval` call without a recorded decision: the run pauses for it.
    Pending(Pending),
    /// Answered by work in the batch's pool.
    Job(Job),
}

/// A call's work in its batch.
pub(crate) enum Job {
    /// To run (its intent is written first unless it has an ordinal already).
    Run(Ready),
    /// An `at_most_once` call whose earlier attempt was cut off: never re-run, its outcome
    /// journaled as indeterminate.
    Indeterminate { key: String, ordinal: u64 },
}

/// Decides, without running anything, how a call is answered.
pub(crate) fn plan(turn: &TurnCtx, p: &Planned) -> Plan {
    let (tool, args) = match &p.parsed {
        Ok((tool, args)) => (tool, args),
        Err(e) => return Plan::Done(Err(e.clone()), false),
    };
    // The one place a call's arguments become the tool's typed input.
    let call = match tool.prepare(args) {
        Ok(c) => c,
        Err(e) => return Plan::Done(Err(e), false),
    };
    let j = &turn.journal;
    let user_key = call.idempotency_key();
    let reused = user_key.is_some();
    let key = match user_key {
        Some(user_key) => override_key(j.run_id(), j.epoch(), tool.name(), &user_key),
        None => j.tool_key(&p.callsite, tool.name(), args),
    };
    // The policy comes before the journal and before `replay = false`, so neither a replay,
    // a non-replayed tool nor a nested call gets around it.
    let needs_approval = match turn.policy.check(tool.name(), args) {
        Verdict::Deny { reason } => {
            return Plan::Done(
                Err(ToolError::Denied { tool: tool.name().to_owned(), by: "policy".into(), reason }),
                false,
            );
        }
        Verdict::Ask => true,
        Verdict::Allow => tool.needs_approval(),
    };
    // `replay = false`: never answered from the journal, so each execution is journaled (for
    // the record) under a key of its own, `<key>:nonreplay:<n>` for the n-th execution. The
    // guards below still apply: each execution needs its own approval.
    let key = if tool.replay() { key } else { nonreplay_key(j, &key) };
    let lookup = j.lookup(&key);
    if needs_approval && matches!(lookup, Lookup::Fresh | Lookup::Running(_)) {
        let decision_key = approval_key(j.run_id(), j.epoch(), &key, tool.name(), args);
        match j.lookup(&decision_key) {
            Lookup::Finished(v) => match serde_json::from_value::<RecordedDecision>(v) {
                Ok(d) if d.approved => {}
                Ok(d) => {
                    return Plan::Done(
                        Err(ToolError::Denied { tool: tool.name().to_owned(), by: d.by, reason: d.reason }),
                        false,
                    );
                }
                Err(e) => {
                    return Plan::Done(Err(ToolError::failed(tool.name(), format!("unreadable decision: {e}"))), false);
                }
            },
            _ => {
                let request = PendingApproval {
                    request_id: format!("approval-{}", &decision_key[..24]),
                    call_id: p.req.call_id.clone(),
                    name: tool.name().to_owned(),
                    args: args.clone(),
                };
                return Plan::Pending(Pending { request, decision_key });
            }
        }
    }
    match lookup {
        Lookup::Fresh => Plan::Job(Job::Run(Ready { tool: tool.clone(), call, key, ordinal: None, reused })),
        Lookup::Finished(v) => Plan::Done(Ok(v), true),
        Lookup::Failed(e) => Plan::Done(Err(replayed_error(tool.name(), e)), true),
        Lookup::Running(ordinal) if tool.at_most_once() => Plan::Job(Job::Indeterminate { key, ordinal }),
        Lookup::Running(ordinal) => {
            Plan::Job(Job::Run(Ready { tool: tool.clone(), call, key, ordinal: Some(ordinal), reused }))
        }
    }
}

/// The key of the next execution of a `replay = false` call: the first `<key>:nonreplay:<n>`
/// the journal does not hold.
fn nonreplay_key(j: &Journal, key: &str) -> String {
    let mut n = 0u64;
    loop {
        let candidate = format!("{key}:nonreplay:{n}");
        if matches!(j.lookup(&candidate), Lookup::Fresh) {
            return candidate;
        }
        n += 1;
    }
}

/// A journaled error read back as the typed error it was, or a failure quoting it.
pub(crate) fn replayed_error(tool: &str, e: Value) -> ToolError {
    serde_json::from_value(e.clone()).unwrap_or_else(|_| ToolError::failed(tool, format!("(journaled) {e}")))
}
