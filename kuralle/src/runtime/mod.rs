//! The runtime: agents, a default model and a store; `run()` drives the model ↔ tool loop.

mod close;
mod decide;
mod entry;
mod fork;
mod handle;
mod instance;
pub(crate) mod lease;
pub(crate) mod limits;
mod open;
mod output;
mod recover;
mod renewals;
pub(crate) mod response;
mod retry;
mod state;
mod step;
mod turn;
mod worker;

use std::{fmt, sync::Arc, time::Duration};

pub use decide::record_decision;
pub use fork::{ForkOptions, fork_run};
pub use handle::{InterruptHandle, RunHandle};
pub use lease::DEFAULT_LEASE_TTL;
pub use recover::{DEFAULT_RECOVER_CONCURRENCY, Recovered, RecoveredRun};
pub use retry::record_retry;
pub(crate) use state::{key_run, recorded_conversation, recorded_inputs};
use tokio_util::sync::CancellationToken;
pub use worker::{ServeReport, WorkerOptions};

use crate::{
    agent::{Agent, AgentDef},
    error::RunError,
    limits::{Pricing, RunLimits},
    model::Model,
    store::{RunRecord, RunStore, StepRecord},
    stores::MemoryStore,
};

/// Default [`RuntimeBuilder::event_buffer`]: events a run buffers for a consumer that lags.
pub const DEFAULT_EVENT_BUFFER: usize = 1024;
pub use crate::journal::DEFAULT_MAX_JOURNAL_ENTRIES;

/// The old name of [`DEFAULT_MAX_JOURNAL_ENTRIES`] ("steps" now means model steps only).
#[deprecated(since = "0.1.0", note = "renamed `DEFAULT_MAX_JOURNAL_ENTRIES`")]
pub const DEFAULT_MAX_STEPS_PER_RUN: u64 = DEFAULT_MAX_JOURNAL_ENTRIES;

/// The old name of [`stores::DEFAULT_MAX_VALUE_BYTES`](crate::stores::DEFAULT_MAX_VALUE_BYTES),
/// the one 16 MiB value limit (see [`RuntimeBuilder::max_value_bytes`]).
#[deprecated(since = "0.1.0", note = "use `stores::DEFAULT_MAX_VALUE_BYTES`, the one name of the 16 MiB value limit")]
pub const DEFAULT_MAX_RESULT_BYTES: usize = crate::stores::DEFAULT_MAX_VALUE_BYTES;

/// What to run: input text plus optional agent, run id and inbound idempotency key.
///
/// ```
/// use kuralle::RunRequest;
/// let req = RunRequest::new("Echo \"hello\"").agent("support").run_id("run-1").idempotency_key("msg-42");
/// let from_str: RunRequest = "hi".into();
/// # let _ = (req, from_str);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunRequest {
    pub(crate) input: Option<String>,
    pub(crate) agent: Option<String>,
    pub(crate) run_id: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) wait_for_lease: Option<Duration>,
    pub(crate) limits: Option<RunLimits>,
    /// A worker's turn: an interrupt hands the run back (it stays runnable) instead of ending
    /// the turn `interrupted`.
    pub(crate) hand_back: bool,
    /// `Runtime::retry`: reopen the failed turn (same epoch, so its journal replays).
    pub(crate) retry: bool,
}

impl RunRequest {
    /// A new user turn with `input`.
    pub fn new(input: impl Into<String>) -> Self {
        Self { input: Some(input.into()), ..Self::default() }
    }

    /// The agent to run (default: the first registered agent). An existing run keeps its agent.
    #[must_use]
    pub fn agent(mut self, id: impl Into<String>) -> Self {
        self.agent = Some(id.into());
        self
    }

    /// The old name of [`run_id`](Self::run_id), kept as an alias: a conversation is one run,
    /// and every turn of it names the run. Like `run_id`, the last call wins.
    #[deprecated(since = "0.1.0", note = "a conversation is one run: use `run_id`")]
    #[must_use]
    pub fn session(self, id: impl Into<String>) -> Self {
        self.run_id(id)
    }

    /// Continue (or create) the run with this id. If its last turn is unfinished (the process
    /// died), the turn resumes and replays from the journal; otherwise `input` starts a new
    /// turn in a new epoch.
    #[must_use]
    pub fn run_id(mut self, id: impl Into<String>) -> Self {
        self.run_id = Some(id.into());
        self
    }

