//! Tool dispatch: one model response's calls, in batches of consecutive parallel-safe calls
//! with barriers between them, bounded concurrency, timeouts, interrupts, journaling, and
//! results in source order whatever the completion order.

use std::{
    panic::AssertUnwindSafe,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures::{FutureExt, StreamExt, stream};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    Event, Policy, PreparedCall, RunError, StepKind, StepOutcome, Tool, ToolCallRequest, ToolContext, ToolError,
    ToolEvent, ToolSet, Verdict,
    journal::{Journal, Lookup, approval_key, override_key},
    runtime::event::{BatchCall, EventSender, PendingApproval},
    tool::parse_args,
    trace,
};

/// How long a timed-out or interrupted call may take to notice its token before it is dropped.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_millis(50);

/// Everything dispatch needs from the turn it runs in.
pub(crate) struct TurnCtx {
    pub(crate) journal: Journal,
    pub(crate) tools: ToolSet,
    pub(crate) events: EventSender,
    pub(crate) interrupt: CancellationToken,
    pub(crate) max_concurrency: usize,
    pub(crate) max_result_bytes: usize,
    /// The agent's approval policy, checked in [`plan`] before anything else can answer a call.
    pub(crate) policy: Policy,
    /// A store failure inside a nested effect: it ends the run after the current batch.
    pub(crate) fatal: Mutex<Option<RunError>>,
}

impl TurnCtx {
    async fn emit(&self, event: Event) {
        self.events.send(event).await;
    }

    fn set_fatal(&self, e: RunError) {
        self.fatal.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(e);
    }

