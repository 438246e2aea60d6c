//! Human decisions: recorded on a paused run's pending calls under the run's lease, without
//! resuming it.

use tokio_util::sync::CancellationToken;

use super::{
    Decision,
    lease::{self},
    state::decode_state,
};
use crate::{
    approval::{DecisionClock, Pending, RecordedDecision, RequestId},
    clock::now_ms,
    error::RunError,
    journal::{Fence, RunWriter},
    json::JsonText,
    store::{Lease, RunRecord, RunStatus, RunStore, StepKind, StepOutcome},
};

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
    // Checked before the lease is taken: a lease row is kept for good once granted (its
    // fencing tokens are never reused), so a made-up run id must not get one.
    if store.get_run(run_id).await?.is_none() {
        return Err(RunError::RunNotFound(run_id.to_owned()));
    }
    let (lease, _) = lease::acquire(store, &lease::owner_id(None), run_id, lease::DEFAULT_LEASE_TTL, None).await?;
    let fence = Fence::new(&lease, CancellationToken::new());
    let at = DecidedAt::granted(&lease, lease::DEFAULT_LEASE_TTL);
    let result = fence.settle(record_under(store, &fence, run_id, decision, at).await);
    if !fence.is_lost() {
        let _ = store.release_lease(&lease).await;
    }
    if result.is_ok() {
        // Only a hint for idle workers; they poll as well.
        let _ = store.notify_runnable().await;
    }
    result
}

/// When a decision was taken, and by whose clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct DecidedAt(i64, DecisionClock);

impl DecidedAt {
    /// The store's clock as it granted `lease` for `ttl`: a lease's expiry is stamped by the
    /// store (the database server's clock for PostgreSQL), so clients with skewed clocks agree.
    pub(super) fn granted(lease: &Lease, ttl: std::time::Duration) -> Self {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Self(lease.expires_at_ms.saturating_sub(ttl_ms), DecisionClock::Store)
    }

    /// This process's clock.
    pub(super) fn process() -> Self {
        Self(now_ms(), DecisionClock::Process)
    }
}

/// [`record_decision`] under a lease the caller holds.
pub(super) async fn record_under(
    store: &dyn RunStore,
    fence: &Fence,
    run_id: &str,
    decision: &Decision,
    at: DecidedAt,
) -> Result<(), RunError> {
    let writer = RunWriter::new(store, fence);
    let record = writer.get_run().await?.ok_or_else(|| RunError::RunNotFound(run_id.to_owned()))?;
    let state = decode_state(&record)?;
    let request_id = || decision.request_id.clone().unwrap_or_else(|| "*".to_owned());
    let recorded: std::collections::HashMap<String, (u64, crate::store::StepStatus)> =
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
        .filter(|p| {
            recorded.get(&p.decision_key).is_none_or(|&(_, status)| status == crate::store::StepStatus::Running)
        })
        .collect();
    if undecided.is_empty() {
        // Decided before, and the run is still paused: the process that recorded the decisions
        // died before it made the run runnable. Make it runnable now (a resume or a worker
        // carries the decisions out), and tell this caller its decision came second.
        if record.status == RunStatus::Paused && state.pending.iter().all(|p| recorded.contains_key(&p.decision_key)) {
            make_runnable(writer, record).await?;
        }
        return Err(RunError::AlreadyDecided { run_id: run_id.to_owned(), request_id: request_id() });
    }
    let value = JsonText::serialize_from(&RecordedDecision {
        approved: decision.approved,
        by: decision.by.clone(),
        reason: decision.reason.clone(),
        at_ms: Some(at.0),
        clock: Some(at.1),
        channel: Some(decision.channel.clone().unwrap_or_else(|| "api".to_owned())),
        origin: decision.origin.clone(),
    })
    .unwrap_or_default();
    for p in undecided {
        if let Some(&(ordinal, _)) = recorded.get(&p.decision_key) {
            let outcome = StepOutcome::Finished(value.clone());
            writer.finish_step(ordinal, outcome, now_ms()).await?;
            continue;
        }
        let step = crate::store::NewStep {
            key: p.decision_key.clone(),
            kind: StepKind::Approval,
            name: p.request.name.clone(),
            epoch: record.epoch,
            started_at_ms: now_ms(),
        };
        let ordinals = writer.append_steps(vec![step]).await?;
        let outcome = StepOutcome::Finished(value.clone());
        writer.finish_step(ordinals[0], outcome, now_ms()).await?;
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
        make_runnable(writer, record).await?;
    }
    Ok(())
}

/// Marks a run whose every pending call is decided `running`, so a resume or a worker of any
/// process carries the decisions out.
pub(super) async fn make_runnable(writer: RunWriter<'_>, record: RunRecord) -> Result<(), RunError> {
    let runnable = RunRecord { status: RunStatus::Running, updated_at_ms: now_ms(), ..record };
    writer.put_run(runnable).await?;
    Ok(())
}