    /// Inbound dedupe: a request whose key the run has already processed starts no new turn;
    /// it resumes the turn if unfinished, or returns its output.
    #[must_use]
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// When another caller owns the run, wait up to `max` for it to let go (polling with
    /// backoff) instead of failing at once with [`RunError::Busy`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let req = kuralle::RunRequest::new("hi").run_id("run-1").wait_for_lease(Duration::from_secs(5));
    /// # let _ = req;
    /// ```
    #[must_use]
    pub fn wait_for_lease(mut self, max: Duration) -> Self {
        self.wait_for_lease = Some(max);
        self
    }
}

impl RunRequest {
    /// Caps what the run may spend, on top of its agent's limits: the run gets the
    /// [`tighter`](RunLimits::tighter) of the two, cap by cap. Kept with the run, so a resumed
    /// run, or a worker's, holds to the same caps; a later turn with limits of its own replaces
    /// them.
    ///
    /// ```
    /// use kuralle::{RunLimits, RunRequest};
    /// let req = RunRequest::new("Plan my trip").limits(RunLimits::new().max_requests(4));
    /// # let _ = req;
    /// ```
    #[must_use]
    pub fn limits(mut self, limits: RunLimits) -> Self {
        self.limits = Some(limits);
        self
    }
}

impl From<&str> for RunRequest {
    fn from(input: &str) -> Self {
        Self::new(input)
    }
}

impl From<String> for RunRequest {
    fn from(input: String) -> Self {
        Self::new(input)
    }
}

/// Which run [`Runtime::resume`] continues, and whether to wait for its lease. `&str`,
/// `String` and `&String` (a run id) convert into it.
///
/// ```
/// use std::time::Duration;
/// use kuralle::ResumeRequest;
///
/// let now = ResumeRequest::new("run-1");
/// let patient = ResumeRequest::new("run-1").wait_for_lease(Duration::from_secs(5));
/// let from_str: ResumeRequest = "run-1".into();
/// assert_eq!(now, from_str);
/// assert_ne!(now, patient);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeRequest {
    run_id: String,
    wait_for_lease: Option<Duration>,
}

impl ResumeRequest {
    /// Resume run `run_id`.
    pub fn new(run_id: impl Into<String>) -> Self {
        Self { run_id: run_id.into(), wait_for_lease: None }
    }

    /// When another caller owns the run, wait up to `max` for it to let go (polling with
    /// backoff) instead of failing at once with [`RunError::Busy`], as
    /// [`RunRequest::wait_for_lease`] does.
    #[must_use]
    pub fn wait_for_lease(mut self, max: Duration) -> Self {
        self.wait_for_lease = Some(max);
        self
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl From<&str> for ResumeRequest {
    fn from(run_id: &str) -> Self {
        Self::new(run_id)
    }
}

impl From<String> for ResumeRequest {
    fn from(run_id: String) -> Self {
        Self::new(run_id)
    }
}

impl From<&String> for ResumeRequest {
    fn from(run_id: &String) -> Self {
        Self::new(run_id.as_str())
    }
}

impl From<ResumeRequest> for RunRequest {
    fn from(resume: ResumeRequest) -> Self {
        Self { run_id: Some(resume.run_id), wait_for_lease: resume.wait_for_lease, ..Self::default() }
    }
}

/// A human decision on calls that need approval.
///
/// ```
/// use kuralle::Decision;
/// let yes = Decision::approve("alice");
/// let no = Decision::deny("bob", "amount too high").for_request("approval-0dfce4140293b9306a9876f4");
/// # let _ = (yes, no);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub(crate) approved: bool,
    pub(crate) by: String,
    pub(crate) reason: Option<String>,
    pub(crate) request_id: Option<String>,
    pub(crate) channel: Option<String>,
    pub(crate) origin: Option<String>,
}

impl Decision {
    /// Approve, decided by `by`.
    pub fn approve(by: impl Into<String>) -> Self {
        Self { approved: true, by: by.into(), reason: None, request_id: None, channel: None, origin: None }
    }

    /// Deny, decided by `by`, for `reason` (the model is told).
    pub fn deny(by: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            approved: false,
            by: by.into(),
            reason: Some(reason.into()),
            request_id: None,
            channel: None,
            origin: None,
        }
    }

    /// Applies the decision only to the pending call with this request id
    /// ([`PendingApproval::request_id`](crate::PendingApproval::request_id)).
    #[must_use]
    pub fn for_request(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }

