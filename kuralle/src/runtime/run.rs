//! One turn of a run: open (or resume) it, loop model ↔ tools with every model response and
//! tool call journaled, and close it under optimistic concurrency.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    Decision, Inner, RunRequest,
    lease::{self, Held},
    response::{ModelResponse, cap_arguments, dedupe_call_ids, put_calls, take_calls},
};
use crate::{
    AgentDef, Event, FinishReason, JsonText, Message, Model, ModelError, ModelEvent, ModelRequest, Origin, Part,
    RunError, RunRecord, RunStatus, RunStore, StepKind, StepOutcome, StoreError, ToolCallRequest, ToolSpec, Transcript,
    Usage,
    approval::{Pending, RecordedDecision, RequestId},
    clock::now_ms,
    dispatch::{self, TurnCtx},
    event::{EventSender, RunOutput},
    journal::{Fence, Journal, Lookup},
    truncate::truncate_owned,
};

/// How many processed inbound idempotency keys a run remembers.
const INBOUND_KEYS_KEPT: usize = 64;
/// How often closing a run retries after losing an optimistic-concurrency race.
const CLOSE_ATTEMPTS: usize = 16;

/// The runtime-owned part of a run record (`RunRecord::state`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct RunState {
    /// The transcript before the current turn.
    messages: Transcript,
    /// The current (or last) turn's input.
    turn_input: Option<String>,
    /// The last finished turn's text.
    output: String,
    /// The last turn's usage.
    usage: Usage,
    /// Recently processed inbound idempotency keys.
    inbound_keys: Vec<String>,
    /// Calls waiting for a human decision (status `paused`).
    #[serde(default)]
    pending: Vec<Pending>,
}

enum Opened {
    Turn { record: Box<RunRecord>, state: Box<RunState> },
    Done(RunOutput),
}

/// One turn under the run's lease: taken before anything is read, renewed while the turn
/// runs, released when it closes (a paused run holds no lease). With `decision`, the decision
/// is recorded under the same lease first (`deliver`).
pub(super) async fn run(
    rt: Arc<Inner>,
    req: RunRequest,
    events: EventSender,
    interrupt: CancellationToken,
    decision: Option<Decision>,
) -> Result<RunOutput, RunError> {
    run_leased(rt, req, events, interrupt, decision, None).await
}

/// [`run`], under `claimed` when the caller already holds the run's lease (a worker that
/// claimed the run from the queue).
pub(super) async fn run_leased(
    rt: Arc<Inner>,
    req: RunRequest,
    events: EventSender,
    interrupt: CancellationToken,
    decision: Option<Decision>,
    claimed: Option<crate::Lease>,
) -> Result<RunOutput, RunError> {
    let run_id = req.run_id.clone().or_else(|| req.session.clone()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let span = crate::trace::run_span(&run_id);
    let started = std::time::Instant::now();
    let result = async {
        let lease = match claimed {
            Some(lease) => lease,
            None => lease::acquire(rt.store.as_ref(), &run_id, rt.lease_ttl, req.wait_for_lease).await?,
        };
        tracing::debug!(token = lease.token, owner = %lease.owner, "took the run's lease");
        let held = Held::start(&rt.renewals, lease, interrupt.clone());
        let fence = Arc::clone(held.fence());
        let result = match &decision {
            Some(d) => record_under(rt.store.as_ref(), &fence, &run_id, d).await,
            None => Ok(()),
        };
        let result = match result {
            Ok(()) => turn(&rt, &req, &run_id, &events, interrupt, &fence).await,
            Err(e) => Err(e),
        };
        let result = fence.settle(result);
        held.release().await;
        result
    }
    .instrument(span.clone())
    .await;
    match &result {
        Ok(out) => {
            span.record("status", out.status.as_str());
            span.record("outcome", "ok");
        }
        Err(e) => {
            span.record("outcome", tracing::field::display(e));
        }
    }
    crate::trace::record_duration(&span, started);
    if let Err(e) = &result {
        events.send(Event::Error { message: e.to_string() }).await;
    }
    result
}

/// Records the request's turn without running it (`Runtime::submit`): a new run, or a new
/// turn of an existing one, in status `running` with no lease, so that a worker claims it.
/// Returns the run id. A request whose idempotency key the run already processed changes
/// nothing.
pub(super) async fn submit(rt: &Inner, req: &RunRequest) -> Result<String, RunError> {
    let run_id = req.run_id.clone().or_else(|| req.session.clone()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let lease = lease::acquire(rt.store.as_ref(), &run_id, rt.lease_ttl, req.wait_for_lease).await?;
    let fence = Fence::new(&lease, CancellationToken::new());
    let opened = fence.settle(open(rt, req, &run_id, fence.token()).await.map(|_| ()));
    if !fence.is_lost() {
        let _ = rt.store.release_lease(&lease).await;
    }
    opened?;
    // Only a hint for idle workers; they poll as well.
    let _ = rt.store.notify_runnable().await;
    Ok(run_id)
}

fn agent<'a>(rt: &'a Inner, id: Option<&str>) -> Result<&'a AgentDef, RunError> {
    match id {
        None => Ok(&rt.agents[0]),
        Some(id) => rt.agents.iter().find(|a| a.id == id).ok_or_else(|| RunError::UnknownAgent {
            id: id.to_owned(),
            available: rt.agents.iter().map(|a| a.id.as_str()).collect::<Vec<_>>().join(", "),
        }),
    }
}

