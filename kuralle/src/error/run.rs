//! `RunError`: what can end a run (or keep it from starting).

/// Why a run could not go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The model request failed; the run stays resumable.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The typed final output could not be had: still invalid after the repair budget, cut
    /// off at the token limit, or refused. The run is marked failed.
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    /// The store failed; when [`StoreError::is_retryable`](crate::StoreError::is_retryable),
    /// the run stays resumable.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// No run with that id.
    #[error("run `{0}` not found")]
    RunNotFound(String),
    /// No agent with that id.
    #[error("no agent `{id}`; registered agents: {available}")]
    UnknownAgent {
        /// The requested id.
        id: String,
        /// Comma-separated registered ids.
        available: String,
    },
    /// [`Runtime::cancel`](crate::Runtime::cancel) or [`Runtime::retry`](crate::Runtime::retry)
    /// was asked of a run whose status does not allow it (cancel: only `running` or
    /// `paused`; retry: only `failed`). Nothing changed.
    #[error("run `{run_id}` is {status}: {action} applies only to {allowed} runs")]
    WrongStatus {
        /// Run id.
        run_id: String,
        /// The run's status.
        status: crate::store::RunStatus,
        /// What was asked (`"cancel"`, `"retry"`).
        action: &'static str,
        /// The statuses it applies to.
        allowed: &'static str,
    },
    /// [`Runtime::fork`](crate::Runtime::fork) at an ordinal past the end of the run's journal.
    #[error("run `{run_id}` has {steps} journal steps: cannot fork it at step {at}")]
    ForkPoint {
        /// Run id.
        run_id: String,
        /// The ordinal asked for.
        at: u64,
        /// How many steps the journal holds (the largest valid `at`).
        steps: u64,
    },
    /// The run's unfinished turn has other input than the request.
    #[error("run `{0}` has an unfinished turn with other input; resume it first")]
    TurnInProgress(String),
    /// The run's journal reached `max_journal_entries`.
    #[error("run `{run_id}` reached the journal limit of {limit} steps")]
    StepLimit {
        /// Run id.
        run_id: String,
        /// The configured limit.
        limit: u64,
    },
    /// A model response exceeded `max_value_bytes`.
    #[error("a model response of {size} bytes exceeds the limit of {limit} bytes")]
    ResponseTooLarge {
        /// Its size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The run was stopped before a model request or tool batch that would have passed one of
    /// its [`RunLimits`](crate::RunLimits) (nothing of that request or batch ran). The run
    /// ends with status [`LimitExceeded`](crate::RunStatus::LimitExceeded); what it spent
    /// stays in its journal, so no resume, crash or handover gives it a fresh budget.
    #[error("run `{run_id}` reached its {limit} limit: used {used} of {max} {unit}", unit = limit.unit())]
    LimitExceeded {
        /// Run id.
        run_id: String,
        /// The cap the next request or batch would have passed.
        limit: crate::limits::Limit,
        /// What the run had used of it, in the limit's [`unit`](crate::Limit::unit).
        used: crate::limits::Amount,
        /// The cap.
        max: crate::limits::Amount,
    },
    /// The runtime is misconfigured.
    #[error("runtime configuration: {0}")]
    Config(String),
    /// An agent has two tools with one name: the model could not tell them apart, and the
    /// later one would silently replace the earlier.
    ///
    /// ```
    /// use kuralle::{AgentDef, RunError, Runtime, testing::ScriptedModel, tool};
    ///
    /// /// Look an order up.
    /// #[tool(name = "lookup")]
    /// async fn lookup_order(id: u64) -> u64 { id }
    /// /// Look a customer up.
    /// #[tool(name = "lookup")]
    /// async fn lookup_customer(id: u64) -> u64 { id }
    ///
    /// let agent = AgentDef::new("support", "Help.").tool(LookupOrder).tool(LookupCustomer);
    /// let err = Runtime::builder().agent(agent).model(ScriptedModel::new([])).build().unwrap_err();
    /// assert!(matches!(&err, RunError::DuplicateTool { tool, .. } if tool == "lookup"));
    /// assert!(err.to_string().contains("LookupOrder") && err.to_string().contains("LookupCustomer"));
    /// ```
    #[error("agent `{agent}` has two tools named `{tool}`: `{first}` and `{second}`")]
    DuplicateTool {
        /// The agent id.
        agent: String,
        /// The shared tool name.
        tool: String,
        /// The type of the tool added first.
        first: String,
        /// The type of the tool added later (which replaced the first).
        second: String,
    },
    /// A decision was delivered for a run that is not waiting for it.
    #[error("run `{run_id}` is not waiting for a decision on `{request_id}`")]
    NotPending {
        /// Run id.
        run_id: String,
        /// The request id in the decision.
        request_id: String,
    },
    /// The run task panicked or was lost; the run stays resumable.
    #[error("internal error: {0}")]
    Internal(String),
    /// Another caller owns the run right now (it holds the run's lease); nothing was executed.
    /// Try again later, or opt into waiting with
    /// [`RunRequest::wait_for_lease`](crate::RunRequest::wait_for_lease).
    #[error("run `{run_id}` is busy: owned by `{owner}` (lease expires at {expires_at_ms} ms since the Unix epoch)")]
    Busy {
        /// Run id.
        run_id: String,
        /// The current owner.
        owner: String,
        /// When its lease expires unless renewed, by the store's clock.
        expires_at_ms: i64,
    },
    /// This turn lost the run's lease: another owner took over (this one stalled past the
    /// lease's TTL), or no renewal could prove it still held the lease before its local
    /// deadline (the store was unreachable from here). It stopped dispatching, cancelled its
    /// interruptible calls and journaled nothing more. The next owner carries on.
    #[error("run `{run_id}`: this turn lost the run's lease (token {token}) to another owner and stopped")]
    LeaseLost {
        /// Run id.
        run_id: String,
        /// The token the turn held.
        token: u64,
    },
    /// A worker stopping at shutdown ended this turn when its grace ran out and gave the run
    /// back: interruptible calls were cancelled, calls that cannot be interrupted ran to their
    /// end under the lease, and every outcome was journaled. The run stays `running`; another
    /// worker resumes it from the journal.
    #[error("run `{run_id}`: handed back at shutdown; another worker resumes it")]
    HandedBack {
        /// Run id.
        run_id: String,
    },
    /// This runtime's instance id ([`RuntimeBuilder::instance_id`](crate::RuntimeBuilder::instance_id))
    /// is held by another live process (or another runtime of this process on the same
    /// store): two holders of one id could take each other's runs. Nothing was executed.
    #[error(
        "instance id `{instance_id}` is in use: another live process holds it ({holder}); stop that process, or \
         give this one a different `RuntimeBuilder::instance_id`"
    )]
    InstanceInUse {
        /// The instance id.
        instance_id: String,
        /// What holds it, as far as the store can tell.
        holder: String,
    },
    /// The pending call(s) a decision names were already decided (a concurrent or earlier
    /// delivery won); the first decision stands.
    #[error("run `{run_id}`: `{request_id}` was already decided")]
    AlreadyDecided {
        /// Run id.
        run_id: String,
        /// The request id in the decision (`*` for all pending calls).
        request_id: String,
    },
}

impl RunError {
    /// Whether resuming the run later may succeed (transient model or store failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Model(e) => !matches!(e, crate::model::ModelError::Auth { .. }),
            Self::Store(e) => e.is_retryable(),
            Self::Internal(_) | Self::Busy { .. } => true,
            _ => false,
        }
    }
}
