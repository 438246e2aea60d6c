//! One batch of calls: intents in one append, calls that run through a bounded pool (a lone
//! call inline), answers back in source order, events around them.

use std::sync::Arc;

use futures::{StreamExt, stream};
use serde_json::Value;
use tracing::Instrument;

use super::{
    CallOutcome, TurnCtx,
    call::{self, CallSite},
    plan::{self, Head, Job, Plan, Planned, Ready},
};
use crate::{
    approval::Pending,
    error::{RunError, ToolError},
    event::{BatchCall, Event},
    journal::Intent,
    store::StepKind,
    trace,
};

/// A call's answer within its batch: its result and whether it was replayed, or the approval
/// it waits for.
type Slot = Result<(Result<Value, ToolError>, bool), Pending>;

/// A call of the batch that runs, as it waits for its turn in the pool: its place in the
/// batch, its job, its ids (borrowed from its head) and its span.
struct Queued<'a> {
    i: usize,
    job: Job,
    call_id: &'a str,
    callsite: &'a str,
    name: &'a str,
    span: tracing::Span,
    started: Option<std::time::Instant>,
}

/// Runs a queued call under its span; returns its place in the batch and its result.
fn queued<'a>(
    turn: &'a Arc<TurnCtx>,
    q: Queued<'a>,
    alone: bool,
    capture: bool,
) -> impl Future<Output = (usize, Result<Value, ToolError>)> + Send + 'a {
    let Queued { i, job, call_id, callsite, name, span, started } = q;
    async move {
        let result = match job {
            Job::Run(ready) => {
                let call = CallSite { call_id, callsite, parent: None, top_level: true, alone };
                call::execute_journaled(turn, ready, call).instrument(span.clone()).await
            }
            Job::Indeterminate { key, ordinal } => {
                call::indeterminate(turn, name, key, ordinal).instrument(span.clone()).await
            }
        };
        trace::tool_done(&span, &result, false, started, capture.then_some((name, &turn.redact)));
        (i, result)
    }
}