fn decode_state(record: &RunRecord) -> Result<RunState, RunError> {
    record.state.decode().map_err(|e| {
        RunError::Store(StoreError::Corrupt(format!("run `{}` has unreadable state: {e}", record.run_id).into()))
    })
}

fn output_of(record: &RunRecord, state: &RunState) -> RunOutput {
    RunOutput { run_id: record.run_id.clone(), text: state.output.clone(), status: record.status, usage: state.usage }
}

async fn open(rt: &Inner, req: &RunRequest, run_id: &str, fence: u64) -> Result<Opened, RunError> {
    let store = &rt.store;
    let Some(mut record) = store.get_run(run_id).await? else {
        let Some(input) = req.input.clone() else { return Err(RunError::RunNotFound(run_id.to_owned())) };
        let agent = agent(rt, req.agent.as_deref())?;
        let state = RunState {
            turn_input: Some(input),
            inbound_keys: req.idempotency_key.iter().cloned().collect(),
            ..RunState::default()
        };
        let now = now_ms();
        let record = RunRecord {
            run_id: run_id.to_owned(),
            agent_id: agent.id.clone(),
            status: RunStatus::Running,
            epoch: 0,
            version: 0,
            state: JsonText::serialize_from(&state).unwrap_or_default(),
            created_at_ms: now,
            updated_at_ms: now,
        };
        store.create_run(record.clone(), fence).await?;
        return Ok(Opened::Turn { record: Box::new(record), state: Box::new(state) });
    };
    let mut state = decode_state(&record)?;
    let unfinished = matches!(record.status, RunStatus::Running | RunStatus::Paused);
    let seen = req.idempotency_key.as_ref().is_some_and(|k| state.inbound_keys.contains(k));
    match &req.input {
        _ if seen && !unfinished => return Ok(Opened::Done(output_of(&record, &state))),
        None | Some(_) if seen => return Ok(Opened::Turn { record: Box::new(record), state: Box::new(state) }),
        None if unfinished => return Ok(Opened::Turn { record: Box::new(record), state: Box::new(state) }),
        None => return Ok(Opened::Done(output_of(&record, &state))),
        Some(input) if unfinished => {
            return if state.turn_input.as_ref() == Some(input) {
                Ok(Opened::Turn { record: Box::new(record), state: Box::new(state) })
            } else {
                Err(RunError::TurnInProgress(run_id.to_owned()))
            };
        }
        Some(input) => {
            // A new user turn: a new epoch, so the same call made again is a new effect.
            record.epoch += 1;
            record.status = RunStatus::Running;
            state.turn_input = Some(input.clone());
            state.output.clear();
            state.usage = Usage::default();
            if let Some(k) = &req.idempotency_key {
                state.inbound_keys.push(k.clone());
                let excess = state.inbound_keys.len().saturating_sub(INBOUND_KEYS_KEPT);
                state.inbound_keys.drain(..excess);
            }
            record.state = JsonText::serialize_from(&state).unwrap_or_default();
            record.updated_at_ms = now_ms();
            record.version = store.put_run(record.clone(), fence).await?;
        }
    }
    Ok(Opened::Turn { record: Box::new(record), state: Box::new(state) })
}