    /// Records where the decision came from, for the audit trail: the `channel` (`cli`,
    /// `console`, or `api`, the default) and an `origin` within it (a remote address, a
    /// reverse proxy's user, a local user). The model is never told either, nor who decided.
    ///
    /// ```
    /// use kuralle::Decision;
    /// let d = Decision::approve("alice").via("console", "203.0.113.7");
    /// # let _ = d;
    /// ```
    #[must_use]
    pub fn via(mut self, channel: impl Into<String>, origin: impl Into<String>) -> Self {
        self.channel = Some(channel.into());
        self.origin = Some(origin.into()).filter(|o: &String| !o.is_empty());
        self
    }
}

pub(crate) struct Inner {
    pub(crate) agents: Vec<AgentDef>,
    /// Per agent (same order as `agents`): what each of its turns shares.
    pub(crate) per_agent: Vec<PerAgent>,
    pub(crate) model: Option<Arc<dyn Model>>,
    pub(crate) store: Arc<dyn RunStore>,
    pub(crate) max_journal_entries: u64,
    pub(crate) max_value_bytes: usize,
    pub(crate) lease_ttl: Duration,
    /// Renews the leases this runtime's turns hold.
    pub(crate) renewals: Arc<renewals::Renewals>,
    /// Wakes this process's idle workers when `submit` recorded a run.
    pub(crate) wake: tokio::sync::Notify,
    pub(crate) event_buffer: usize,
    /// The instance id and its proof of life, when set.
    pub(crate) instance: Option<Arc<instance::Instance>>,
    /// Whether message and tool content goes on the spans ([`RuntimeBuilder::capture_content`]).
    pub(crate) capture_content: bool,
    /// Prices by model name ([`RuntimeBuilder::pricing`]).
    pub(crate) pricing: std::collections::HashMap<String, Pricing>,
}

/// What every turn of one agent shares, built once when the runtime is: the specs of the tools
/// its model is offered (each holds its JSON schema: a turn built and dropped about 1 KiB of
/// them per tool), the tools themselves (its output tool among them) and its policy. A turn's
/// own copies of the last two were 96 bytes of its context (two `Arc`s are 16), and the tools
/// a vector, with every tool's count incremented and decremented on the two cores.
pub(crate) struct PerAgent {
    specs: Arc<[crate::tool::ToolSpec]>,
    tools: Arc<crate::ToolSet>,
    policy: Arc<crate::Policy>,
}

impl PerAgent {
    fn of(agent: &AgentDef) -> Self {
        let tools = output::tools(agent);
        Self { specs: tools.specs().into(), tools: Arc::new(tools), policy: Arc::new(agent.policy.clone()) }
    }
}

// One getter each, not one value of all three: a turn that took them apart kept a drop flag
// for each part in every run's task.
impl Inner {
    fn per_agent(&self, agent: &AgentDef) -> Option<&PerAgent> {
        self.agents.iter().position(|a| std::ptr::eq(a, agent)).map(|i| &self.per_agent[i])
    }

    /// The tool specs offered to `agent`'s model (built now when it is not one of `agents`).
    pub(crate) fn specs_of(&self, agent: &AgentDef) -> Arc<[crate::tool::ToolSpec]> {
        self.per_agent(agent).map_or_else(|| output::tools(agent).specs().into(), |p| Arc::clone(&p.specs))
    }

    /// `agent`'s tools, its output tool among them.
    pub(crate) fn tools_of(&self, agent: &AgentDef) -> Arc<crate::ToolSet> {
        self.per_agent(agent).map_or_else(|| Arc::new(output::tools(agent)), |p| Arc::clone(&p.tools))
    }

    /// `agent`'s approval policy.
    pub(crate) fn policy_of(&self, agent: &AgentDef) -> Arc<crate::Policy> {
        self.per_agent(agent).map_or_else(|| Arc::new(agent.policy.clone()), |p| Arc::clone(&p.policy))
    }

    /// A fresh lease owner id: `"<instance id>/<uuid>"`, or `"<process uuid>/<uuid>"`.
    pub(crate) fn owner_id(&self) -> String {
        lease::owner_id(self.instance.as_ref().map(|i| i.id()))
    }

    /// Makes sure this process holds its instance id (claiming it, and taking back a dead
    /// predecessor's runs, the first time); the empty claim without an instance id.
    pub(crate) async fn claim_instance(&self) -> Result<instance::Claim, RunError> {
        match &self.instance {
            Some(instance) => instance.claim().await,
            None => Ok(instance::Claim::none()),
        }
    }

