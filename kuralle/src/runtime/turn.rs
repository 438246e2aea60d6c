//! One turn: the model ↔ tool loop, from the first model step to the turn's close, and what
//! ends a run for good.

use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use super::{
    Inner,
    close::{Closing, close},
    lease::Held,
    limits,
    open::{Opened, Opening, Prefetched, agent, open},
    output::{Judged, Typed},
    response::{ModelResponse, put_calls, take_calls},
    state::RunState,
    step::model_step,
};
use crate::{
    agent::AgentDef,
    approval::Pending,
    clock::now_ms,
    dispatch::{self, TurnCtx},
    error::RunError,
    event::{Event, EventSender, RunOutput},
    journal::{Fence, Journal, RunWriter},
    limits::Budget,
    model::{FinishReason, Message, Model, ModelRequest, Origin, Part, ToolCallRequest, Usage},
    store::{RunRecord, RunStatus, StoreError},
    truncate::truncate_owned,
};

/// Not an `async fn`, here and in [`drive`] and [`steps`]: an async fn's future stores each
/// argument twice (as it came in and as the body's local), and these futures are layers of
/// every run's task, waiting on the model. Not an async block either: the open is chained to
/// the steps, so that what only the open needs (the request, which is dropped once the run is
/// open) and the locals that carried its outcome keep no slot beside them (an async block
/// here made every run's future 72 bytes larger: 832 against 760).
pub(super) fn turn<'a>(
    rt: &'a Arc<Inner>,
    mut opening: Box<Opening>,
    run_id: &'a str,
    events: &'a EventSender,
    interrupt: CancellationToken,
    held: &'a Held,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'a {
    use futures::future::Either;
    let hand_back = opening.req.hand_back;
    let opened = match std::mem::replace(&mut opening.read, Prefetched::Unread) {
        // Most runs: created with their lease, nothing to await. `open`'s future would take a
        // box of its own (an allocation and a free), for nothing.
        Prefetched::Created(created) => {
            drop(opening);
            Either::Left(std::future::ready(Ok(Opened::created(created))))
        }
        // Boxed: a future is as large as its largest await, and a run spends its life waiting
        // on the model, so what only briefly runs (opening, dispatching, closing) is kept off
        // the run's task, which 10,000 runs in flight hold at once. The request goes with it;
        // the box is 928 bytes, within glibc's per-thread cache (requests up to 1,032).
        read => Either::Right(Box::pin(async move {
            let writer = RunWriter::new(rt.store.as_ref(), held.fence());
            open(rt, &mut opening.req, writer, read).await
        })),
    };
    // Chained, not awaited into a local: a local that receives an await's output has its
    // slot in this future during that await too, and the turn's result (168 bytes) then sat
    // beside `drive` in every run's task for the run's whole life. Chained, it lives only
    // in the second stage, which takes the first's place. It captures the runtime and the
    // lease, two references, and makes its writer when it runs.
    let marked = move |mut result: Result<RunOutput, RunError>| async move {
        let fence = held.fence();
        // An outcome sent while the turn went on may have failed after the turn's own error
        // (a model outage, say): the lost outcome is what the run must report.
        if result.is_err()
            && !fence.is_lost()
            && let Err(e) = fence.written().await
        {
            result = Err(e.into());
        }
        if let Err(e) = &result
            && ends_the_run(e)
            && !fence.is_lost()
        {
            Box::pin(mark_ended(RunWriter::new(rt.store.as_ref(), fence), ended_status(e))).await;
        }
        result
    };
    opened.then(move |opened| match opened {
        Err(e) => Either::Left(Either::Left(std::future::ready(Err(e)))),
        Ok(Opened::Done(out)) => Either::Left(Either::Right(Box::pin(replayed(events, run_id, *out)))),
        // Kept boxed: each layer of the turn's future would otherwise hold its own copy.
        Ok(Opened::Turn { record, state, created }) => {
            Either::Right(drive(rt, record, state, created, events, interrupt, held, hand_back).then(marked))
        }
    })
}

/// A turn the journal already holds whole (a duplicate request): its events and output.
async fn replayed(events: &EventSender, run_id: &str, out: RunOutput) -> Result<RunOutput, RunError> {
    events.send(Event::RunStarted { run_id: run_id.to_owned() }).await;
    events.send(Event::Done { run_id: run_id.to_owned(), usage: out.usage }).await;
    Ok(out)
}