async fn turn(
    rt: &Arc<Inner>,
    req: &RunRequest,
    run_id: &str,
    events: &EventSender,
    interrupt: CancellationToken,
    fence: &Arc<Fence>,
) -> Result<RunOutput, RunError> {
    let (record, state) = match open(rt, req, run_id, fence.token()).await? {
        Opened::Done(out) => {
            events.send(Event::RunStarted { run_id: run_id.to_owned() }).await;
            events.send(Event::Done { run_id: run_id.to_owned(), usage: out.usage }).await;
            return Ok(out);
        }
        Opened::Turn { record, state } => (*record, *state),
    };
    let result = drive(rt, run_id, record, state, events, interrupt, fence).await;
    if let Err(e) = &result
        && ends_the_run(e)
        && !fence.is_lost()
    {
        mark_failed(rt.store.as_ref(), run_id, fence.token()).await;
    }
    result
}

/// Errors that resuming cannot fix: the run is marked failed. Model and store outages, and
/// rejected credentials (fixable by configuration), leave it resumable.
fn ends_the_run(e: &RunError) -> bool {
    matches!(
        e,
        RunError::StepLimit { .. }
            | RunError::ResponseTooLarge { .. }
            | RunError::Config(_)
            | RunError::Store(StoreError::Corrupt(_) | StoreError::LimitExceeded(_))
    )
}

/// Best effort: a failure to record the failure leaves the run resumable, which is safe.
async fn mark_failed(store: &dyn RunStore, run_id: &str, fence: u64) {
    let Ok(Some(mut record)) = store.get_run(run_id).await else { return };
    record.status = RunStatus::Failed;
    record.updated_at_ms = now_ms();
    if let Err(e) = store.put_run(record, fence).await {
        tracing::warn!(run_id, error = %e, "could not mark the run failed");
    }
}

