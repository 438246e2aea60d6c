//! The leased entry points of a turn: `run` (and `run_leased` for a worker that claimed the
//! run), and `submit`, which records a turn for a worker without running it.

use std::sync::Arc;

use futures::{FutureExt, future::Either};

use tokio_util::sync::CancellationToken;

use super::{
    Decision, Inner, RunRequest,
    decide::{DecidedAt, record_under},
    instance::Claim,
    lease::{self, Held},
    open::{Opening, Prefetched, for_store, new_run, open},
    turn::turn,
};
use crate::{
    error::RunError,
    event::{Event, EventSender, RunOutput},
    journal::{Fence, RunWriter},
    store::{RunStatus, StoreError},
};

/// One turn under the run's lease: taken before anything is read, renewed while the turn
/// runs, released when it closes (a paused run holds no lease). With `decision`, the decision
/// is recorded under the same lease first (`deliver`).
///
/// Not `async`: an async fn would hold its arguments beside the future it awaits.
pub(super) fn run(
    rt: Arc<Inner>,
    req: RunRequest,
    events: EventSender,
    interrupt: CancellationToken,
    decision: Option<Decision>,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'static {
    run_leased(rt, req, events, interrupt, decision, None)
}

/// [`run`], under `claimed` when the caller already holds the run's lease (a worker that
/// claimed the run from the queue, under its instance claim), with when the claim was sent.
///
/// Not an `async fn`: an async fn's future stores each argument twice (as it came in and as
/// the body's local), and this future is every run's task.
pub(super) fn run_leased(
    rt: Arc<Inner>,
    req: RunRequest,
    events: EventSender,
    interrupt: CancellationToken,
    decision: Option<Decision>,
    claimed: Option<(crate::store::Lease, tokio::time::Instant, Claim)>,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'static {
    // The request, the decision and the claim are boxed (the run's future keeps what it
    // captures for its whole life, and these are read only at its start) at the run's first
    // poll, on the thread that runs it. Boxed here, on the caller's thread, the request was
    // freed when the turn opened, by whichever worker ran it, into the caller's glibc arena
    // under that arena's lock, which the caller held while it started the next run: with
    // 10,000 runs started at once, 3,000–10,500 futex calls where there are now about 130, and
    // the last run's first request at 79 ms instead of 46. `then` keeps what waits for the
    // first poll and the run's future in one slot (the two states of one enum): the future
    // grows by that enum's tag, 8 bytes, and the task not at all.
    futures::future::ready(()).then(move |()| {
        // A run id the runtime makes is a run nobody knows yet: its lease creates it.
        let read = if req.run_id.is_none() { Prefetched::New } else { Prefetched::Unread };
        let opening = Box::new(Opening { req, read });
        leased(rt, opening, events, interrupt, decision.map(Box::new), claimed.map(Box::new))
    })
}

