//! Forking a run at a step ("time travel"): a new run whose journal is a copy of the
//! original's up to an ordinal, which then goes on, optionally under another agent (another
//! model) or other instructions.

use std::time::Duration;

use super::state::{RunState, decode_state};
use crate::{
    error::RunError,
    json::JsonText,
    model::Message,
    store::{NewStep, RunRecord, RunStore, StepOutcome, StepStatus},
};

/// How a fork differs from its original: its run id, agent and instructions.
///
/// ```
/// let options = kuralle::ForkOptions::new().run_id("run-1-fork").agent("support-v2").instructions("Be kind.");
/// assert_eq!(options.agent_id(), Some("support-v2"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForkOptions {
    run_id: Option<String>,
    agent: Option<String>,
    instructions: Option<String>,
}

impl ForkOptions {
    /// A fork with a fresh id, the original's agent and instructions.
    pub fn new() -> Self {
        Self::default()
    }

    /// The fork's run id (default: a new UUID).
    #[must_use]
    pub fn run_id(mut self, id: impl Into<String>) -> Self {
        self.run_id = Some(id.into());
        self
    }

    /// Run the fork as this registered agent: its model (another model) and instructions. Its
    /// tools must include those of the copied steps, which replay by name.
    #[must_use]
    pub fn agent(mut self, id: impl Into<String>) -> Self {
        self.agent = Some(id.into());
        self
    }

    /// The fork's instructions instead of its agent's (kept in the run's state, so they hold
    /// for every later turn and resume).
    #[must_use]
    pub fn instructions(mut self, text: impl Into<String>) -> Self {
        self.instructions = Some(text.into());
        self
    }

    /// The agent given with [`agent`](Self::agent).
    pub fn agent_id(&self) -> Option<&str> {
        self.agent.as_deref()
    }
}