/// Runs one batch; returns its outcomes in source order and the calls waiting for approval.
pub(super) async fn run(
    turn: &Arc<TurnCtx>,
    batch: Vec<Planned>,
) -> Result<(Vec<CallOutcome>, Vec<Pending>), RunError> {
    // Built before any is sent: a planned call holds its validated call, which is `Send` but
    // not `Sync`, so no borrow of the batch may live across an await. Sent once the batch is
    // known to start (no run limit refuses it).
    let mut announce = Vec::new();
    if turn.events.is_listening() {
        announce.reserve(batch.len() + 1);
        announce.push(Event::ToolBatchStart {
            calls: batch
                .iter()
                .map(|p| BatchCall { call_id: p.head.req.call_id.clone(), name: p.head.req.name.clone() })
                .collect(),
        });
        announce.extend(batch.iter().map(|p| {
            let head = &p.head;
            let mut args = match p.check.tool().map(|_| head.args.value(&head.req.name)) {
                Some(Ok(args)) => args.clone(),
                _ => Value::String(head.args.text().to_owned()),
            };
            if let Some(tool) = p.check.tool() {
                tool.redaction().args(&mut args);
            }
            Event::ToolCall { call_id: head.req.call_id.clone(), name: head.req.name.clone(), args }
        }));
    }

    let interrupted = turn.interrupt.is_cancelled();
    // Sized to the batch, not collected by `unzip`: that grows each vector from empty, to room
    // for four calls at least (about 1.5 KiB for a lone call's head and plan), and both are
    // held across the intents' commit, where every run of a wave of answers waits at once.
    let mut heads: Vec<Head> = Vec::with_capacity(batch.len());
    let mut plans: Vec<Plan> = Vec::with_capacity(batch.len());
    for Planned { head, check } in batch {
        let plan = match check.tool() {
            // An interrupt before the batch started: nothing in it runs, but every call still
            // gets a result so the transcript never holds a dangling call.
            Some(t) if interrupted => Plan::Done(Err(ToolError::Cancelled { tool: t.name().to_owned() }), false),
            _ => plan::plan(turn, &head, check),
        };
        heads.push(head);
        plans.push(plan);
    }

    // Calls of the batch that share a key (a tool's own idempotency key, called twice with the
    // same arguments) are one effect: the first runs, the others take its answer. Without this
    // both would write the same intent, and the store refuses the second.
    let leaders = shared_keys(&plans);

    // Intents for every fresh call of the batch, in source order, in one append. The fresh
    // calls are found again each time they are needed (counted, written as intents, given
    // their ordinals), not collected: a vector for them was one allocation more per batch.
    // Counted first, so that the intents take room for exactly them (a filtered `collect`
    // starts at room for four), and none when the journal answers the whole batch.
    let fresh = |i: usize, r: &Ready| r.ordinal.is_none() && leaders.get(i).is_none_or(Option::is_none);
    // In a block: the plans hold calls that are `Send` but not `Sync`, so no borrow of them
    // may live across an await.
    let intents = {
        let intents_of = || plans.iter().enumerate().filter_map(|(i, pl)| intent(pl, |r| fresh(i, r)));
        let mut intents = Vec::with_capacity(intents_of().count());
        intents.extend(intents_of());
        intents
    };
    // A batch that would pass a run limit starts no call: refused before its first intent.
    // Boxed: its future (over 800 bytes) would otherwise size this one, which every run
    // of a wave of answers holds while its intents commit.
    if let Some(exceeded) = turn.budget.before_batch(&turn.journal.spent(), intents.len() as u64) {
        return Err(Box::pin(crate::runtime::limits::refuse(turn, exceeded)).await);
    }
    for event in announce {
        turn.emit(event).await;
    }
    let ordinals = turn.journal.begin(&intents).await?;
    drop(intents);
    let mut ordinals = ordinals.into_iter();
    for (i, pl) in plans.iter_mut().enumerate() {
        if let Plan::Job(Job::Run(r)) = pl
            && fresh(i, r)
        {
            r.ordinal = ordinals.next();
        }
    }

    // Answers known without running (replays, validation errors, pending approvals) fill
    // their slot at once; only calls that run go through the bounded pool.
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(heads.len());
    let followers = leaders.iter().filter(|l| l.is_some()).count();
    let runs = plans.iter().filter(|pl| matches!(pl, Plan::Job(_))).count() - followers;
    // What each job needs, not its future: a call's future is about a kilobyte, built where
    // it is awaited (a lone call's in a box of its own, with no vector for it).
    let mut jobs: Vec<Queued<'_>> = Vec::with_capacity(runs);
    // A lone call (every serial call) runs without a task of its own; see `execute`.
    let alone = runs == 1;
    let capture = turn.capture_content;
    for (i, (p, plan)) in heads.iter().zip(plans).enumerate() {
        let arguments = capture.then(|| {
            let mut text = p.args.text().to_owned();
            turn.redact.args_text(&p.req.name, &mut text);
            text
        });
        let span = trace::tool_span(turn.journal.run_id(), &p.req.call_id, &p.req.name, arguments.as_deref());
        let started = trace::started(&span);
        match plan {
            Plan::Done(result, replayed) => {
                trace::tool_done(&span, &result, replayed, started, capture.then_some((&p.req.name, &turn.redact)));
                slots.push(Some(Ok((result, replayed))));
            }
            Plan::Pending(pending) => {
                trace::tool_pending(&span, started);
                slots.push(Some(Err(pending)));
            }
            // Answered below from the call whose key it shares.
            Plan::Job(_) if leaders.get(i).is_some_and(Option::is_some) => slots.push(None),
            Plan::Job(job) => {
                slots.push(None);
                // Borrowed, not copied: the jobs are polled here, and end before the heads
                // are taken apart below.
                let (call_id, callsite, name) = (p.req.call_id.as_str(), p.callsite.as_str(), p.req.name.as_str());
                jobs.push(Queued { i, job, call_id, callsite, name, span, started });
            }
        }
    }
    // A batch answered wholly from the journal (every call of a resumed run) builds no pool:
    // one per serial call was a twentieth of resuming 10,000 serial calls.
    match jobs.len() {
        0 => {}
        1 => {
            // Boxed, for the time it runs: in this future's own state its kilobyte would be
            // held by every run waiting above for its intents to commit, as a wave of answers
            // does. At 1,024 bytes (release build), glibc's per-thread cache usually serves the
            // box (sizes up to 1,032, seven free chunks each), without its arena's lock.
            let (i, result) = Box::pin(queued(turn, jobs.pop().expect("one job"), alone, capture)).await;
            slots[i] = Some(Ok((result, false)));
        }
        _ => {
            // Built in a loop, not mapped in the stream: a closure kept in this future makes
            // it lose `Send` for every lifetime (the compiler cannot prove it general enough).
            let mut pool = Vec::with_capacity(jobs.len());
            for q in jobs.drain(..) {
                pool.push(queued(turn, q, alone, capture));
            }
            let ran: Vec<_> = stream::iter(pool).buffer_unordered(turn.max_concurrency.max(1)).collect().await;
            for (i, result) in ran {
                slots[i] = Some(Ok((result, false)));
            }
        }
    }
    // The jobs borrowed the heads, which are taken apart below.
    drop(jobs);
    for (i, leader) in leaders.iter().enumerate() {
        if let Some(leader) = *leader {
            let answer = slots[leader].clone();
            slots[i] = answer;
        }
    }

    let mut pending = Vec::new();
    let mut outcomes = Vec::with_capacity(heads.len());
    for (p, slot) in heads.into_iter().zip(slots) {
        match slot.expect("every slot is filled: answered at once or by its job") {
            Ok((result, replayed)) => {
                let arguments = p.args.into_text();
                outcomes.push(CallOutcome { call_id: p.req.call_id, name: p.req.name, arguments, result, replayed });
            }
            // One approval per key: calls that share one are decided together.
            Err(waiting) if pending.iter().any(|p: &Pending| p.request.request_id == waiting.request.request_id) => {}
            Err(waiting) => pending.push(waiting),
        }
    }
    for o in outcomes.iter().take_while(|_| turn.events.is_listening()) {
        let mut result = o.model_value();
        if o.result.is_ok()
            && let Some(tool) = turn.tools.get(&o.name)
        {
            tool.redaction().result(&mut result);
        }
        turn.emit(Event::ToolResult {
            call_id: o.call_id.clone(),
            name: o.name.clone(),
            result,
            is_error: o.result.is_err(),
            replayed: o.replayed,
        })
        .await;
    }
    Ok((outcomes, pending))
}