/// Errors that resuming cannot fix: the run is marked failed. Model and store outages, and
/// rejected credentials or TLS (the model's or the store's: fixable by configuration), leave
/// it resumable.
pub(super) fn ends_the_run(e: &RunError) -> bool {
    matches!(
        e,
        RunError::StepLimit { .. }
            | RunError::ResponseTooLarge { .. }
            | RunError::Config(_)
            | RunError::LimitExceeded { .. }
            | RunError::Store(StoreError::Corrupt(_) | StoreError::LimitExceeded(_))
    )
}

/// The status of a run `e` ended.
pub(super) fn ended_status(e: &RunError) -> RunStatus {
    match e {
        RunError::LimitExceeded { .. } => RunStatus::LimitExceeded,
        _ => RunStatus::Failed,
    }
}

/// Best effort: a failure to record the failure leaves the run resumable, which is safe.
pub(super) async fn mark_ended(writer: RunWriter<'_>, status: RunStatus) {
    let Ok(Some(mut record)) = writer.get_run().await else { return };
    record.status = status;
    record.updated_at_ms = now_ms();
    // Whatever became of the turn's outcomes: the run's end builds on none of them, and one that
    // failed may be why it ended.
    if let Err(e) = writer.put_run_ending(record).await {
        tracing::warn!(run_id = writer.run_id(), error = %e, "could not mark the run failed");
    }
}

/// Runs the turn of an opened run.
///
/// Not `async` at all: what it does before the steps never waits, and as an async block it was
/// one more layer of every run's task through the model's whole latency, its arguments kept
/// there after they were moved on (80 bytes). An error before the steps is a ready future.
#[allow(clippy::too_many_arguments)] // on purpose: see `turn`
fn drive<'a>(
    rt: &'a Arc<Inner>,
    record: Box<RunRecord>,
    state: Box<RunState>,
    created: bool,
    events: &'a EventSender,
    interrupt: CancellationToken,
    held: &'a Held,
    hand_back: bool,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'a {
    use futures::future::Either;
    let fence = held.fence();
    let run_id = fence.run_id();
    let prepared = (|| {
        let agent = agent(rt, Some(&record.agent_id))?;
        let model: Arc<dyn Model> = match (&agent.model, &rt.model) {
            (Some(m), _) | (None, Some(m)) => Arc::clone(m),
            (None, None) => return Err(RunError::Config(format!("agent `{}` has no model", agent.id))),
        };
        // Boxed: moved into the turn's budget at once, and the steps' future keeps a pointer.
        let limits = Box::new(limits::of_run(agent, &state));
        limits::priced(limits.max_cost_usd.is_some(), &agent.id, model.as_ref(), &rt.pricing)?;
        Ok((agent, model, limits))
    })();
    let (agent, model, limits) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => return Either::Left(std::future::ready(Err(e))),
    };
    let span = crate::trace::agent_span(run_id, &agent.id, model.as_ref());
    // The steps are instrumented themselves, not through a block that opens the journal and
    // then awaits them: that block's captures and its `Arc<TurnCtx>` were one more layer of
    // every run's task through the model's whole latency.
    let ctx_parts = CtxParts { created, interrupt, held, limits };
    let steps = steps(rt, run_id, agent, model, record, state, events, ctx_parts, fence, hand_back);
    Either::Right(crate::trace::AgentTurn::new(steps, span))
}

/// What the turn's steps need, beside the run, to open its journal and build its context
/// (`TurnCtx`): prepared by [`drive`], taken apart by [`steps`].
struct CtxParts<'a> {
    created: bool,
    interrupt: CancellationToken,
    held: &'a Held,
    limits: Box<crate::RunLimits>,
}