async fn drive(
    rt: &Arc<Inner>,
    run_id: &str,
    record: RunRecord,
    state: RunState,
    events: &EventSender,
    interrupt: CancellationToken,
    fence: &Arc<Fence>,
) -> Result<RunOutput, RunError> {
    let agent = agent(rt, Some(&record.agent_id))?.clone();
    tracing::Span::current().record("agent", agent.id.as_str());
    let model: Arc<dyn Model> = match (&agent.model, &rt.model) {
        (Some(m), _) | (None, Some(m)) => Arc::clone(m),
        (None, None) => return Err(RunError::Config(format!("agent `{}` has no model", agent.id))),
    };
    events.send(Event::RunStarted { run_id: run_id.to_owned() }).await;

    let journal =
        Journal::open(Arc::clone(&rt.store), Arc::clone(fence), run_id, record.epoch, rt.max_steps_per_run).await?;
    let ctx = Arc::new(TurnCtx {
        journal,
        tools: agent.tools.clone(),
        events: events.clone(),
        interrupt: interrupt.clone(),
        max_concurrency: agent.max_tool_concurrency,
        max_result_bytes: rt.max_result_bytes,
        policy: agent.policy.clone(),
        fatal: Mutex::new(None),
    });

    // Shared with every request (never copied per step): a step costs the same at step 5,000
    // as at step 1.
    let mut transcript = state.messages.clone();
    if let Some(input) = &state.turn_input {
        transcript.push(Message::User { content: input.clone() });
    }
    let specs: Arc<[ToolSpec]> = agent.tools.specs().into();
    let mut usage = Usage::default();
    let mut callsite: u64 = 0;
    let mut status = RunStatus::MaxSteps;
    let mut text = String::new();
    let mut pending = Vec::new();

    for _ in 0..agent.max_steps {
        // On an in-memory store with quick tools nothing here waits, and a lone call runs in
        // this task: spend the task's cooperative budget so a long run still yields its
        // thread to others now and then.
        tokio::task::coop::consume_budget().await;
        if interrupt.is_cancelled() {
            status = RunStatus::Interrupted;
            break;
        }
        let request = ModelRequest {
            system: agent.instructions.clone(),
            messages: transcript.clone(),
            tools: Arc::clone(&specs),
        };
        let span = crate::trace::model_span(run_id, callsite);
        let started = std::time::Instant::now();
        let step = model_step(rt, &ctx, model.as_ref(), request, callsite).instrument(span.clone()).await;
        span.record(
            "outcome",
            match &step {
                Ok(Some(_)) => "ok",
                Ok(None) => "interrupted",
                Err(_) => "error",
            },
        );
        crate::trace::record_duration(&span, started);
        let Some(response) = step? else {
            status = RunStatus::Interrupted;
            break;
        };
        callsite += 1;
        usage += response.usage;
        let has_calls = response.has_calls();
        let ModelResponse { mut parts, origin, .. } = response;
        if !has_calls {
            let message = Message::Assistant { parts, origin };
            text = message.text();
            transcript.push(message);
            status = RunStatus::Finished;
            break;
        }
        let calls = take_calls(&mut parts);
        let n = calls.len() as u64;
        let dispatched = dispatch::dispatch(&ctx, calls, callsite).await?;
        callsite += n;
        if !dispatched.pending.is_empty() {
            // The turn resumes from its start once decided: everything before the pending
            // calls replays from the journal, so only the decision is missing. (The transcript
            // is rolled back to the turn's start below, so it never gets this response.)
            pending = dispatched.pending;
            status = RunStatus::Paused;
            break;
        }
        // Dispatch reads nothing of the transcript, so the response joins it only now, its
        // calls rebuilt from what dispatch gives back instead of copied before dispatch: every
        // call answered, in source order, since nothing is pending.
        let mut tool_calls = Vec::with_capacity(dispatched.outcomes.len());
        let mut results = Vec::with_capacity(dispatched.outcomes.len());
        for o in dispatched.outcomes {
            let content = truncate_owned(dispatch::into_model_value(o.result), agent.max_tool_result_tokens);
            results.push(Message::Tool { call_id: o.call_id.clone(), name: o.name.clone(), content });
            tool_calls.push(ToolCallRequest { call_id: o.call_id, name: o.name, arguments: o.arguments });
        }
        put_calls(&mut parts, tool_calls);
        transcript.push(Message::Assistant { parts, origin });
        for message in results {
            transcript.push(message);
        }
    }

    if status == RunStatus::Paused {
        events
            .send(Event::Paused {
                run_id: run_id.to_owned(),
                pending: pending.iter().map(|p: &Pending| p.request.clone()).collect(),
            })
            .await;
        // The transcript of a paused turn is rebuilt by replay on resume; keep the one
        // before the turn.
        transcript = state.messages.clone();
    }
    // A final answer (or an interrupted or paused turn) may leave its model response
    // unwritten; it is journaled before the run's state says the turn ended.
    if !fence.is_lost() {
        ctx.journal.flush().await?;
    }
    if fence.is_lost() {
        // Another owner carries the run on; this turn writes nothing more.
        return Err(RunError::LeaseLost { run_id: run_id.to_owned(), token: fence.token() });
    }
    let closing = Closing { transcript, status, text, usage, pending };
    let out = close(rt.store.as_ref(), fence.token(), record, state, closing).await?;
    events.send(Event::Done { run_id: run_id.to_owned(), usage: out.usage }).await;
    Ok(out)
}

