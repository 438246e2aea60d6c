//! Opening a turn: a new run, a new turn of an existing one (a new epoch), or the unfinished
//! turn of a run that resumes; inbound idempotency keys say which.

use super::{
    Inner, RunRequest, limits,
    state::{RunState, decode_state, output_of},
};
use crate::{
    agent::AgentDef,
    clock::now_ms,
    error::RunError,
    event::RunOutput,
    journal::RunWriter,
    json::JsonText,
    model::Usage,
    store::{RunRecord, RunStatus},
};

/// How many processed inbound idempotency keys a run remembers.
pub(super) const INBOUND_KEYS_KEPT: usize = 64;

pub(super) enum Opened {
    Turn {
        record: Box<RunRecord>,
        state: Box<RunState>,
        /// Whether the run was created by this turn (so its journal is empty).
        created: bool,
    },
    /// Boxed: the turn's future keeps what it opened through the run's whole life.
    Done(Box<RunOutput>),
}

impl Opened {
    /// The turn of a run its lease request created ([`Prefetched::Created`]): nothing to read
    /// or write, so the turn takes it without `open`'s future.
    pub(super) fn created(created: Box<(RunRecord, RunState)>) -> Self {
        let (record, state) = *created;
        Self::Turn { record: Box::new(record), state: Box::new(state), created: true }
    }
}