/// The turn's steps: model, dispatch, model, ... until an answer, a pause, an interrupt or
/// the step limit; then the run's close. They announce the run and open its journal first.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)] // on purpose: see `turn`
fn steps<'a>(
    rt: &'a Arc<Inner>,
    run_id: &'a str,
    agent: &'a AgentDef,
    // Owned: `drive`, which looked it up, returns this future without waiting on it.
    model: Arc<dyn Model>,
    record: Box<RunRecord>,
    state: Box<RunState>,
    events: &'a EventSender,
    ctx_parts: CtxParts<'a>,
    fence: &'a Arc<Fence>,
    hand_back: bool,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'a {
    async move {
        events.send(Event::RunStarted { run_id: run_id.to_owned() }).await;
        let CtxParts { created, interrupt, held, limits } = ctx_parts;
        // A fork's journal keeps its original's keys.
        let key_run = state.key_run.as_deref().unwrap_or(run_id);
        let journal = Box::pin(Journal::open(
            Arc::clone(&rt.store),
            Arc::clone(fence),
            key_run,
            record.epoch,
            rt.max_journal_entries,
            limits.counts_usage(),
            created,
        ))
        .await?;
        let ctx = &Arc::new(TurnCtx {
            journal,
            tools: rt.tools_of(agent),
            events: events.clone(),
            interrupt,
            max_concurrency: agent.max_tool_concurrency,
            max_result_bytes: rt.max_value_bytes,
            policy: rt.policy_of(agent),
            fatal: Mutex::new(None),
            // Calls cut off but still running are the lease's to wait for: see `Held::release`.
            stragglers: Arc::clone(held.stragglers()),
            capture_content: rt.capture_content,
            redact: if rt.capture_content {
                crate::Redactions::of_tools(agent.tools.iter().map(|t| &**t))
            } else {
                crate::Redactions::default()
            },
            budget: Budget::new(limits, record.created_at_ms),
        });

        // Shared with every request (never copied per step): a step costs the same at step 5,000
        // as at step 1.
        let mut transcript = state.messages.clone();
        if let Some(input) = &state.turn_input {
            transcript.push(Message::User { content: input.clone() });
        }
        let specs = rt.specs_of(agent);
        let mut typed = agent.output.as_ref().map(Typed::new);
        // A fork may run with other instructions than its agent's.
        let instructions = state.instructions.as_ref().unwrap_or(&agent.instructions);
        let system: Arc<str> = typed
            .as_ref()
            .map_or_else(|| Arc::from(instructions.as_str()), |t| t.output.instructions(instructions).into());
        // Boxed: held for the run's whole life, and most agents have none.
        let output_spec = typed.as_ref().map(|t| Box::new(t.output.spec(!agent.tools.is_empty())));
        // Both boxed: set at most once, at a turn's end, and each run's task holds their slots
        // through every model call (a value's 72 bytes, an error's 48).
        let mut value: Option<Box<serde_json::Value>> = None;
        let mut failure: Option<Box<crate::output::OutputError>> = None;
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
            if ctx.interrupt.is_cancelled() {
                status = RunStatus::Interrupted;
                break;
            }
            // Scoped: a local that was ever borrowed keeps its bytes in the future until its
            // scope ends, even once moved, and this one would through the model's whole latency.
            let (chat, step) = {
                let request = Box::new(ModelRequest {
                    system: Arc::clone(&system),
                    messages: transcript.clone(),
                    tools: Arc::clone(&specs),
                    output: output_spec.as_deref().cloned(),
                });
                let chat = crate::trace::ChatSpan::start(
                    run_id,
                    callsite,
                    &*model,
                    &request,
                    rt.capture_content.then_some(&ctx.redact),
                );
                // Boxed: `ChatSpan::run` and its task-local scope would each hold the step's
                // future again (about 5 KiB of every run's task while it waits on the model).
                (chat, Box::pin(model_step(rt, ctx, &*model, request, callsite)))
            };
            // Scoped, as the request above: the step's result and response end here, before
            // the awaits below, instead of taking room in the future beside the model's wait.
            let answer = {
                let (step, reported) = chat.run(step).await;
                chat.done(&reported, step.as_ref().map(|r| r.as_ref().map(|r| (&r.parts[..], &r.finish, r.usage))));
                let Some(response) = step? else {
                    status = RunStatus::Interrupted;
                    break;
                };
                usage += response.usage;
                let has_calls = response.has_calls();
                let ModelResponse { parts, origin, finish, .. } = response;
                Answer { parts, origin, finish, has_calls }
            };
            callsite += 1;
            if !answer.has_calls && typed.is_none() {
                // The answer, with nothing to check: nothing to wait for, and no box to make.
                text = final_answer(&mut transcript, answer.parts, answer.origin);
                status = RunStatus::Finished;
                break;
            }
            // Boxed: what the answer's handling keeps across its awaits (the parts, the
            // dispatched calls) would otherwise have slots in every run's task through the
            // model's whole latency, the state 10,000 runs in flight hold at once.
            let next = Box::pin(answered(
                ctx,
                agent,
                answer,
                &mut transcript,
                &mut typed,
                &mut failure,
                &mut callsite,
                Ends { value: &mut value, text: &mut text, status: &mut status, pending: &mut pending },
            ))
            .await?;
            if let Next::Stop = next {
                break;
            }
        }
        if let Some(v) = &value {
            text = v.to_string();
        }

        if status == RunStatus::Interrupted && hand_back && !fence.is_lost() {
            // A worker's shutdown: the run stays `running` for another worker. Every call this
            // turn ran was journaled as it ended; a model response may still wait to be written.
            Box::pin(ctx.journal.flush()).await?;
            return Err(RunError::HandedBack { run_id: run_id.to_owned() });
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
        // unwritten; it is journaled before, or with, the write that says the turn ended.
        if failure.is_some() && !fence.is_lost() {
            Box::pin(ctx.journal.flush()).await?;
        }
        if fence.is_lost() {
            // Another owner carries the run on; this turn writes nothing more.
            return Err(RunError::LeaseLost { run_id: run_id.to_owned(), token: fence.token() });
        }
        if let Some(e) = failure {
            // The turn's transcript and usage are kept (every repair shows in them); the run fails.
            let closing =
                Closing { transcript, status: RunStatus::Failed, text, usage, pending, value: None, last: None };
            Box::pin(close(RunWriter::new(rt.store.as_ref(), fence), &ctx.journal, *record, *state, closing)).await?;
            events.send(Event::Error { message: e.to_string() }).await;
            return Err((*e).into());
        }
        // One commit for the response and the run's end (`RunStore::put_run_and_release_after`).
        let last = ctx.journal.take_deferred();
        let closing = Closing { transcript, status, text, usage, pending, value: value.map(|v| *v), last };
        // The output (168 bytes) is held while `Done` is sent: in the boxed future, not in this
        // one, whose every byte is in every run's task through the model's whole latency.
        // Chained, not awaited inside one block: there the closing's fields (288 bytes), or
        // the close itself once moved into its await, kept a second slot beside the close,
        // and the box (1,592 bytes) was past glibc's per-thread cache (requests up to 1,032
        // bytes), whose misses take the arena's lock, in every run's close.
        let closed = close(RunWriter::new(rt.store.as_ref(), fence), &ctx.journal, *record, *state, closing);
        Box::pin(closed.then(move |out| async move {
            let out = out?;
            events.send(Event::Done { run_id: run_id.to_owned(), usage: out.usage }).await;
            Ok(out)
        }))
        .await
    }
}

