//! Planning a model response's calls: parsing and validating arguments, deriving journal
//! keys, applying the approval policy and recorded decisions, and answering replays, all
//! before anything runs.

use std::{panic::AssertUnwindSafe, sync::Arc};

use serde_json::Value;

use super::TurnCtx;
use crate::approval::{Pending, PendingApproval, RecordedDecision, RequestId};
use crate::input::text::RawArgs;
use crate::{
    error::ToolError,
    journal::{Journal, Lookup, approval_key, override_key},
    model::ToolCallRequest,
    policy::Verdict,
    tool::{PreparedCall, Tool},
};

/// A call after validation and classification: what it is ([`Head`]) and what validation
/// said of it ([`Check`]), which [`plan`] consumes.
pub(crate) struct Planned {
    pub(crate) head: Head,
    pub(crate) check: Check,
}

/// What a call is, kept for its events, span and outcome after it is planned.
pub(crate) struct Head {
    /// The request; its `arguments` text has moved into `args`.
    pub(crate) req: ToolCallRequest,
    pub(crate) callsite: String,
    /// The arguments: the model's raw text, parsed into a `Value` only when something needs
    /// one (a policy, an approval, an event someone receives, a `parallel_safe = expr`).
    pub(crate) args: RawArgs,
    pub(crate) parallel: bool,
}

/// What validation said of a call.
pub(crate) enum Check {
    /// No tool by that name, or arguments that are not a JSON object.
    Refused(ToolError),
    /// Arguments that are JSON but not this tool's input.
    Invalid(Arc<dyn Tool>, ToolError),
    /// Validated, ready to plan.
    Valid(Arc<dyn Tool>, Box<dyn PreparedCall>),
}

impl Check {
    /// The tool, when the call names one and its arguments are JSON.
    pub(crate) fn tool(&self) -> Option<&Arc<dyn Tool>> {
        match self {
            Self::Refused(_) => None,
            Self::Invalid(tool, _) | Self::Valid(tool, _) => Some(tool),
        }
    }
}

impl Planned {
    /// Validates `args` for `tool` (found by the request's name, if it was) and classifies the call.
    pub(crate) fn new(
        mut req: ToolCallRequest,
        callsite: String,
        args: RawArgs,
        tool: Result<Arc<dyn Tool>, ToolError>,
    ) -> Self {
        req.arguments = String::new();
        let (check, parallel) = match tool {
            Err(e) => (Check::Refused(e), false),
            Ok(tool) => {
                let prepared = match args.given() {
                    Some(value) => tool.prepare(value),
                    None => tool.prepare_raw(&args),
                };
                // A refused call may still be valid JSON (then only validation refused it):
                // the text was parsed on the way to that answer, and is not parsed again.
                match prepared {
                    Err(e) if prepared_on_invalid_json(&args, tool.name()) => (Check::Refused(e), false),
                    prepared => {
                        let parallel = is_parallel_safe(tool.as_ref(), &args);
                        let check = match prepared {
                            Ok(call) => Check::Valid(tool, call),
                            Err(e) => Check::Invalid(tool, e),
                        };
                        (check, parallel)
                    }
                }
            }
        };
        Self { head: Head { req, callsite, args, parallel }, check }
    }
}

/// Whether the arguments are not a JSON object `parse_args` accepts.
fn prepared_on_invalid_json(args: &RawArgs, tool: &str) -> bool {
    args.value(tool).is_err()
}

/// Whether `tool` allows this call to run beside its siblings. A panicking predicate fails
/// closed: the model can never make a call parallel-safe.
fn is_parallel_safe(tool: &dyn Tool, args: &RawArgs) -> bool {
    std::panic::catch_unwind(AssertUnwindSafe(|| tool.parallel_safe_raw(args))).unwrap_or(false)
}

/// Validates and classifies one model response's calls, in source order; the `i`-th call gets
/// callsite `first_callsite + i`.
pub(super) fn parse(turn: &TurnCtx, calls: Vec<ToolCallRequest>, first_callsite: u64) -> Vec<Planned> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, mut req)| {
            let tool = match turn.tools.get(&req.name) {
                None => Err(ToolError::UnknownTool { tool: req.name.to_string(), available: turn.tools.names() }),
                Some(tool) => Ok(Arc::clone(tool)),
            };
            let args = RawArgs::new(std::mem::take(&mut req.arguments));
            Planned::new(req, (first_callsite + i as u64).to_string(), args, tool)
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
pub(crate) fn plan(turn: &TurnCtx, p: &Head, check: Check) -> Plan {
    // Validated once, in `Planned::new`: the one place a call's arguments became the tool's
    // typed input.
    let (tool, call) = match check {
        Check::Refused(e) | Check::Invalid(_, e) => return Plan::Done(Err(e), false),
        Check::Valid(tool, call) => (tool, call),
    };
    let args = &p.args;
    let j = &turn.journal;
    let user_key = call.idempotency_key();
    let reused = user_key.is_some();
    let key = match user_key {
        Some(user_key) => override_key(j.key_run(), j.epoch(), tool.name(), &user_key),
        None => match args.given() {
            Some(value) => j.tool_key(&p.callsite, tool.name(), value),
            // The same key as of the parsed `Value`, without building it.
            None => match j.tool_key_raw(&p.callsite, tool.name(), args.text()) {
                Ok(key) => key,
                Err(e) => {
                    let message = format!("the arguments are not valid JSON ({e})");
                    return Plan::Done(Err(ToolError::invalid_input(tool.name(), message)), false);
                }
            },
        },
    };
    // The policy comes before the journal and before `replay = false`, so neither a replay,
    // a non-replayed tool nor a nested call gets around it. A policy without rules allows
    // everything without looking at the arguments.
    let verdict = if turn.policy.allows_everything() {
        Verdict::Allow
    } else {
        match args.value(tool.name()) {
            Ok(value) => turn.policy.check(tool.name(), value),
            Err(e) => return Plan::Done(Err(e), false),
        }
    };
    let needs_approval = match verdict {
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
        let args = match args.value(tool.name()) {
            Ok(value) => value,
            Err(e) => return Plan::Done(Err(e), false),
        };
        let decision_key = approval_key(j.key_run(), j.epoch(), &key, tool.name(), args);
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
                    request_id: RequestId::for_decision_key(&decision_key),
                    call_id: p.req.call_id.to_string(),
                    name: tool.name().to_owned(),
                    args: args.clone(),
                };
                return Plan::Pending(Pending { request, decision_key });
            }
        }
    }
    match lookup {
        Lookup::Fresh => Plan::Job(Job::Run(Ready { tool, call, key, ordinal: None, reused })),
        Lookup::Finished(v) => Plan::Done(Ok(v), true),
        Lookup::Failed(e) => Plan::Done(Err(replayed_error(tool.name(), e)), true),
        Lookup::Running(ordinal) if tool.at_most_once() => Plan::Job(Job::Indeterminate { key, ordinal }),
        Lookup::Running(ordinal) => Plan::Job(Job::Run(Ready { tool, call, key, ordinal: Some(ordinal), reused })),
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