    /// Whether `claim` still stands.
    pub(crate) fn holds(&self, claim: instance::Claim) -> bool {
        self.instance.as_ref().is_none_or(|instance| instance.holds(claim))
    }
}

/// Runs agents. Cheap to clone; clones share agents, model and store.
///
/// ```
/// use futures::StreamExt;
/// use kuralle::{AgentDef, Event, Runtime, testing::{ScriptedModel, Turn}};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("support", "Be brief."))
///     .model(ScriptedModel::new([Turn::text("Hello there.")]))
///     .build()
///     .unwrap();
/// let mut handle = runtime.run("Hi");
/// let mut text = String::new();
/// while let Some(event) = handle.next().await {
///     if let Event::TextDelta { delta } = &event {
///         text.push_str(delta);
///     }
/// }
/// let output = handle.await.unwrap();
/// assert_eq!(output.text, "Hello there.");
/// assert_eq!(text, output.text);
/// # });
/// ```
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("agents", &self.inner.agents.iter().map(|a| a.id.as_str()).collect::<Vec<_>>())
            .field("model", &self.inner.model.as_ref().map(|m| m.name().to_owned()))
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Starts configuring a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// Runs a turn. Must be called within a Tokio runtime: the run is a spawned task, so it
    /// completes (and journals) even if the handle is dropped.
    ///
    /// The turn first takes the run's lease (one owner per run): if another caller owns the
    /// run, the handle ends at once with [`RunError::Busy`] and nothing executes (see
    /// [`RunRequest::wait_for_lease`]). A turn that loses its lease ends with
    /// [`RunError::LeaseLost`].
    pub fn run(&self, request: impl Into<RunRequest>) -> RunHandle {
        let request = request.into();
        let interrupt = CancellationToken::new();
        let (tx, rx) = crate::event::EventSender::channel(self.inner.event_buffer);
        let inner = Arc::clone(&self.inner);
        let token = interrupt.clone();
        let task = tokio::spawn(entry::run(inner, request, tx, token, None));
        RunHandle::new(rx, task, interrupt)
    }

    /// Continues a run whose turn is unfinished (its process died, or a store or model failure
    /// stopped it): finished steps replay from the journal, the rest runs. A finished run
    /// returns its last output.
    ///
    /// Takes a run id (`&str`, `String`) or a [`ResumeRequest`]: if another caller owns the
    /// run, the handle ends at once with [`RunError::Busy`], unless the request waits
    /// ([`ResumeRequest::wait_for_lease`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kuralle::{AgentDef, ResumeRequest, RunRequest, RunStatus, Runtime, testing::{ScriptedModel, Turn}};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([Turn::text("Hello.")]))
    ///     .build()
    ///     .unwrap();
    /// runtime.run(RunRequest::new("Hi").run_id("run-1")).await.unwrap();
    /// // A finished run gives its last output back.
    /// let out = runtime.resume("run-1").await.unwrap();
    /// assert_eq!((out.status, out.text.as_str()), (RunStatus::Finished, "Hello."));
    /// let out = runtime.resume(ResumeRequest::new("run-1").wait_for_lease(Duration::from_secs(5))).await.unwrap();
    /// assert_eq!(out.text, "Hello.");
    /// # });
    /// ```
    pub fn resume(&self, request: impl Into<ResumeRequest>) -> RunHandle {
        self.run(RunRequest::from(request.into()))
    }

    /// This runtime's instance id ([`RuntimeBuilder::instance_id`]), if set.
    ///
    /// ```
    /// use kuralle::{AgentDef, Runtime, testing::ScriptedModel};
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([]))
    ///     .instance_id("app-1")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(runtime.instance_id(), Some("app-1"));
    /// ```
    pub fn instance_id(&self) -> Option<&str> {
        self.inner.instance.as_ref().map(|i| i.id())
    }

    /// Delivers a human decision to a paused run and resumes it: approved calls run, denied
    /// ones give the model a `{"__denied": true, ...}` result and never execute. Without
    /// [`Decision::for_request`] the decision applies to every pending call.
    ///
    /// The decision is recorded and the turn resumed under one lease (as
    /// [`record_decision`](crate::record_decision) records it). Of concurrent deliveries
    /// exactly one executes; the others end with [`RunError::Busy`] or
    /// [`RunError::AlreadyDecided`].
    pub fn deliver(&self, run_id: impl Into<String>, decision: Decision) -> RunHandle {
        let request = RunRequest { run_id: Some(run_id.into()), ..RunRequest::default() };
        let interrupt = CancellationToken::new();
        let (tx, rx) = crate::event::EventSender::channel(self.inner.event_buffer);
        let inner = Arc::clone(&self.inner);
        let token = interrupt.clone();
        let task = tokio::spawn(entry::run(inner, request, tx, token, Some(decision)));
        RunHandle::new(rx, task, interrupt)
    }

    /// Cancels a `running` or `paused` run; returns the status it had.
    ///
    /// The store marks it [`Cancelled`](crate::RunStatus::Cancelled) and releases its lease in
    /// one transaction ([`RunStore::cancel_run`]). A run nobody owns (paused, or its owner
    /// died) is thereby closed. An owner in this runtime stops at once; an owner in another
    /// process stops at its next journal write or lease renewal (at most a third of the lease
    /// TTL later), which the store now rejects as fenced: either way its interruptible calls
    /// are cancelled, nothing more is journaled, and its turn ends `Ok` with status
    /// `Cancelled`. Workers never resume a cancelled run.
    ///
    /// ```
    /// use kuralle::{AgentDef, RunStatus, Runtime, Tool, testing::{ScriptedModel, Turn}};
    /// # use kuralle::{Decision, RunRequest};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([Turn::text("Hello.")]))
    ///     .build()?;
    /// runtime.run(RunRequest::new("Hi").run_id("run-1")).await?;
    /// // A finished run cannot be cancelled.
    /// assert!(matches!(runtime.cancel("run-1").await, Err(kuralle::RunError::WrongStatus { .. })));
    /// assert!(matches!(runtime.cancel("nope").await, Err(kuralle::RunError::RunNotFound(_))));
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`RunError::RunNotFound`]; [`RunError::WrongStatus`] for a run that already ended;
    /// [`RunError::Store`] when the store fails.
    pub async fn cancel(&self, run_id: &str) -> Result<crate::RunStatus, RunError> {
        use crate::RunStatus;
        match self.inner.store.cancel_run(run_id).await? {
            None => Err(RunError::RunNotFound(run_id.to_owned())),
            Some(before @ (RunStatus::Running | RunStatus::Paused)) => {
                self.inner.renewals.lose_run(run_id);
                Ok(before)
            }
            Some(status) => Err(RunError::WrongStatus {
                run_id: run_id.to_owned(),
                status,
                action: "cancel",
                allowed: "running or paused",
            }),
        }
    }

    /// Continues a [`Failed`](crate::RunStatus::Failed) run from its journal: the failed turn
    /// opens again in its own epoch, so every step it finished replays (its tools are not
    /// executed again, its model responses are not asked for again) and the rest runs. Use it
    /// after fixing what failed it (a larger
    /// [`max_journal_entries`](RuntimeBuilder::max_journal_entries), a configuration error).
    ///
    /// ```
    /// use kuralle::{AgentDef, RunError, RunRequest, Runtime, testing::{ScriptedModel, Turn}};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([Turn::text("Hello.")]))
    ///     .build()?;
    /// runtime.run(RunRequest::new("Hi").run_id("run-1")).await?;
    /// // Only a failed run is retried.
    /// assert!(matches!(runtime.retry("run-1").await, Err(RunError::WrongStatus { .. })));
    /// # Ok::<(), RunError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// The handle ends with [`RunError::WrongStatus`] for a run that did not fail, and with
    /// [`RunError::Busy`] if another caller owns it.
    pub fn retry(&self, run_id: impl Into<String>) -> RunHandle {
        self.run(RunRequest { run_id: Some(run_id.into()), retry: true, ..RunRequest::default() })
    }

    /// Forks run `run_id` at journal ordinal `at`: a new run (its id is returned) whose journal
    /// is a copy of the original's steps before `at`, in status `running` with no owner. Run
    /// it with [`resume`](Self::resume), or let a worker claim it: the copied steps replay (no
    /// tool runs again, no model is asked again) and the turn goes on from step `at`, with the
    /// agent and instructions of `options` if given. See [`fork_run`] for the details.
    ///
    /// ```
    /// use kuralle::{AgentDef, ForkOptions, RunRequest, Runtime, testing::{ScriptedModel, Turn}};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::by_transcript([Turn::text("Hello.")]))
    ///     .build()?;
    /// runtime.run(RunRequest::new("Hi").run_id("run-1")).await?;
    /// // Step 0 was the model's answer: fork before it, with other instructions.
    /// let fork = runtime.fork("run-1", 0, ForkOptions::new().run_id("run-1b").instructions("Be verbose.")).await?;
    /// let out = runtime.resume(&fork).await?;
    /// assert_eq!(out.text, "Hello.");
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`fork_run`], and [`RunError::UnknownAgent`] for an agent this runtime lacks.
    pub async fn fork(&self, run_id: &str, at: u64, options: ForkOptions) -> Result<String, RunError> {
        if let Some(agent) = options.agent_id() {
            open::agent(&self.inner, Some(agent))?;
        }
        let id = fork_run(self.inner.store.as_ref(), run_id, at, &options).await?;
        self.inner.wake.notify_one();
        let _ = self.inner.store.notify_runnable().await;
        Ok(id)
    }

    /// The run's record, if it exists.
    ///
    /// # Errors
    /// [`RunError::Store`] when the store fails.
    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, RunError> {
        Ok(self.inner.store.get_run(run_id).await?)
    }

    /// The run's journal, in ordinal order.
    ///
    /// # Errors
    /// [`RunError::Store`] when the store fails.
    pub async fn journal(&self, run_id: &str) -> Result<Vec<StepRecord>, RunError> {
        Ok(self.inner.store.steps(run_id).await?)
    }

    /// The store, for listing and deleting runs.
    pub fn store(&self) -> &Arc<dyn RunStore> {
        &self.inner.store
    }
}