    pub(crate) fn take_fatal(&self) -> Option<RunError> {
        self.fatal.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A tool call's outcome as dispatch reports it.
#[derive(Debug, Clone)]
pub(crate) struct CallOutcome {
    pub(crate) call_id: String,
    pub(crate) name: String,
    pub(crate) result: Result<Value, ToolError>,
    pub(crate) replayed: bool,
}

impl CallOutcome {
    /// The value the model receives: the result, or an error object.
    pub(crate) fn model_value(&self) -> Value {
        match &self.result {
            Ok(v) => v.clone(),
            Err(e) => error_value(e),
        }
    }

    /// [`model_value`](Self::model_value), consuming the outcome.
    pub(crate) fn into_model_value(self) -> Value {
        match self.result {
            Ok(v) => v,
            Err(e) => error_value(&e),
        }
    }
}

/// What the model receives for a failed call.
pub(crate) fn error_value(e: &ToolError) -> Value {
    match e {
        ToolError::Denied { tool, by, reason } => json!({
            "__denied": true,
            "toolName": tool,
            "deniedBy": by,
            "message": format!(
                "The \"{tool}\" action was not approved by {by}.{} Tell the user it was declined; do not retry it.",
                reason.as_deref().map(|r| format!(" Reason: {r}.")).unwrap_or_default()
            ),
        }),
        other => {
            let kind = serde_json::to_value(other).ok().and_then(|v| v.get("kind").cloned()).unwrap_or(Value::Null);
            json!({"error": true, "kind": kind, "message": other.to_string()})
        }
    }
}

/// A model-issued call after parsing and classification.
struct Planned {
    req: ToolCallRequest,
    callsite: String,
    /// The tool and its parsed arguments, or why the call cannot run (unknown tool, bad JSON).
    parsed: Result<(Arc<dyn Tool>, Value), ToolError>,
    parallel: bool,
}

/// Whether `tool` allows this call to run beside its siblings. A panicking predicate fails
/// closed: the model can never make a call parallel-safe.
fn is_parallel_safe(tool: &dyn Tool, args: &Value) -> bool {
    std::panic::catch_unwind(AssertUnwindSafe(|| tool.parallel_safe(args))).unwrap_or(false)
}

/// Runs one model response's calls; returns their outcomes in source order. Callsites
/// `first_callsite..first_callsite + calls.len()` belong to these calls, in source order.
pub(crate) async fn dispatch(
    turn: &Arc<TurnCtx>,
    calls: Vec<ToolCallRequest>,
    first_callsite: u64,
) -> Result<Dispatched, RunError> {
    let planned: Vec<Planned> = calls
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
        .collect();

    let mut done = Dispatched::default();
    let mut rest = planned.into_iter().peekable();
    while let Some(first) = rest.next() {
        let mut batch = vec![first];
        if batch[0].parallel {
            while rest.peek().is_some_and(|p| p.parallel) {
                batch.extend(rest.next());
            }
        }
        let (outcomes, pending) = run_batch(turn, batch).await?;
        done.outcomes.extend(outcomes);
        if let Some(e) = turn.take_fatal() {
            return Err(e);
        }
        if !pending.is_empty() {
            // Later calls may depend on the pending one: nothing after it runs until the
            // decision arrives and the turn resumes.
            done.pending = pending;
            break;
        }
    }
    Ok(done)
}

/// What one model response's calls came to.
#[derive(Default)]
pub(crate) struct Dispatched {
    /// Outcomes of the calls that were answered, in source order.
    pub(crate) outcomes: Vec<CallOutcome>,
    /// Calls waiting for a human decision; non-empty means the run pauses.
    pub(crate) pending: Vec<Pending>,
}

/// A call ready to execute: validated, keyed, and with its journal position known.
struct Ready {
    tool: Arc<dyn Tool>,
    call: Box<dyn PreparedCall>,
    key: String,
    ordinal: Option<u64>,
    /// Whether the key is the user's idempotency key, which another call of this turn may
    /// share (and then replays this one's result).
    reused: bool,
}

enum Plan {
    /// Answered without running: a validation error, or a replay (`true`).
    Done(Result<Value, ToolError>, bool),
    /// A `needs_approval` call without a recorded decision: the run pauses for it.
    Pending(Pending),
    /// Answered by work in the batch's pool.
    Job(Job),
}

/// A call's work in its batch.
enum Job {
    /// To run (its intent is written first unless it has an ordinal already).
    Run(Ready),
    /// An `at_most_once` call whose earlier attempt was cut off: never re-run, its outcome
    /// journaled as indeterminate.
    Indeterminate { key: String, ordinal: u64 },
}

/// A call waiting for a human decision, and the journal key its decision is recorded under.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Pending {
    pub(crate) request: PendingApproval,
    pub(crate) decision_key: String,
}

/// A recorded human decision on a `needs_approval` call.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RecordedDecision {
    pub(crate) approved: bool,
    pub(crate) by: String,
    pub(crate) reason: Option<String>,
}