/// The run's turn once its request is boxed ([`run_leased`]).
///
/// One layer, not an async block awaiting another that borrows its run id: the turn hands the
/// run id, the runtime and the events back with its result, and the ending that tells the
/// events of an error takes them from there. The outer block's locals and the inner one's
/// borrows of them (80 and 32 bytes) were in every run's task for the run's whole life; the
/// one block owns what it borrowed, and the run's future is 64 bytes smaller (896 to 832).
fn leased(
    rt: Arc<Inner>,
    mut opening: Box<Opening>,
    events: EventSender,
    interrupt: CancellationToken,
    decision: Option<Box<Decision>>,
    claimed: Option<Box<(crate::store::Lease, tokio::time::Instant, Claim)>>,
) -> impl Future<Output = Result<RunOutput, RunError>> + Send + 'static {
    // Moved, not copied: nothing reads the request's id again. A caller's id is a string
    // made on the caller's thread, and a copy freed its original when the turn opened, into
    // the caller's arena (see `run_leased`); now it lives as long as the run.
    let run_id = opening.req.run_id.take().unwrap_or_else(crate::store::new_run_id);
    // The turn's `invoke_agent` span opens in `drive`, once the run's agent is known: its
    // OpenTelemetry name is fixed when the span starts (see `trace::agent_span`).
    async move {
        // A labelled block, not an inner async block: an awaited result bound to a local, or
        // a local an inner block borrows, keeps its slot beside the turn in every run's task.
        let result = 'turn: {
            // A lease granted here says the store's time; a claimed one was granted earlier.
            let mut decided_at = DecidedAt::process();
            // In a block of its own: the lease is borrowed (for the log line), and a local once
            // borrowed keeps its slot in this future (every run's task) to the end of its scope,
            // which was the run's whole turn.
            let (held, claim) = {
                let (lease, granted, claim) = match claimed {
                    Some(claimed) => *claimed,
                    None => {
                        // No lease under the instance's id without the proof that this process
                        // holds it. Boxed, as in `turn`: the run's task keeps only what it waits
                        // on for long.
                        let claim = match Box::pin(rt.claim_instance()).await {
                            Ok(claim) => claim,
                            Err(e) => break 'turn Err(e),
                        };
                        let owner = rt.owner_id();
                        let creating = decision.is_none();
                        let (lease, granted) =
                            match Box::pin(take_lease(&rt, &owner, &run_id, &mut opening, creating)).await {
                                Ok(taken) => taken,
                                Err(e) => break 'turn Err(e),
                            };
                        decided_at = DecidedAt::granted(&lease, rt.lease_ttl);
                        (lease, granted, claim)
                    }
                };
                tracing::debug!(run_id = %run_id, token = lease.token, owner = %lease.owner, "took the run's lease");
                (Held::start(&rt.renewals, lease, granted, interrupt.clone()), claim)
            };
            if !rt.holds(claim) {
                // The proof was lost since the claim, and possibly before this lease registered
                // (so the loss did not stop it): stop here.
                held.fence().lose();
            }
            let fence = Arc::clone(held.fence());
            // Its error boxed: the outcome is matched around the turn's await, so it keeps a
            // slot for the turn's whole life, now a pointer's.
            let recorded = match &decision {
                Some(d) => {
                    // Recording the decision rewrites the run: the turn reads it again.
                    opening.read = Prefetched::Unread;
                    Box::pin(record_under(rt.store.as_ref(), &fence, &run_id, d, decided_at)).await.map_err(Box::new)
                }
                None => Ok(()),
            };
            let result = match recorded {
                Ok(()) => turn(&rt, opening, &run_id, &events, interrupt, &held).await,
                Err(e) => Err(*e),
            };
            let result = fence.settle(result);
            Box::pin(held.release()).await;
            result
        };
        (result, rt, run_id, events)
    }
    // Boxed, and only for the rare endings: each result this future holds across an await
    // is a slot of every run's task for the run's whole life (two were 336 bytes of each).
    // Sorted by value, not by reference: a result once borrowed keeps its slot.
    .then(|(result, rt, run_id, events)| match Ending::of(result) {
        Ending::Quiet(result) => Either::Left(std::future::ready(result)),
        Ending::Told(result) => Either::Right(Box::pin(async move { told(&rt, &run_id, &events, result).await })),
    })
}