/// The model's answer to one step, taken apart.
struct Answer {
    parts: Vec<Part>,
    origin: Option<Origin>,
    finish: FinishReason,
    has_calls: bool,
}

/// Whether the turn's steps go on after an answer.
enum Next {
    /// The model is asked again: its calls were answered, or a repair prompt was added.
    Ask,
    /// The turn ends with what [`Ends`] says: an answer, a pause or a failure.
    Stop,
}

/// What a turn ends with, set as its answers come.
struct Ends<'e> {
    value: &'e mut Option<Box<serde_json::Value>>,
    text: &'e mut String,
    status: &'e mut RunStatus,
    pending: &'e mut Vec<Pending>,
}

/// What the turn does with the model's answer: takes a final one, or dispatches its calls and
/// adds them and their results to the transcript.
///
/// Not an `async fn` (see [`turn`]); the answer's fields are used where they were passed for
/// the same reason. Every run of a wave of answers holds this future at once while its calls'
/// intents commit.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)] // on purpose: see above
fn answered<'a>(
    ctx: &'a Arc<TurnCtx>,
    agent: &'a AgentDef,
    mut answer: Answer,
    transcript: &'a mut crate::transcript::Transcript,
    typed: &'a mut Option<Typed<'_>>,
    failure: &'a mut Option<Box<crate::output::OutputError>>,
    callsite: &'a mut u64,
    ends: Ends<'a>,
) -> impl Future<Output = Result<Next, RunError>> + Send + 'a {
    async move {
        if !answer.has_calls {
            *ends.text = final_answer(transcript, answer.parts, answer.origin);
            if let Some(t) = typed.as_mut() {
                let judged = t.judge_text(ends.text, &answer.finish);
                // Boxed, as the other `settle` below: only a typed output's turn awaits it.
                match Box::pin(settle(t, judged, ctx, *callsite, Some(transcript), failure)).await? {
                    Some(v) => *ends.value = Some(Box::new(v)),
                    None if failure.is_none() => return Ok(Next::Ask),
                    None => return Ok(Next::Stop),
                }
            }
            *ends.status = RunStatus::Finished;
            return Ok(Next::Stop);
        }
        // The calls go straight into `dispatch`, and the callsites are counted before it: a
        // local for either kept a slot in this future beside dispatch's, and 1,080 bytes made
        // its box too large for glibc's per-thread cache (requests up to 1,032 bytes), so it
        // took the arena's lock twice a turn. An error ends the turn, so the count's order
        // does not matter.
        let first = *callsite;
        *callsite += answer.parts.iter().filter(|p| matches!(p, Part::ToolCall { .. })).count() as u64;
        let dispatched = dispatch::dispatch(ctx, take_calls(&mut answer.parts), first).await?;
        if !dispatched.pending.is_empty() {
            // The turn resumes from its start once decided: everything before the pending
            // calls replays from the journal, so only the decision is missing. (The transcript
            // is rolled back to the turn's start, so it never gets this response.)
            *ends.pending = dispatched.pending;
            *ends.status = RunStatus::Paused;
            return Ok(Next::Stop);
        }
        // Dispatch reads nothing of the transcript, so the response joins it only now, its
        // calls rebuilt from what dispatch gives back instead of copied before dispatch: every
        // call answered, in source order, since nothing is pending.
        let judged =
            typed.as_ref().and_then(|t| t.judge_calls(&dispatched.outcomes, &answer.finish, &text_of(&answer.parts)));
        let mut tool_calls = Vec::with_capacity(dispatched.outcomes.len());
        let mut results = Vec::with_capacity(dispatched.outcomes.len());
        for o in dispatched.outcomes {
            let content = truncate_owned(dispatch::into_model_value(o.result), agent.max_tool_result_tokens);
            results.push(Message::Tool { call_id: o.call_id.clone(), name: o.name.clone(), content });
            tool_calls.push(ToolCallRequest { call_id: o.call_id, name: o.name, arguments: o.arguments });
        }
        put_calls(&mut answer.parts, tool_calls);
        transcript.push(Message::Assistant { parts: answer.parts, origin: answer.origin });
        for message in results {
            transcript.push(message);
        }
        if let (Some(t), Some(judged)) = (typed.as_mut(), judged) {
            // A rejected call's error is its result, already in the transcript: the repair prompt.
            if let Some(v) = Box::pin(settle(t, judged, ctx, *callsite, None, failure)).await? {
                *ends.value = Some(Box::new(v));
                *ends.status = RunStatus::Finished;
                return Ok(Next::Stop);
            }
            if failure.is_some() {
                return Ok(Next::Stop);
            }
        }
        Ok(Next::Ask)
    }
}