/// Decides, without running anything, how a call is answered.
fn plan(turn: &TurnCtx, p: &Planned) -> Plan {
    let (tool, args) = match &p.parsed {
        Ok((tool, args)) => (tool, args),
        Err(e) => return Plan::Done(Err(e.clone()), false),
    };
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

fn replayed_error(tool: &str, e: Value) -> ToolError {
    serde_json::from_value(e.clone()).unwrap_or_else(|_| ToolError::failed(tool, format!("(journaled) {e}")))
}

/// A call's answer within its batch: its result and whether it was replayed, or the approval
/// it waits for.
type Slot = Result<(Result<Value, ToolError>, bool), Pending>;

async fn run_batch(turn: &Arc<TurnCtx>, batch: Vec<Planned>) -> Result<(Vec<CallOutcome>, Vec<Pending>), RunError> {
    turn.emit(Event::ToolBatchStart {
        calls: batch.iter().map(|p| BatchCall { call_id: p.req.call_id.clone(), name: p.req.name.clone() }).collect(),
    })
    .await;
    for p in &batch {
        let args = match &p.parsed {
            Ok((_, args)) => args.clone(),
            Err(_) => Value::String(p.req.arguments.clone()),
        };
        turn.emit(Event::ToolCall { call_id: p.req.call_id.clone(), name: p.req.name.clone(), args }).await;
    }

    let interrupted = turn.interrupt.is_cancelled();
    let mut plans: Vec<Plan> = batch
        .iter()
        .map(|p| match (&p.parsed, interrupted) {
            // An interrupt before the batch started: nothing in it runs, but every call
            // still gets a result so the transcript never holds a dangling call.
            (Ok((t, _)), true) => Plan::Done(Err(ToolError::Cancelled { tool: t.name().to_owned() }), false),
            _ => plan(turn, p),
        })
        .collect();

    // Intents for every fresh call of the batch, in source order, in one append.
    let fresh: Vec<&mut Ready> = plans
        .iter_mut()
        .filter_map(|pl| match pl {
            Plan::Job(Job::Run(r)) if r.ordinal.is_none() => Some(r),
            _ => None,
        })
        .collect();
    let intents = fresh.iter().map(|r| (r.key.clone(), StepKind::Tool, r.tool.name().to_owned())).collect();
    let ordinals = turn.journal.begin(intents).await?;
    for (r, ordinal) in fresh.into_iter().zip(ordinals) {
        r.ordinal = Some(ordinal);
    }

    // Answers known without running (replays, validation errors, pending approvals) fill
    // their slot at once; only calls that run go through the bounded pool.
    let mut slots: Vec<Option<Slot>> = Vec::with_capacity(batch.len());
    let mut jobs = Vec::new();
    let runs = plans.iter().filter(|pl| matches!(pl, Plan::Job(_))).count();
    // A lone call (every serial call) runs without a task of its own; see `execute`.
    let alone = runs == 1;
    for (i, (p, plan)) in batch.iter().zip(plans).enumerate() {
        let span = trace::tool_span(turn.journal.run_id(), &p.req.call_id, &p.req.name);
        let started = Instant::now();
        match plan {
            Plan::Done(result, replayed) => {
                trace::tool_done(&span, &result, replayed, started);
                slots.push(Some(Ok((result, replayed))));
            }
            Plan::Pending(pending) => {
                trace::tool_pending(&span, started);
                slots.push(Some(Err(pending)));
            }
            Plan::Job(job) => {
                slots.push(None);
                let turn = Arc::clone(turn);
                let call_id = p.req.call_id.clone();
                let callsite = p.callsite.clone();
                let name = p.req.name.clone();
                jobs.push(async move {
                    let result = match job {
                        Job::Run(ready) => {
                            let call = CallSite {
                                call_id: &call_id,
                                callsite: &callsite,
                                parent: None,
                                top_level: true,
                                alone,
                            };
                            execute_journaled(&turn, ready, call).instrument(span.clone()).await
                        }
                        Job::Indeterminate { key, ordinal } => {
                            indeterminate(&turn, &name, key, ordinal).instrument(span.clone()).await
                        }
                    };
                    trace::tool_done(&span, &result, false, started);
                    (i, result)
                });
            }
        }
    }
    let ran: Vec<_> = if jobs.len() == 1 {
        let mut jobs = jobs;
        vec![jobs.remove(0).await]
    } else {
        stream::iter(jobs).buffer_unordered(turn.max_concurrency.max(1)).collect().await
    };
    for (i, result) in ran {
        slots[i] = Some(Ok((result, false)));
    }

    let mut pending = Vec::new();
    let mut outcomes = Vec::with_capacity(batch.len());
    for (p, slot) in batch.into_iter().zip(slots) {
        match slot.expect("every slot is filled: answered at once or by its job") {
            Ok((result, replayed)) => {
                outcomes.push(CallOutcome { call_id: p.req.call_id, name: p.req.name, result, replayed });
            }
            Err(waiting) => pending.push(waiting),
        }
    }
    for o in &outcomes {
        turn.emit(Event::ToolResult {
            call_id: o.call_id.clone(),
            name: o.name.clone(),
            result: o.model_value(),
            is_error: o.result.is_err(),
            replayed: o.replayed,
        })
        .await;
    }
    Ok((outcomes, pending))
}

/// Runs a ready call and journals its outcome. A journal failure is recorded as fatal for the
/// turn (the run stops after the batch, resumable) and reported to the call as a failure.
async fn execute_journaled(turn: &Arc<TurnCtx>, ready: Ready, site: CallSite<'_>) -> Result<Value, ToolError> {
    let Ready { tool, call, key, ordinal, reused } = ready;
    let result = execute(turn, &tool, call, &key, site).await;
    let outcome = match &result {
        Ok(v) => Some(StepOutcome::Finished(v.clone())),
        // A cancellation is not an outcome of the call, only of this attempt: the step
        // stays `running` so a resumed run tries again.
        Err(e) if !e.is_final() => None,
        Err(e) => Some(StepOutcome::Failed(serde_json::to_value(e).unwrap_or(Value::Null))),
    };
    if let (Some(outcome), Some(ordinal)) = (outcome, ordinal)
        && let Err(e) = turn.journal.finish(&key, ordinal, outcome, reused).await
    {
        return Err(journal_failure(turn, tool.name(), "record the outcome", e));
    }
    result
}

/// Journals and returns the `Indeterminate` outcome of an `at_most_once` call cut off earlier,
/// so every later replay reports the same thing.
async fn indeterminate(turn: &TurnCtx, name: &str, key: String, ordinal: u64) -> Result<Value, ToolError> {
    let error = ToolError::Indeterminate { tool: name.to_owned(), key: key.clone() };
    let outcome = StepOutcome::Failed(serde_json::to_value(&error).unwrap_or(Value::Null));
    if let Err(e) = turn.journal.finish(&key, ordinal, outcome, false).await {
        return Err(journal_failure(turn, name, "record the outcome", e));
    }
    Err(error)
}

/// Records a journal failure as fatal for the turn and describes it to the call.
fn journal_failure(turn: &TurnCtx, name: &str, doing: &str, e: RunError) -> ToolError {
    let message = format!("the journal could not {doing}: {e}");
    turn.set_fatal(e);
    ToolError::failed(name, message)
}

/// Where a call runs: its ids, its parent (for a nested call), and how it is reported.
struct CallSite<'a> {
    call_id: &'a str,
    /// Its callsite; nested effects get `"<callsite>.<n>"`.
    callsite: &'a str,
    /// The parent call's token, for a nested call: cancelling the parent cancels it.
    parent: Option<&'a CancellationToken>,
    /// A call the model issued (its progress is reported), not a nested `ctx.tool()`.
    top_level: bool,
    /// Nothing else of the batch runs beside it (a lone or serial call).
    alone: bool,
}