/// Configures a [`Runtime`].
#[derive(Default)]
pub struct RuntimeBuilder {
    agents: Vec<AgentDef>,
    model: Option<Arc<dyn Model>>,
    store: Option<Arc<dyn RunStore>>,
    max_journal_entries: Option<u64>,
    max_value_bytes: Option<usize>,
    lease_ttl: Option<Duration>,
    event_buffer: Option<usize>,
    instance_id: Option<String>,
    capture_content: Option<bool>,
    pricing: std::collections::HashMap<String, Pricing>,
}

impl fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuilder").field("agents", &self.agents.len()).finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Registers an agent. The first one is the default.
    #[must_use]
    pub fn agent(mut self, agent: impl Agent) -> Self {
        self.agents.push(agent.definition());
        self
    }

    /// The default model, for agents without their own.
    #[must_use]
    pub fn model(self, model: impl Model) -> Self {
        self.model_arc(Arc::new(model))
    }

    /// The default model, shared.
    #[must_use]
    pub fn model_arc(mut self, model: Arc<dyn Model>) -> Self {
        self.model = Some(model);
        self
    }

    /// Where runs and journals live (default: a fresh [`MemoryStore`]).
    #[must_use]
    pub fn store(self, store: impl RunStore) -> Self {
        self.store_arc(Arc::new(store))
    }

    /// Where runs and journals live, shared.
    #[must_use]
    pub fn store_arc(mut self, store: Arc<dyn RunStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The most entries one run's journal may hold (default 10,000,
    /// [`DEFAULT_MAX_JOURNAL_ENTRIES`]); reaching it ends the run with
    /// [`RunError::StepLimit`].
    #[must_use]
    pub fn max_journal_entries(mut self, n: u64) -> Self {
        self.max_journal_entries = Some(n);
        self
    }

    /// The old name of [`max_journal_entries`](Self::max_journal_entries).
    #[deprecated(since = "0.1.0", note = "renamed `max_journal_entries`")]
    #[must_use]
    pub fn max_steps_per_run(self, n: u64) -> Self {
        self.max_journal_entries(n)
    }

    /// The journal's per-value cap: the largest tool result or model response journaled
    /// (default 16 MiB, [`stores::DEFAULT_MAX_VALUE_BYTES`](crate::stores::DEFAULT_MAX_VALUE_BYTES),
    /// the value limit every store accepts).
    ///
    /// It is not what the model reads: a result is journaled whole (so a replay returns exactly
    /// what the call returned, and `ctx.tool()` gets the full value), and only its copy in the
    /// transcript is truncated middle-out to
    /// [`AgentDef::max_tool_result_tokens`](crate::AgentDef::max_tool_result_tokens). The cap
    /// exists because a journaled value is read back on every resume and stored in one row. A
    /// larger tool result is a [`ToolError::InvalidOutput`](crate::ToolError::InvalidOutput) for
    /// the model; the arguments of a model response that would exceed it are replaced by a
    /// marker that answers those calls with
    /// [`ToolError::InvalidInput`](crate::ToolError::InvalidInput). Keep it at or below the
    /// store's own value limit.
    #[must_use]
    pub fn max_value_bytes(mut self, n: usize) -> Self {
        self.max_value_bytes = Some(n);
        self
    }

    /// The old name of [`max_value_bytes`](Self::max_value_bytes).
    #[deprecated(since = "0.1.0", note = "renamed `max_value_bytes`, the one name of the 16 MiB value limit")]
    #[must_use]
    pub fn max_result_bytes(self, n: usize) -> Self {
        self.max_value_bytes(n)
    }

    /// How long a turn's lease on its run lasts without renewal (default
    /// [`DEFAULT_LEASE_TTL`], 30 s). The turn renews it every third of this; a process that
    /// dies or stalls longer loses the run to the next caller, and its late writes are
    /// rejected. Shorter means faster takeover of a crashed process's runs, and more renewals.
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = kuralle::Runtime::builder().lease_ttl(Duration::from_secs(10));
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// A stable name for this process (for example `"app-1"`, or a host name), so that the
    /// process that replaces it after a crash or a restart gets its runs back **at once**
    /// instead of after their leases expire ([`lease_ttl`](Self::lease_ttl)).
    ///
    /// Leases this runtime takes are owned by `"<instance id>/<uuid>"`, so a lease tells which
    /// instance holds it. Before it takes its first lease, the runtime claims the id in the
    /// store ([`RunStore::lock_instance`]): a proof that no other live process holds it,
    /// which the operating system or the database takes away when the holder dies (an OS file
    /// lock beside a SQLite file, a PostgreSQL session advisory lock), never a guess from a
    /// timeout. Holding it, the runtime ends every lease its dead predecessor held under the
    /// id (a late write from that process is fenced), so those runs can be resumed now, by
    /// [`Runtime::recover`], [`Runtime::resume`] or any process's workers. A second live
    /// process with the same id is refused with [`RunError::InstanceInUse`]. Leases of other
    /// instances, or of runtimes without an instance id, are never taken early.
    ///
    /// Give each concurrently running process its own id, and a restarted process the id of
    /// the one it replaces. The id must not be empty, longer than 128 bytes, or contain `/` or
    /// control characters. Without it, a runtime behaves as before: a crashed process's runs
    /// wait for their leases to expire.
    ///
    /// ```
    /// use kuralle::{AgentDef, Runtime, testing::ScriptedModel};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let runtime = Runtime::builder()
    ///     .agent(AgentDef::new("support", "Be brief."))
    ///     .model(ScriptedModel::new([]))
    ///     .instance_id("app-1")
    ///     .build()?;
    /// let recovered = runtime.recover().await?; // a fresh store: nothing to take back
    /// assert!(recovered.taken_back.is_empty());
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    #[must_use]
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// How many events a run buffers for its [`RunHandle`] (default [`DEFAULT_EVENT_BUFFER`],
    /// at least 1). When a consumer lags and the buffer is full, the run waits for it, except
    /// that [`Event::ToolProgress`](crate::Event::ToolProgress) values are dropped rather than
    /// waited for, and never fill more than half the buffer (progress is advisory and never
    /// journaled). A handle that is dropped or
    /// awaited stops receiving, so it never holds a run up; one that is kept but never read
    /// does, once the buffer is full.
    #[must_use]
    pub fn event_buffer(mut self, n: usize) -> Self {
        self.event_buffer = Some(n.max(1));
        self
    }

    /// Whether the telemetry spans carry content: the messages sent to and received from the
    /// model (`gen_ai.input.messages`, `gen_ai.output.messages`,
    /// `gen_ai.system_instructions`) and tool call arguments and results
    /// (`gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`). Off by default, as the
    /// OpenTelemetry GenAI conventions ask (content may hold personal data); without this
    /// call the environment decides: `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`
    /// turns it on. See `docs/telemetry.md`.
    ///
    /// ```
    /// let builder = kuralle::Runtime::builder().capture_content(true);
    /// # let _ = builder;
    /// ```
    #[must_use]
    pub fn capture_content(mut self, on: bool) -> Self {
        self.capture_content = Some(on);
        self
    }

    /// Prices the model named `model` (its [`Model::name`], e.g. `"gpt-4o-mini"`): each of
    /// its responses journals what it cost, [`RunLimits::max_cost_usd`] caps that, and
    /// `kuralle runs show` adds it up. The last price given for a name wins.
    ///
    /// ```
    /// use kuralle::{AgentDef, Pricing, RunLimits, Runtime, testing::ScriptedModel};
    ///
    /// let agent = AgentDef::new("support", "Be brief.").limits(RunLimits::new().max_cost_usd(0.10));
    /// let unpriced = Runtime::builder().agent(agent.clone()).model(ScriptedModel::new([])).build();
    /// assert!(unpriced.is_err()); // a dollar cap needs the model's price
    /// let runtime = Runtime::builder()
    ///     .agent(agent)
    ///     .model(ScriptedModel::new([]))
    ///     .pricing("scripted", Pricing::new(0.15, 0.60))
    ///     .build()
    ///     .unwrap();
    /// # let _ = runtime;
    /// ```
    #[must_use]
    pub fn pricing(mut self, model: impl Into<String>, pricing: Pricing) -> Self {
        self.pricing.insert(model.into(), pricing);
        self
    }

    /// Checks the configuration and builds the runtime.
    ///
    /// # Errors
    /// [`RunError::Config`]: no agent, two agents with one id, an agent without a model, a
    /// zero lease TTL, an invalid [`instance_id`](Self::instance_id), or a tool that is `at_most_once` with `replay() == false` (a call
    /// that is never answered from the journal cannot be held to at most once: after a crash
    /// it would run again; `#[tool]` rejects that combination at compile time, and this check
    /// covers hand-written [`Tool`](crate::Tool) impls);
    /// [`RunError::DuplicateTool`]: an agent with two tools of one name; also
    /// [`RunError::Config`] for a [`RunLimits::max_cost_usd`] on an agent whose model has no
    /// [`pricing`](Self::pricing), or a negative or NaN price.
    pub fn build(self) -> Result<Runtime, RunError> {
        if self.agents.is_empty() {
            return Err(RunError::Config("register at least one agent with `.agent(..)`".into()));
        }
        if self.lease_ttl.is_some_and(|ttl| ttl.is_zero()) {
            return Err(RunError::Config("`lease_ttl` must be longer than zero".into()));
        }
        for a in &self.agents {
            if let Some(t) = a.tools.iter().find(|t| t.at_most_once() && !t.replay()) {
                return Err(RunError::Config(format!(
                    "tool `{}` of agent `{}` is `at_most_once` with `replay = false`: a call never answered \
                     from the journal would run again after a crash; drop one of the two",
                    t.name(),
                    a.id
                )));
            }
        }
        for (i, a) in self.agents.iter().enumerate() {
            if self.agents[..i].iter().any(|b| b.id == a.id) {
                return Err(RunError::Config(format!("two agents have the id `{}`", a.id)));
            }
            if let Some(dup) = a.tools.first_replaced() {
                return Err(RunError::DuplicateTool {
                    agent: a.id.clone(),
                    tool: dup.name.clone(),
                    first: dup.first.to_owned(),
                    second: dup.second.to_owned(),
                });
            }
            if a.model.is_none() && self.model.is_none() {
                return Err(RunError::Config(format!(
                    "agent `{}` has no model and the runtime has no default: call `.model(..)`",
                    a.id
                )));
            }
        }
        limits::check_config(&self.agents, self.model.as_deref(), &self.pricing)?;
        if let Some(id) = &self.instance_id {
            instance::check_id(id)?;
        }
        let store: Arc<dyn RunStore> = self.store.unwrap_or_else(|| Arc::new(MemoryStore::new()));
        let lease_ttl = self.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL);
        let renewals = renewals::Renewals::new(Arc::clone(&store), lease_ttl);
        let instance =
            self.instance_id.map(|id| instance::Instance::new(id, Arc::clone(&store), Arc::clone(&renewals)));
        let per_agent = self.agents.iter().map(PerAgent::of).collect();
        Ok(Runtime {
            inner: Arc::new(Inner {
                agents: self.agents,
                per_agent,
                model: self.model,
                renewals,
                instance,
                store,
                max_journal_entries: self.max_journal_entries.unwrap_or(DEFAULT_MAX_JOURNAL_ENTRIES),
                max_value_bytes: self.max_value_bytes.unwrap_or(crate::stores::DEFAULT_MAX_VALUE_BYTES),
                lease_ttl,
                wake: tokio::sync::Notify::new(),
                event_buffer: self.event_buffer.unwrap_or(DEFAULT_EVENT_BUFFER),
                capture_content: self.capture_content.unwrap_or_else(crate::trace::capture_content_from_env),
                pricing: self.pricing,
            }),
        })
    }
}