/// One model response: replayed from the journal when recorded, else requested (live text
/// deltas) and journaled. `None` when the caller interrupted the stream.
async fn model_step(
    rt: &Inner,
    ctx: &TurnCtx,
    model: &dyn Model,
    request: ModelRequest,
    callsite: u64,
) -> Result<Option<ModelResponse>, RunError> {
    let journal = &ctx.journal;
    let key = journal.key(&callsite.to_string(), &json!("model"));
    if let Some(replayed) = journal.result_text(&key) {
        // Straight from the journal's text into the typed response: no tree in between.
        let response = replayed.decode::<ModelResponse>().map_err(|e| {
            RunError::Store(StoreError::Corrupt(format!("journaled model response is unreadable: {e}").into()))
        })?;
        if ctx.events.is_listening() {
            let text = response.text();
            if !text.is_empty() {
                ctx.events.send(Event::TextDelta { delta: text }).await;
            }
        }
        tracing::Span::current().record("replayed", true);
        return Ok(Some(response));
    }
    tracing::Span::current().record("replayed", false);
    // No intent is written before asking: a response cut off by a crash is asked for again
    // either way, so the response is journaled once it is complete, with the intents of the
    // calls it asks for (one commit). An intent left by an older turn is finished in place.
    let unfinished = match journal.lookup(&key) {
        Lookup::Running(ordinal) => Some(ordinal),
        // Model failures are never journaled as final (they are transient), so a failed step
        // cannot occur; treat one like a fresh step and ask again.
        Lookup::Finished(_) | Lookup::Failed(_) | Lookup::Fresh => None,
    };

    let mut stream = model.stream(request);
    let mut response =
        ModelResponse { parts: Vec::new(), origin: None, finish: FinishReason::Stop, usage: Usage::default() };
    // Text streamed since the last part; it becomes a text part when the next part starts.
    let mut open_text = String::new();
    let mut finished = false;
    loop {
        let next = tokio::select! {
            biased;
            () = ctx.interrupt.cancelled() => return Ok(None),
            next = stream.next() => next,
        };
        match next {
            None => break,
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(ModelEvent::TextDelta { delta })) => {
                open_text.push_str(&delta);
                ctx.events.send(Event::TextDelta { delta }).await;
            }
            Some(Ok(ModelEvent::ReasoningDelta { delta })) => {
                if ctx.events.is_listening() {
                    ctx.events.send(Event::ReasoningDelta { delta }).await;
                }
            }
            Some(Ok(ModelEvent::ToolCall(call))) => {
                close_text(&mut response.parts, &mut open_text);
                response.parts.push(Part::call(call));
            }
            Some(Ok(ModelEvent::Part { part })) => {
                if matches!(part, Part::Text { .. }) {
                    // The part is the streamed text, complete, with its signature or id.
                    open_text.clear();
                } else {
                    close_text(&mut response.parts, &mut open_text);
                }
                response.parts.push(part);
            }
            Some(Ok(ModelEvent::Finish { reason, usage })) => {
                response.finish = reason;
                response.usage = usage;
                finished = true;
            }
        }
    }
    if !finished {
        return Err(ModelError::Protocol("the model stream ended without a finish reason".into()).into());
    }
    close_text(&mut response.parts, &mut open_text);
    // Provider state goes back only to its provider; a turn without any needs no origin.
    if response.parts.iter().any(Part::is_provider_state) {
        response.origin = Some(Origin::new(model.provider(), model.name()));
    }
    // Before journaling, so a replay gives the model the same answers.
    let mut calls = take_calls(&mut response.parts);
    dedupe_call_ids(&mut calls);
    cap_arguments(&mut calls, rt.max_result_bytes.saturating_sub(response.text_bytes()));
    put_calls(&mut response.parts, calls);
    // Written once, from the typed response, as the text the store keeps; measured by its
    // length. A `ModelResponse` always serializes (its maps have string keys).
    let value = JsonText::serialize_from(&response).unwrap_or_default();
    let size = value.len();
    if size > rt.max_result_bytes {
        return Err(RunError::ResponseTooLarge { size, limit: rt.max_result_bytes });
    }
    match unfinished {
        Some(ordinal) => journal.finish(&key, ordinal, StepOutcome::Finished(value), false).await?,
        None => journal.defer_finished(key, StepKind::Model, "model", value).await?,
    }
    Ok(Some(response))
}