/// The tool's stream driven to its outcome: in a task of its own, or inline.
enum Running {
    Task(tokio::task::JoinHandle<Option<Result<Value, ToolError>>>),
    Inline(futures::future::BoxFuture<'static, std::thread::Result<Option<Result<Value, ToolError>>>>),
}

/// How driving a tool's stream ended.
enum Joined {
    Done(Option<Result<Value, ToolError>>),
    Panicked(Box<dyn std::any::Any + Send>),
    Aborted,
}

impl std::future::Future for Running {
    type Output = Joined;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Joined> {
        match self.get_mut() {
            Self::Task(handle) => std::pin::Pin::new(handle).poll(cx).map(|joined| match joined {
                Ok(out) => Joined::Done(out),
                Err(e) if e.is_panic() => Joined::Panicked(e.into_panic()),
                Err(_) => Joined::Aborted,
            }),
            Self::Inline(future) => future.as_mut().poll(cx).map(|polled| match polled {
                Ok(out) => Joined::Done(out),
                Err(payload) => Joined::Panicked(payload),
            }),
        }
    }
}

impl Running {
    /// Stops a call that ignored its token past the grace period (an inline one stops when
    /// dropped, which follows).
    fn abort(&self) {
        if let Self::Task(handle) = self {
            handle.abort();
        }
    }
}

/// Runs one call to its outcome under its timeout and the turn's interrupt.
async fn execute(
    turn: &Arc<TurnCtx>,
    tool: &Arc<dyn Tool>,
    call: Box<dyn PreparedCall>,
    key: &str,
    site: CallSite<'_>,
) -> Result<Value, ToolError> {
    let name = tool.name().to_owned();
    if turn.journal.lease_lost() {
        // Another owner took the run over: nothing more starts here.
        return Err(ToolError::Cancelled { tool: name });
    }
    let CallSite { call_id, callsite, parent, top_level, alone } = site;
    let token = parent.map_or_else(CancellationToken::new, CancellationToken::child_token);
    let scope = Scope {
        turn: Arc::clone(turn),
        prefix: callsite.to_owned(),
        next: Arc::new(AtomicU64::new(0)),
        token: token.clone(),
    };
    let ctx = ToolContext::in_run(turn.journal.run_id(), call_id, key, token.clone(), scope);
    let mut events = call.execute(ctx);
    let sink = turn.events.clone();
    let (progress_id, progress_name) = (call_id.to_owned(), name.clone());
    let drive = async move {
        while let Some(ev) = events.next().await {
            match ev {
                ToolEvent::Progress(value) if top_level => {
                    // Dropped when the consumer lags: see `EventSender`.
                    sink.progress(Event::ToolProgress {
                        call_id: progress_id.clone(),
                        name: progress_name.clone(),
                        value,
                    });
                }
                ToolEvent::Progress(_) => {}
                ToolEvent::Outcome(out) => return Some(out),
            }
        }
        None
    };

    let timeout = tool.timeout();
    // Parallel calls, and any call with a timeout, are tasks of their own: parallel calls use
    // every core, and a tool that blocks its thread or burns CPU cannot stall the timer that
    // watches it. A lone call without a timeout has no timer to stall and nothing beside it
    // to share a core with, so it is polled right here: that saves a spawn, a cross-thread
    // wake-up and a join per serial call (about a fifth of a serial turn's instructions in
    // the `runtime` bench). Its interrupt is noticed at its next await, which is all a
    // cancellation token can promise a task anyway.
    let mut task = if alone && timeout.is_none() {
        Running::Inline(AssertUnwindSafe(drive).catch_unwind().boxed())
    } else {
        Running::Task(tokio::spawn(drive))
    };

    let interrupt = if tool.interruptible() { Some(turn.interrupt.clone()) } else { None };
    let timer = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let interrupted = async {
        match &interrupt {
            Some(i) => i.cancelled().await,
            None => std::future::pending().await,
        }
    };
    let stop = tokio::select! {
        biased;
        joined = &mut task => return finish_join(&name, joined, turn.max_result_bytes),
        () = timer => ToolError::Timeout { tool: name.clone(), limit: timeout.unwrap_or_default() },
        () = interrupted => ToolError::Cancelled { tool: name.clone() },
        () = cancelled_opt(parent) => ToolError::Cancelled { tool: name.clone() },
    };
    // The outcome is decided by the timer or the interrupt, not by whatever the tool returns
    // after noticing its token; a tool that ignores the token is dropped after a grace period.
    token.cancel();
    if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
        task.abort();
        // An abort takes effect when the task next yields; one that blocks its thread keeps
        // running (and holding what it captured) until it does. The run does not wait for it.
        let (stop_text, name) = (stop.to_string(), name.clone());
        tokio::spawn(async move {
            if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
                tracing::warn!(
                    tool = %name,
                    "{stop_text}, but the call is still running: it blocks its thread, so it cannot be cancelled; \
                     move blocking work into `tokio::task::spawn_blocking`"
                );
            }
        });
    }
    Err(stop)
}