/// The intent a planned call writes, if it is a call to run that `fresh` says has none yet.
fn intent<'p>(plan: &'p Plan, fresh: impl FnOnce(&Ready) -> bool) -> Option<Intent<'p>> {
    match plan {
        Plan::Job(Job::Run(r)) if fresh(r) => Some((r.key.as_str(), StepKind::Tool, r.tool.name())),
        _ => None,
    }
}

/// For each planned call, the earlier call of the batch whose key it shares, if any. Empty when
/// no two calls share a key (the common case costs no map).
fn shared_keys(plans: &[Plan]) -> Vec<Option<usize>> {
    fn key(pl: &Plan) -> Option<&str> {
        match pl {
            Plan::Job(Job::Run(r)) => Some(r.key.as_str()),
            Plan::Job(Job::Indeterminate { key, .. }) => Some(key.as_str()),
            _ => None,
        }
    }
    let jobs = plans.iter().filter_map(key).count();
    if jobs < 2 {
        return Vec::new();
    }
    let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::with_capacity(jobs);
    let mut leaders = vec![None; plans.len()];
    let mut shared = false;
    for (i, pl) in plans.iter().enumerate() {
        if let Some(k) = key(pl) {
            match first.entry(k) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    leaders[i] = Some(*e.get());
                    shared = true;
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(i);
                }
            }
        }
    }
    if shared { leaders } else { Vec::new() }
}