/// Takes the run's lease for a turn, with the run read in the same request (one request to
/// the store, not two), or created in it: for a run id the runtime made
/// ([`Prefetched::New`]), and, unless `may_create` is false (a decision is recorded first),
/// for a run its caller names with a turn's input. A new run's lease and row were two writes.
/// What was read or created goes to `opening.read`.
async fn take_lease(
    rt: &Inner,
    owner: &str,
    run_id: &str,
    opening: &mut Opening,
    may_create: bool,
) -> Result<(crate::store::Lease, tokio::time::Instant), RunError> {
    let store = rt.store.as_ref();
    let made_here = matches!(opening.read, Prefetched::New);
    // A caller's id with a turn's input: the request that starts a run, and every later turn
    // of it (a conversation is one run), which finds the run there and gets it back read, as
    // the read below would, at the cost of building a record it does not use. A request
    // `new_run` refuses is refused, as before, once the run is read and found missing.
    let caller_new = !made_here && may_create && opening.req.input.is_some();
    if made_here || caller_new {
        match new_run(rt, &mut opening.req, run_id) {
            Err(e) if made_here => return Err(e),
            // Refused: the read below finds whether there is a run to take the turn.
            Err(_) => {}
            Ok((mut record, state)) => {
                match lease::acquire_creating(store, owner, for_store(&mut record), rt.lease_ttl).await {
                    Ok(((lease, there), granted)) => {
                        opening.read = match there {
                            None => Prefetched::Created(Box::new((record, state))),
                            // The run was there: the turn opens it as any run, with its input back.
                            Some(run) => {
                                opening.req.input = state.turn_input;
                                Prefetched::Read(Some(Box::new(run)))
                            }
                        };
                        return Ok((lease, granted));
                    }
                    Err(e) if caller_new && left_to_the_read(&e, opening.req.wait_for_lease.is_some()) => {
                        opening.req.input = state.turn_input;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    let ((lease, run), granted) =
        lease::acquire_reading(store, owner, run_id, rt.lease_ttl, opening.req.wait_for_lease).await?;
    opening.read = Prefetched::Read(run.map(Box::new));
    Ok((lease, granted))
}

/// Whether the lease-and-create request's refusal of a caller's new run is left to the read
/// that [`take_lease`] makes otherwise: a lease another owner holds while the caller waits
/// (the read polls), or a new run's state too large to store (whether that matters is for the
/// run that may be there to say: a turn in progress, a key seen).
fn left_to_the_read(refusal: &RunError, waits: bool) -> bool {
    match refusal {
        RunError::Busy { .. } => waits,
        RunError::Store(StoreError::LimitExceeded(_)) => true,
        _ => false,
    }
}

type TurnResult = Result<RunOutput, RunError>;

/// A turn's result, sorted by whether the run's events must be told of it ([`told`]).
enum Ending {
    Quiet(TurnResult),
    /// An error, or a cancelled run.
    Told(TurnResult),
}

impl Ending {
    fn of(result: TurnResult) -> Self {
        match &result {
            Ok(out) if out.status != RunStatus::Cancelled => Self::Quiet(result),
            _ => Self::Told(result),
        }
    }
}

/// A turn that failed or was cancelled, told on the run's events: a lost lease is the run's
/// cancellation when `cancel_run` took it.
async fn told(rt: &Inner, run_id: &str, events: &EventSender, result: TurnResult) -> TurnResult {
    let result = match result {
        Err(RunError::LeaseLost { .. }) => Box::pin(cancelled(rt, run_id)).await.map_or(result, Ok),
        other => other,
    };
    match &result {
        Err(e) => events.send(Event::Error { message: e.to_string() }).await,
        Ok(out) if out.status == RunStatus::Cancelled => {
            events.send(Event::Done { run_id: run_id.to_owned(), usage: out.usage }).await;
        }
        Ok(_) => {}
    }
    result
}

/// The output of a turn that lost its lease because the run was cancelled (`cancel_run`
/// released it), or `None` when another owner took it. Read only after a lost lease, so the
/// hot path has no extra read.
async fn cancelled(rt: &Inner, run_id: &str) -> Option<RunOutput> {
    let record = rt.store.get_run(run_id).await.ok()??;
    (record.status == RunStatus::Cancelled).then(|| RunOutput {
        run_id: run_id.to_owned(),
        text: String::new(),
        status: RunStatus::Cancelled,
        usage: crate::model::Usage::default(),
        value: None,
    })
}

/// Records the request's turn without running it (`Runtime::submit`): a new run, or a new
/// turn of an existing one, in status `running` with no lease, so that a worker claims it.
/// Returns the run id. A request whose idempotency key the run already processed changes
/// nothing.
///
/// The lease is taken as a turn takes it ([`take_lease`]): a new run (one the runtime names,
/// or a caller's with a turn's input) is created in the same request, so on PostgreSQL a new
/// run's submission is three requests (the lease with the run, the release, the hint to
/// workers) where reading, then creating, made it five. As for `run`, if that request's answer
/// is lost the run may exist with its lease held: a worker claims it once the lease expires.
pub(super) async fn submit(rt: &Inner, mut req: RunRequest) -> Result<String, RunError> {
    let read = if req.run_id.is_none() { Prefetched::New } else { Prefetched::Unread };
    let run_id = req.run_id.take().unwrap_or_else(crate::store::new_run_id);
    rt.claim_instance().await?;
    let mut opening = Opening { req, read };
    let (lease, _) = take_lease(rt, &rt.owner_id(), &run_id, &mut opening, true).await?;
    let fence = Fence::new(&lease, CancellationToken::new());
    let Opening { mut req, read } = opening;
    let opened = fence.settle(open(rt, &mut req, RunWriter::new(rt.store.as_ref(), &fence), read).await.map(|_| ()));
    if !fence.is_lost() {
        let _ = rt.store.release_lease(&lease).await;
    }
    opened?;
    // Only a hint for idle workers; they poll as well.
    let _ = rt.store.notify_runnable().await;
    Ok(run_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AgentDef, Runtime, testing::ScriptedModel};

    /// Every run in flight is one such future on the heap, for as long as it waits on its
    /// model: 10,000 runs hold 10,000 of them. It was 5.2 KiB (an async fn stores its
    /// arguments twice, and a local once borrowed keeps its bytes while later awaits run),
    /// then 2.4 KiB, 1,600, 1,272, 1,168, 1,000, 904 and 896 bytes, and is 760: results held
    /// across an await, the lease borrowed for a log line, the model's last event, the answer's
    /// parts, the open's writer and outcome, copies of the turn's and the step's spans, the
    /// provider's report, the turn's output, a layer that only prepared the steps, a layer
    /// that only kept the run id for the ending, and the open's request kept slots beside the
    /// model's wait (the last 8 bytes are the tag of `run_leased`'s `then`). Tokio allocates a
    /// task in steps of 128 bytes (its cell is cache-line aligned, about 100 bytes of it
    /// Tokio's own): 760 bytes make a task of 896 (heaptrack's count), 896 and 904 one of
    /// 1,024, 1,000 one of 1,152, 1,168 one of 1,280. The bound leaves room for an 8-byte tag
    /// around the future in Tokio's cell.
    #[test]
    fn a_runs_task_stays_small() {
        let runtime =
            Runtime::builder().agent(AgentDef::new("a", "Be brief.")).model(ScriptedModel::new([])).build().unwrap();
        let (events, _receiver) = EventSender::channel(1);
        let task = run(Arc::clone(&runtime.inner), RunRequest::new("hi"), events, CancellationToken::new(), None);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 776, "a run's future is {size} bytes");
    }
}