/// Adds the model's final answer to the transcript; returns its text.
fn final_answer(transcript: &mut crate::transcript::Transcript, parts: Vec<Part>, origin: Option<Origin>) -> String {
    let message = Message::Assistant { parts, origin };
    let text = message.text();
    transcript.push(message);
    text
}

/// An answer's end: the accepted value (journaled), or `None` with either a repair prompt
/// added to `transcript` (when given) or the `failure` that ends the run.
async fn settle(
    typed: &mut Typed<'_>,
    judged: Judged,
    ctx: &TurnCtx,
    callsite: u64,
    transcript: Option<&mut crate::transcript::Transcript>,
    failure: &mut Option<Box<crate::output::OutputError>>,
) -> Result<Option<serde_json::Value>, RunError> {
    match judged {
        Judged::Accepted(v) => return typed.record(ctx, callsite, v).await.map(Some),
        Judged::Repair(problem) => match typed.reject(&problem) {
            Ok(prompt) => {
                if let Some(transcript) = transcript {
                    transcript.push(Message::User { content: prompt });
                }
            }
            Err(e) => *failure = Some(Box::new(e)),
        },
        Judged::Failed(e) => *failure = Some(Box::new(e)),
    }
    Ok(None)
}

/// The text parts of a response, joined.
fn text_of(parts: &[crate::model::Part]) -> String {
    parts
        .iter()
        .filter_map(|p| if let crate::model::Part::Text { text, .. } = p { Some(text.as_str()) } else { None })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_refuses_the_connection_leaves_the_run_resumable() {
        for refused in [StoreError::Tls("UnknownIssuer".into()), StoreError::AccessDenied("28000".into())] {
            assert!(!ends_the_run(&RunError::Store(refused)));
        }
        assert!(ends_the_run(&RunError::Store(StoreError::Corrupt("bad schema".into()))));
    }
}