/// Ends the text streamed since the last part as a text part of its own.
fn close_text(parts: &mut Vec<Part>, open: &mut String) {
    if !open.is_empty() {
        parts.push(Part::text(std::mem::take(open)));
    }
}

/// Persists the turn's end. Losing an optimistic-concurrency race re-reads and retries: the
/// version check protects the record, it never fails the turn.
struct Closing {
    transcript: Transcript,
    status: RunStatus,
    text: String,
    usage: Usage,
    pending: Vec<Pending>,
}

async fn close(
    store: &dyn RunStore,
    fence: u64,
    mut record: RunRecord,
    mut state: RunState,
    closing: Closing,
) -> Result<RunOutput, RunError> {
    let Closing { transcript, status, text, usage, pending } = closing;
    state.messages = transcript;
    state.output = text;
    state.usage = usage;
    state.pending = pending;
    record.status = status;
    // The record is moved into the store (its state can be a long transcript); only a lost
    // race rebuilds it.
    record.state = JsonText::null();
    for _ in 0..CLOSE_ATTEMPTS {
        let attempt = RunRecord {
            state: JsonText::serialize_from(&state).unwrap_or_default(),
            updated_at_ms: now_ms(),
            ..record.clone()
        };
        match store.put_run(attempt, fence).await {
            Ok(version) => {
                record.version = version;
                return Ok(output_of(&record, &state));
            }
            Err(StoreError::VersionConflict { actual, .. }) => {
                let fresh =
                    store.get_run(&record.run_id).await?.ok_or_else(|| RunError::RunNotFound(record.run_id.clone()))?;
                let keys = decode_state(&fresh)?.inbound_keys;
                state.inbound_keys = keys;
                record.version = actual.max(fresh.version);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(RunError::Store(StoreError::Unavailable(
        format!("run `{}` kept changing under this turn; gave up after {CLOSE_ATTEMPTS} attempts", record.run_id)
            .into(),
    )))
}

/// Records a human decision on a paused run's pending calls (all of them, or the one the
/// decision names), under the run's lease, without resuming the run: the next `resume` (or a
/// worker) carries it on. This is what [`Runtime::deliver`](crate::Runtime::deliver) does before
/// it resumes, and what an operator's tool calls.
///
/// ```
/// use kuralle::{Decision, RunError, stores::MemoryStore};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let err = kuralle::record_decision(&store, "no-such-run", &Decision::approve("alice")).await.unwrap_err();
/// assert!(matches!(err, RunError::RunNotFound(_)));
/// # });
/// ```
///
/// # Errors
/// [`RunError::Busy`] when another caller owns the run; [`RunError::AlreadyDecided`] when the
/// named call(s) already have a decision; [`RunError::NotPending`] when the run waits for no
/// such decision; [`RunError::RunNotFound`]; [`RunError::Store`] when the store fails.
pub async fn record_decision(store: &dyn RunStore, run_id: &str, decision: &Decision) -> Result<(), RunError> {
    let lease = lease::acquire(store, run_id, lease::DEFAULT_LEASE_TTL, None).await?;
    let fence = Fence::new(&lease, CancellationToken::new());
    let result = fence.settle(record_under(store, &fence, run_id, decision).await);
    if !fence.is_lost() {
        let _ = store.release_lease(&lease).await;
    }
    if result.is_ok() {
        // Only a hint for idle workers; they poll as well.
        let _ = store.notify_runnable().await;
    }
    result
}

/// [`record_decision`] under a lease the caller holds.
async fn record_under(store: &dyn RunStore, fence: &Fence, run_id: &str, decision: &Decision) -> Result<(), RunError> {
    let record = store.get_run(run_id).await?.ok_or_else(|| RunError::RunNotFound(run_id.to_owned()))?;
    let state = decode_state(&record)?;
    let request_id = || decision.request_id.clone().unwrap_or_else(|| "*".to_owned());
    let recorded: std::collections::HashMap<String, (u64, crate::StepStatus)> =
        store.steps(run_id).await?.into_iter().map(|s| (s.key, (s.ordinal, s.status))).collect();
    let targets: Vec<&Pending> = state
        .pending
        .iter()
        .filter(|p| decision.request_id.as_ref().is_none_or(|id| *id == p.request.request_id))
        .collect();
    // A run whose every pending call was decided is `running` (runnable) until a turn
    // carries the decisions out; its pending calls still answer as decided.
    let waiting =
        record.status == RunStatus::Paused || (record.status == RunStatus::Running && !state.pending.is_empty());
    if !waiting || targets.is_empty() {
        // A decision key's first 24 hex digits are its request id: a decided request shows in
        // the journal after the run moved on.
        let decided = match &decision.request_id {
            Some(id) => RequestId::key_prefix(id).is_some_and(|prefix| recorded.keys().any(|k| k.starts_with(prefix))),
            None => false,
        };
        return Err(if decided {
            RunError::AlreadyDecided { run_id: run_id.to_owned(), request_id: request_id() }
        } else {
            RunError::NotPending { run_id: run_id.to_owned(), request_id: request_id() }
        });
    }
    // A decision whose intent was written but not its value (the process died in between) is
    // finished now; without that, the run would pause on it again forever.
    let undecided: Vec<&Pending> = targets
        .into_iter()
        .filter(|p| recorded.get(&p.decision_key).is_none_or(|&(_, status)| status == crate::StepStatus::Running))
        .collect();
    if undecided.is_empty() {
        // Decided before, and the run is still paused: the process that recorded the decisions
        // died before it made the run runnable. Make it runnable now (a resume or a worker
        // carries the decisions out), and tell this caller its decision came second.
        if record.status == RunStatus::Paused && state.pending.iter().all(|p| recorded.contains_key(&p.decision_key)) {
            make_runnable(store, fence, record).await?;
        }
        return Err(RunError::AlreadyDecided { run_id: run_id.to_owned(), request_id: request_id() });
    }
    let value = JsonText::serialize_from(&RecordedDecision {
        approved: decision.approved,
        by: decision.by.clone(),
        reason: decision.reason.clone(),
    })
    .unwrap_or_default();
    for p in undecided {
        if let Some(&(ordinal, _)) = recorded.get(&p.decision_key) {
            let outcome = StepOutcome::Finished(value.clone());
            fence.watch(store.finish_step(run_id, fence.token(), ordinal, outcome, now_ms()).await)?;
            continue;
        }
        let step = crate::NewStep {
            key: p.decision_key.clone(),
            kind: StepKind::Approval,
            name: p.request.name.clone(),
            epoch: record.epoch,
            started_at_ms: now_ms(),
        };
        let ordinals = fence.watch(store.append_steps(run_id, fence.token(), vec![step]).await)?;
        let outcome = StepOutcome::Finished(value.clone());
        fence.watch(store.finish_step(run_id, fence.token(), ordinals[0], outcome, now_ms()).await)?;
    }
    // Every pending call decided: the run is runnable again, so a worker of any process picks
    // it up (`Runtime::serve`) if nobody resumes it here.
    let decided: std::collections::HashSet<&str> = recorded
        .keys()
        .map(String::as_str)
        .chain(
            state
                .pending
                .iter()
                .filter(|p| decision.request_id.as_ref().is_none_or(|id| *id == p.request.request_id))
                .map(|p| p.decision_key.as_str()),
        )
        .collect();
    if state.pending.iter().all(|p| decided.contains(p.decision_key.as_str())) {
        make_runnable(store, fence, record).await?;
    }
    Ok(())
}

/// Marks a run whose every pending call is decided `running`, so a resume or a worker of any
/// process carries the decisions out.
async fn make_runnable(store: &dyn RunStore, fence: &Fence, record: RunRecord) -> Result<(), RunError> {
    let runnable = RunRecord { status: RunStatus::Running, updated_at_ms: now_ms(), ..record };
    fence.watch(store.put_run(runnable, fence.token()).await)?;
    Ok(())
}