pub(super) fn agent<'a>(rt: &'a Inner, id: Option<&str>) -> Result<&'a AgentDef, RunError> {
    match id {
        None => Ok(&rt.agents[0]),
        Some(id) => rt.agents.iter().find(|a| a.id == id).ok_or_else(|| RunError::UnknownAgent {
            id: id.to_owned(),
            available: rt.agents.iter().map(|a| a.id.as_str()).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// The limits a turn opened by `req` holds to; a configuration error, before anything is
/// recorded, for a dollar cap on an unpriced model.
fn turn_limits(rt: &Inner, agent: &AgentDef, req: &RunRequest) -> Result<crate::limits::RunLimits, RunError> {
    let limits = limits::for_turn(agent, req);
    if let Some(model) = agent.model.as_deref().or(rt.model.as_deref()) {
        limits::priced(limits.max_cost_usd.is_some(), &agent.id, model, &rt.pricing)?;
    }
    Ok(limits)
}

/// A turn's request, with the run as its lease request read it. One box: the turn's future
/// holds it until the run is open, and every byte of that future is held by each run in flight
/// (the run's task sat at the edge of its allocation size).
pub(super) struct Opening {
    pub(super) req: RunRequest,
    pub(super) read: Prefetched,
}

/// The run as the turn's lease request read it, or not read yet.
pub(super) enum Prefetched {
    /// The lease came without the run (a worker's claim, a decision recorded since): read it.
    Unread,
    /// A run id the runtime made: no lease taken yet, and no run to read; the lease request
    /// creates it ([`RunStore::acquire_lease_and_create_run`](crate::RunStore::acquire_lease_and_create_run)).
    New,
    /// Read in the same request as the lease: `None` when there is no such run yet.
    Read(Option<Box<RunRecord>>),
    /// Created in the same request as the lease ([`new_run`]): the row as the turn keeps it,
    /// and its state.
    Created(Box<(RunRecord, RunState)>),
}

pub(super) async fn open(
    rt: &Inner,
    req: &mut RunRequest,
    writer: RunWriter<'_>,
    read: Prefetched,
) -> Result<Opened, RunError> {
    let run_id = writer.run_id();
    let read = match read {
        Prefetched::Read(run) => run.map(|run| *run),
        // `New` is replaced when the lease is taken; read as any run should it not be.
        Prefetched::Unread | Prefetched::New => writer.get_run().await?,
        // `turn` takes a created run without calling `open`; kept so that `open` opens any.
        Prefetched::Created(created) => return Ok(Opened::created(created)),
    };
    let Some(mut record) = read else {
        // Boxed: only a caller's id read missing takes this path (a run the runtime names, or
        // a caller's new one, is created with its lease), and inline its row and state kept
        // `open`'s future at 1,240 bytes, past glibc's per-thread cache (requests up to 1,032
        // bytes), for every later turn of a conversation.
        return Box::pin(async move {
            let (mut record, state) = new_run(rt, req, run_id)?;
            writer.create_run(for_store(&mut record)).await?;
            Ok(Opened::Turn { record: Box::new(record), state: Box::new(state), created: true })
        })
        .await;
    };
    let mut state = decode_state(&record)?;
    // Decoded: what the turn keeps of the row is the rest (see `for_store`).
    record.state = JsonText::null();
    if let Ok(agent) = agent(rt, Some(&record.agent_id)) {
        state.redact = redactions(agent);
    }
    if req.retry {
        // Boxed: only a retry takes this path, and inline it made every run's opening future
        // 1.4 KiB, past the allocator's small sizes.
        return Box::pin(reopen_failed(writer, record, state)).await;
    }
    let unfinished = matches!(record.status, RunStatus::Running | RunStatus::Paused);
    let seen = req.idempotency_key.as_ref().is_some_and(|k| state.inbound_keys.contains(k));
    match &req.input {
        _ if seen && !unfinished => return Ok(Opened::Done(Box::new(output_of(&record, &state)))),
        None | Some(_) if seen => {
            return Ok(Opened::Turn { record: Box::new(record), state: Box::new(state), created: false });
        }
        None if unfinished => {
            return Ok(Opened::Turn { record: Box::new(record), state: Box::new(state), created: false });
        }
        None => return Ok(Opened::Done(Box::new(output_of(&record, &state)))),
        Some(input) if unfinished => {
            return if state.turn_input.as_ref() == Some(input) {
                Ok(Opened::Turn { record: Box::new(record), state: Box::new(state), created: false })
            } else {
                Err(RunError::TurnInProgress(run_id.to_owned()))
            };
        }
        Some(input) => {
            // A new user turn: a new epoch, so the same call made again is a new effect.
            state.limits = Some(Box::new(turn_limits(rt, agent(rt, Some(&record.agent_id))?, req)?));
            record.epoch += 1;
            record.status = RunStatus::Running;
            state.turn_input = Some(input.clone());
            state.output.clear();
            state.value = None;
            state.usage = Usage::default();
            if let Some(k) = &req.idempotency_key {
                state.inbound_keys.push(k.clone());
                let excess = state.inbound_keys.len().saturating_sub(INBOUND_KEYS_KEPT);
                state.inbound_keys.drain(..excess);
            }
            record.state = JsonText::serialize_from(&state).unwrap_or_default();
            record.updated_at_ms = now_ms();
            record.version = writer.put_run(for_store(&mut record)).await?;
        }
    }
    Ok(Opened::Turn { record: Box::new(record), state: Box::new(state), created: false })
}

/// The row and state of a new run `run_id` for `req`, its input moved into the state; nothing
/// is written. `RunNotFound` for a request without input (a resume of no run), and the
/// request's own errors (an unknown agent, a dollar cap on an unpriced model).
pub(super) fn new_run(rt: &Inner, req: &mut RunRequest, run_id: &str) -> Result<(RunRecord, RunState), RunError> {
    if req.input.is_none() {
        return Err(RunError::RunNotFound(run_id.to_owned()));
    }
    let agent = agent(rt, req.agent.as_deref())?;
    let limits = turn_limits(rt, agent, req)?;
    let state = RunState {
        // Moved, not copied (the request is dropped once the turn is open), and only once
        // nothing above refused the request.
        turn_input: req.input.take(),
        inbound_keys: req.idempotency_key.iter().cloned().collect(),
        redact: redactions(agent),
        limits: Some(Box::new(limits)),
        ..RunState::default()
    };
    let record =
        RunRecord::new(run_id, agent.id.clone()).with_state(JsonText::serialize_from(&state).unwrap_or_default());
    Ok((record, state))
}

/// `Runtime::retry`: the failed turn opens again in its own epoch, so its journal replays.
pub(super) async fn reopen_failed(
    writer: RunWriter<'_>,
    mut record: RunRecord,
    mut state: RunState,
) -> Result<Opened, RunError> {
    if record.status != RunStatus::Failed {
        return Err(RunError::WrongStatus {
            run_id: record.run_id,
            status: record.status,
            action: "retry",
            allowed: "failed",
        });
    }
    if let Some(start) = state.turn_start.take() {
        state.messages = state.messages.prefix(start);
    }
    record.status = RunStatus::Running;
    record.state = JsonText::serialize_from(&state).unwrap_or_default();
    record.updated_at_ms = now_ms();
    record.version = writer.put_run(for_store(&mut record)).await?;
    Ok(Opened::Turn { record: Box::new(record), state: Box::new(state), created: false })
}

/// `record` as the store writes it, and left behind for the turn without its state. The state
/// is already decoded (`RunState`), and the turn's close writes it anew from there, so the
/// turn holding its JSON as well kept the run's whole conversation twice until the close.
pub(super) fn for_store(record: &mut RunRecord) -> RunRecord {
    let state = std::mem::take(&mut record.state);
    RunRecord { state, ..record.clone() }
}

fn redactions(agent: &AgentDef) -> crate::Redactions {
    crate::Redactions::of_tools(agent.tools.iter().map(|t| &**t))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store gets the whole row, its state's very text; the turn keeps the row without it.
    #[test]
    fn the_turn_keeps_the_row_without_its_state() {
        let state = JsonText::from(serde_json::json!({"messages": ["a long conversation"]}));
        let mut record = RunRecord::new("run-1", "agent").with_state(state.clone());
        record.version = 3;
        let stored = for_store(&mut record);
        assert_eq!(stored.state.as_str().as_ptr(), state.as_str().as_ptr(), "the same text, not a copy");
        assert_eq!(record.state, JsonText::null());
        assert_eq!((stored.run_id.as_str(), stored.version), (record.run_id.as_str(), record.version));
    }
}