async fn cancelled_opt(token: Option<&CancellationToken>) {
    match token {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

fn finish_join(name: &str, joined: Joined, max_bytes: usize) -> Result<Value, ToolError> {
    match joined {
        Joined::Done(Some(Ok(value))) => {
            let size = crate::stores::json_len(&value);
            if size > max_bytes {
                Err(ToolError::InvalidOutput {
                    tool: name.to_owned(),
                    message: format!("the result is {size} bytes; the limit is {max_bytes} bytes"),
                })
            } else {
                Ok(value)
            }
        }
        Joined::Done(Some(Err(e))) => Err(e),
        Joined::Done(None) => {
            Err(ToolError::InvalidOutput { tool: name.to_owned(), message: "the tool ended without a result".into() })
        }
        Joined::Panicked(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".to_owned());
            Err(ToolError::Panicked { tool: name.to_owned(), message })
        }
        Joined::Aborted => Err(ToolError::Cancelled { tool: name.to_owned() }),
    }
}

/// A running call's place in the run, handed to its [`ToolContext`]: nested effects get
/// callsites `"<parent>.<n>"`, deterministic whatever order sibling calls finish in.
#[derive(Clone)]
pub(crate) struct Scope {
    turn: Arc<TurnCtx>,
    prefix: String,
    next: Arc<AtomicU64>,
    token: CancellationToken,
}

impl std::fmt::Debug for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl Scope {
    fn next_callsite(&self) -> String {
        format!("{}.{}", self.prefix, self.next.fetch_add(1, Ordering::SeqCst))
    }

    /// A nested, journaled tool call. It runs directly (no batch, no concurrency gate), so a
    /// serial tool calling another serial tool cannot deadlock.
    pub(crate) async fn tool(&self, name: &str, args: Value) -> Result<Value, ToolError> {
        let callsite = self.next_callsite();
        let span = trace::tool_span(self.turn.journal.run_id(), &format!("nested:{callsite}"), name);
        let started = Instant::now();
        let (result, replayed) = self.nested(name, args, callsite).instrument(span.clone()).await;
        trace::tool_done(&span, &result, replayed, started);
        result
    }

    /// [`tool`](Self::tool) without its span: the value, and whether the journal answered it.
    async fn nested(&self, name: &str, args: Value, callsite: String) -> (Result<Value, ToolError>, bool) {
        let turn = &self.turn;
        let Some(tool) = turn.tools.get(name).cloned() else {
            return (Err(ToolError::UnknownTool { tool: name.to_owned(), available: turn.tools.names() }), false);
        };
        if !args.is_object() {
            let message = format!("the arguments must be a JSON object, not {}", crate::tool::kind(&args));
            return (Err(ToolError::invalid_input(name, message)), false);
        }
        let planned = Planned {
            req: ToolCallRequest {
                call_id: format!("nested:{callsite}"),
                name: name.to_owned(),
                arguments: String::new(),
            },
            callsite,
            parsed: Ok((tool, args)),
            parallel: false,
        };
        match plan(turn, &planned) {
            Plan::Done(result, replayed) => (result, replayed),
            Plan::Job(Job::Indeterminate { key, ordinal }) => (indeterminate(turn, name, key, ordinal).await, false),
            // A nested call cannot suspend its parent mid-execution; the caller decides.
            Plan::Pending(_) => {
                let reason = "a tool that needs approval cannot be called from inside another tool";
                (
                    Err(ToolError::Denied {
                        tool: name.to_owned(),
                        by: "runtime".to_owned(),
                        reason: Some(reason.into()),
                    }),
                    false,
                )
            }
            Plan::Job(Job::Run(mut ready)) => {
                if ready.ordinal.is_none() {
                    match turn.journal.begin(vec![(ready.key.clone(), StepKind::Tool, name.to_owned())]).await {
                        Ok(o) => ready.ordinal = o.first().copied(),
                        Err(e) => return (Err(journal_failure(turn, name, "record the call", e)), false),
                    }
                }
                let call_id = planned.req.call_id;
                let site = CallSite {
                    call_id: &call_id,
                    callsite: &planned.callsite,
                    parent: Some(&self.token),
                    top_level: false,
                    alone: true,
                };
                // Inline like a lone call: the parent waits for it, nothing runs beside it here.
                (execute_journaled(turn, ready, site).await, false)
            }
        }
    }

    /// A journaled value of step kind `kind` (`ctx.now()`, `ctx.uuid()`): replayed if recorded
    /// at this callsite, else produced and recorded. The key's payload is the kind's stored
    /// name, so journals written before keep replaying.
    pub(crate) async fn recorded(&self, kind: StepKind, make: impl FnOnce() -> Value) -> Result<Value, ToolError> {
        let what = kind.as_str();
        let callsite = self.next_callsite();
        let turn = &self.turn;
        let key = turn.journal.key(&callsite, &Value::String(what.to_owned()));
        let ordinal = match turn.journal.lookup(&key) {
            Lookup::Finished(v) => return Ok(v),
            Lookup::Failed(e) => return Err(replayed_error(what, e)),
            Lookup::Running(ordinal) => ordinal,
            Lookup::Fresh => match turn.journal.begin(vec![(key.clone(), kind, what.to_owned())]).await {
                Ok(o) => o[0],
                Err(e) => return Err(journal_failure(turn, what, "record the step", e)),
            },
        };
        let value = make();
        if let Err(e) = turn.journal.finish(&key, ordinal, StepOutcome::Finished(value.clone()), false).await {
            return Err(journal_failure(turn, what, "record the step", e));
        }
        Ok(value)
    }
}

/// `ctx.now()` as stored: milliseconds since the Unix epoch.
pub(crate) fn now_value() -> Value {
    json!(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
}

/// Runs one call outside any agent run (an MCP `tools/call`) through the same path as a
/// model's call: argument parsing and validation before execute, the tool's timeout,
/// `interrupt` (honoured unless the tool is not interruptible), panic containment, the
/// result-size cap, approval guards, and journaled nested effects (`ctx.tool/now/uuid`) on a
/// throwaway in-memory journal of its own. Progress values arrive on `events` as
/// [`Event::ToolProgress`]. `run_id` names the throwaway run (the call's `ctx.run_id()`).
#[cfg(feature = "mcp")]
pub(crate) async fn call_standalone(
    tools: &ToolSet,
    run_id: &str,
    call: ToolCallRequest,
    interrupt: CancellationToken,
    events: EventSender,
) -> Result<Value, ToolError> {
    let name = call.name.clone();
    let store: Arc<dyn crate::RunStore> = Arc::new(crate::stores::MemoryStore::new());
    let now = crate::journal::now_ms();
    let record = crate::RunRecord {
        run_id: run_id.to_owned(),
        agent_id: "standalone".to_owned(),
        status: crate::RunStatus::Running,
        epoch: 0,
        version: 0,
        state: Value::Null,
        created_at_ms: now,
        updated_at_ms: now,
    };
    // The throwaway run is owned like any other (its store checks the fence on every write).
    let opened = async {
        use crate::runtime::lease;
        let held = lease::acquire(store.as_ref(), run_id, lease::DEFAULT_LEASE_TTL, None).await?;
        let fence = lease::Fence::new(&held, CancellationToken::new());
        store.create_run(record, fence.token()).await?;
        Journal::open(Arc::clone(&store), fence, run_id, 0, crate::DEFAULT_MAX_STEPS_PER_RUN).await
    };
    let journal =
        opened.await.map_err(|e| ToolError::failed(&name, format!("the call journal could not open: {e}")))?;
    let turn = Arc::new(TurnCtx {
        journal,
        tools: tools.clone(),
        events,
        interrupt,
        max_concurrency: 1,
        max_result_bytes: crate::DEFAULT_MAX_RESULT_BYTES,
        // A tool set served on its own has no agent, so no agent policy applies.
        policy: Policy::new(),
        fatal: Mutex::new(None),
    });
    let done = dispatch(&turn, vec![call], 0)
        .await
        .map_err(|e| ToolError::failed(&name, format!("the call journal failed: {e}")))?;
    if let Some(outcome) = done.outcomes.into_iter().next() {
        return outcome.result;
    }
    Err(ToolError::Denied {
        tool: name,
        by: "kuralle".to_owned(),
        reason: Some("this tool needs a human's approval, which a standalone call cannot collect".to_owned()),
    })
}