/// Forks run `run_id` at journal ordinal `at`, through the store alone (the CLI uses it; a
/// [`Runtime`](crate::Runtime) uses [`Runtime::fork`](crate::Runtime::fork)); returns the new
/// run's id.
///
/// The fork's journal is a copy of the original's finished (and failed) steps with ordinals
/// below `at`; steps that were still running are left out, so they run again. The fork opens
/// the turn (epoch) that step `at` belongs to (or the last step's, for `at` = the journal's
/// length), from that turn's start: the transcript before it and its user input. Its status is
/// `running` with no owner, so [`Runtime::resume`](crate::Runtime::resume) or any worker runs
/// it: every copied step replays, and the turn goes on from step `at`. The original is not
/// changed.
///
/// Turns are told apart by the transcript's user messages, so a fork inside a turn of a run
/// whose typed output asked for a repair (a repair prompt is a user message) may open the
/// wrong turn.
///
/// ```
/// use kuralle::{AgentDef, ForkOptions, RunRequest, RunStatus, Runtime, testing::{ScriptedModel, Turn}};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("support", "Be brief."))
///     .model(ScriptedModel::by_transcript([Turn::text("Hello.")]))
///     .build()?;
/// runtime.run(RunRequest::new("Hi").run_id("run-1")).await?;
/// let fork = kuralle::fork_run(runtime.store().as_ref(), "run-1", 1, &ForkOptions::new()).await?;
/// assert_eq!(runtime.journal(&fork).await?.len(), 1);
/// assert_eq!(runtime.get_run(&fork).await?.map(|r| r.status), Some(RunStatus::Running));
/// let too_far = kuralle::fork_run(runtime.store().as_ref(), "run-1", 9, &ForkOptions::new()).await;
/// assert!(matches!(too_far, Err(kuralle::RunError::ForkPoint { steps: 1, .. })));
/// # Ok::<(), kuralle::RunError>(())
/// # }).unwrap();
/// ```
///
/// # Errors
/// [`RunError::RunNotFound`]; [`RunError::ForkPoint`] when `at` is past the journal's end;
/// [`RunError::Store`] (with [`StoreError::RunExists`](crate::StoreError::RunExists) when the
/// fork's id is taken).
pub async fn fork_run(store: &dyn RunStore, run_id: &str, at: u64, options: &ForkOptions) -> Result<String, RunError> {
    let original = store.get_run(run_id).await?.ok_or_else(|| RunError::RunNotFound(run_id.to_owned()))?;
    let steps = store.steps(run_id).await?;
    let len = steps.len() as u64;
    if at > len {
        return Err(RunError::ForkPoint { run_id: run_id.to_owned(), at, steps: len });
    }
    let at_index = usize::try_from(at).unwrap_or(usize::MAX);
    let epoch = steps
        .get(at_index)
        .or_else(|| at_index.checked_sub(1).and_then(|i| steps.get(i)))
        .map_or(original.epoch, |s| s.epoch);

    let mut state = decode_state(&original)?;
    if let Some(start) = state.turn_start.take() {
        state.messages = state.messages.prefix(start);
    }
    let (messages, input) = turn_start(&state, epoch);
    let forked = RunState {
        messages,
        turn_input: input,
        redact: state.redact,
        instructions: options.instructions.clone().or(state.instructions),
        key_run: Some(state.key_run.unwrap_or_else(|| run_id.to_owned())),
        ..RunState::default()
    };
    let new_id = options.run_id.clone().unwrap_or_else(crate::store::new_run_id);
    let agent = options.agent.clone().unwrap_or(original.agent_id);
    let record = RunRecord {
        epoch,
        state: JsonText::serialize_from(&forked).unwrap_or_default(),
        ..RunRecord::new(new_id.clone(), agent)
    };

    let lease = store.acquire_lease(&new_id, &super::lease::owner_id(None), Duration::from_secs(60)).await?;
    let copied = async {
        store.create_run(record, lease.token).await?;
        let kept: Vec<_> = steps.into_iter().take(at_index).filter(|s| s.status != StepStatus::Running).collect();
        if kept.is_empty() {
            return Ok(());
        }
        let intents = kept
            .iter()
            .map(|s| NewStep {
                key: s.key.clone(),
                kind: s.kind,
                name: s.name.clone(),
                epoch: s.epoch,
                started_at_ms: s.started_at_ms,
            })
            .collect();
        let ordinals = store.append_steps(&new_id, lease.token, intents).await?;
        for (step, ordinal) in kept.into_iter().zip(ordinals) {
            let outcome = match (step.status, step.result, step.error) {
                (StepStatus::Failed, _, Some(error)) => StepOutcome::Failed(error),
                (_, Some(result), _) => StepOutcome::Finished(result),
                (_, None, Some(error)) => StepOutcome::Failed(error),
                (_, None, None) => StepOutcome::Finished(JsonText::null()),
            };
            let at = step.finished_at_ms.unwrap_or(step.started_at_ms);
            store.finish_step(&new_id, lease.token, ordinal, outcome, at).await?;
        }
        Ok::<(), RunError>(())
    }
    .await;
    let _ = store.release_lease(&lease).await;
    copied?;
    Ok(new_id)
}

/// The transcript before turn `epoch` and its input: turn `e` starts at the transcript's
/// `e`-th user message; a turn not in the transcript yet is the run's current one.
fn turn_start(state: &RunState, epoch: u64) -> (crate::transcript::Transcript, Option<String>) {
    let users: Vec<usize> =
        state.messages.iter().enumerate().filter_map(|(i, m)| matches!(m, Message::User { .. }).then_some(i)).collect();
    match usize::try_from(epoch).ok().and_then(|e| users.get(e)) {
        Some(&i) => {
            let input = match state.messages.get(i) {
                Some(Message::User { content }) => Some(content.clone()),
                _ => None,
            };
            (state.messages.prefix(i), input)
        }
        None => (state.messages.clone(), state.turn_input.clone()),
    }
}
