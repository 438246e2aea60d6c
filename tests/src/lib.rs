//! Shared helpers for the integration tests: the store conformance suite, a closure-backed
//! `Tool` for runtime tests that need per-test behaviour, a concurrency probe that counts
//! overlapping calls, and a store wrapper that simulates outages.

pub mod conformance;
pub mod fault_proxy;
pub mod in_flight;
pub mod invariants;
pub mod pg_frames;
pub mod postgres;
pub mod private_pg;
pub mod provided;
pub mod serving;
pub mod wire_server;
pub mod workers;

use std::{
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, StreamExt, future::BoxFuture, stream};
use kuralle::{PreparedCall, Tool, ToolContext, ToolError, ToolEvent, ToolStream};
use serde_json::{Value, json};

type Run = Arc<dyn Fn(Value, ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> + Send + Sync>;
type Predicate = Arc<dyn Fn(&Value) -> bool + Send + Sync>;
type KeyFn = Arc<dyn Fn(&Value) -> String + Send + Sync>;

/// A tool built from a closure, with every `Tool` knob settable. Arguments are not validated
/// beyond being an object, so runtime tests can focus on dispatch.
#[derive(Clone)]
pub struct FnTool {
    name: String,
    schema: Value,
    parallel: Predicate,
    timeout: Option<Duration>,
    interruptible: bool,
    at_most_once: bool,
    needs_approval: bool,
    replay: bool,
    key: Option<KeyFn>,
    run: Run,
}

impl FnTool {
    /// A serial tool named `name` running `f`.
    pub fn new<F, Fut>(name: &str, f: F) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Self {
            name: name.to_owned(),
            schema: json!({"type": "object"}),
            parallel: Arc::new(|_| false),
            timeout: None,
            interruptible: true,
            at_most_once: false,
            needs_approval: false,
            replay: true,
            key: None,
            run: Arc::new(move |args, ctx| f(args, ctx).boxed()),
        }
    }

    /// Always parallel-safe.
    #[must_use]
    pub fn parallel(mut self) -> Self {
        self.parallel = Arc::new(|_| true);
        self
    }

    /// Parallel-safe when `p(raw_args)`.
    #[must_use]
    pub fn parallel_when(mut self, p: impl Fn(&Value) -> bool + Send + Sync + 'static) -> Self {
        self.parallel = Arc::new(p);
        self
    }

    /// A timeout.
    #[must_use]
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Not interruptible.
    #[must_use]
    pub fn uninterruptible(mut self) -> Self {
        self.interruptible = false;
        self
    }

    /// At most once.
    #[must_use]
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Overrides the journal key with `f(args)`.
    #[must_use]
    pub fn key(mut self, f: impl Fn(&Value) -> String + Send + Sync + 'static) -> Self {
        self.key = Some(Arc::new(f));
        self
    }

    /// Needs a human decision before each call.
    #[must_use]
    pub fn needs_approval(mut self) -> Self {
        self.needs_approval = true;
        self
    }

    /// Never replayed.
    #[must_use]
    pub fn no_replay(mut self) -> Self {
        self.replay = false;
        self
    }
}

struct Prepared {
    args: Value,
    key: Option<String>,
    run: Run,
}

impl PreparedCall for Prepared {
    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }

    fn execute(self: Box<Self>, ctx: ToolContext) -> ToolStream {
        let fut = (self.run)(self.args, ctx);
        stream::once(async move { ToolEvent::Outcome(fut.await) }).boxed()
    }
}

impl Tool for FnTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "a test tool"
    }
    fn input_schema(&self) -> &Value {
        &self.schema
    }
    fn parallel_safe(&self, raw_args: &Value) -> bool {
        (self.parallel)(raw_args)
    }
    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
    fn interruptible(&self) -> bool {
        self.interruptible
    }
    fn at_most_once(&self) -> bool {
        self.at_most_once
    }
    fn replay(&self) -> bool {
        self.replay
    }
    fn needs_approval(&self) -> bool {
        self.needs_approval
    }
    fn prepare(&self, args: &Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(Box::new(Prepared {
            args: args.clone(),
            key: self.key.as_ref().map(|k| k(args)),
            run: Arc::clone(&self.run),
        }))
    }
}

/// Counts calls in flight and remembers the peak.
#[derive(Debug, Default, Clone)]
pub struct Probe {
    active: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Probe {
    /// Marks a call as started; the guard marks it finished when dropped.
    pub fn enter(&self, label: &str) -> ProbeGuard {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.total.fetch_add(1, Ordering::SeqCst);
        self.log.lock().unwrap().push(format!("start {label}"));
        ProbeGuard { probe: self.clone(), label: label.to_owned() }
    }

    /// Calls in flight now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// The most calls that were ever in flight at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Calls started.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// `start x` / `end x` entries in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Position of `entry` in the log.
    pub fn at(&self, entry: &str) -> usize {
        self.log().iter().position(|e| e == entry).unwrap_or_else(|| panic!("no `{entry}` in {:?}", self.log()))
    }
}

/// See [`Probe::enter`].
#[derive(Debug)]
pub struct ProbeGuard {
    probe: Probe,
    label: String,
}

impl Drop for ProbeGuard {
    fn drop(&mut self) {
        self.probe.log.lock().unwrap().push(format!("end {}", self.label));
        self.probe.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A store wrapper whose writes can be made to fail, to simulate an outage (disk full, lost
/// connection) at chosen moments.
#[derive(Clone)]
pub struct FlakyStore {
    inner: Arc<dyn kuralle::RunStore>,
    fail_finish: Arc<AtomicBool>,
    fail_append: Arc<AtomicBool>,
    finishes: Arc<AtomicUsize>,
    fail_from: Arc<AtomicUsize>,
    after_list: Arc<std::sync::Mutex<Option<ListHook>>>,
    fail_renew: Arc<AtomicBool>,
    fail_release: Arc<AtomicBool>,
    hang_renew: Arc<std::sync::Mutex<Option<String>>>,
    fail_claims: Arc<AtomicBool>,
    fail_put: Arc<AtomicBool>,
    lose_appends: Arc<AtomicUsize>,
    lose_closes: Arc<AtomicUsize>,
    before_create: Arc<std::sync::Mutex<Option<CreateHook>>>,
    finish_delay: Arc<std::sync::Mutex<Duration>>,
    park_finishes: Arc<AtomicBool>,
    held_closes: Arc<HeldCloses>,
}

/// Closing writes held back: see [`FlakyStore::hold_closes`].
struct HeldCloses {
    on: AtomicBool,
    waiting: AtomicUsize,
    gate: tokio::sync::Semaphore,
}

impl Default for HeldCloses {
    fn default() -> Self {
        Self { on: AtomicBool::new(false), waiting: AtomicUsize::new(0), gate: tokio::sync::Semaphore::new(0) }
    }
}

/// What [`FlakyStore::after_next_list`] runs: it gets the wrapped store.
type ListHook = Box<dyn FnOnce(Arc<dyn kuralle::RunStore>) -> BoxFuture<'static, ()> + Send>;

/// What [`FlakyStore::before_next_create`] runs: it gets the wrapped store and the new run's id.
type CreateHook = Box<dyn FnOnce(Arc<dyn kuralle::RunStore>, String) -> BoxFuture<'static, ()> + Send>;

impl FlakyStore {
    /// Wraps `inner`; nothing fails until told to.
    pub fn new(inner: Arc<dyn kuralle::RunStore>) -> Self {
        Self {
            inner,
            fail_finish: Arc::default(),
            fail_append: Arc::default(),
            finishes: Arc::default(),
            fail_from: Arc::new(AtomicUsize::new(usize::MAX)),
            after_list: Arc::default(),
            fail_renew: Arc::default(),
            fail_release: Arc::default(),
            hang_renew: Arc::default(),
            fail_claims: Arc::default(),
            fail_put: Arc::default(),
            lose_appends: Arc::default(),
            lose_closes: Arc::default(),
            before_create: Arc::default(),
            finish_delay: Arc::default(),
            park_finishes: Arc::default(),
            held_closes: Arc::default(),
        }
    }

    /// Holds every closing write with the turn's last response (`put_run_and_release_after`)
    /// back until [`release_closes`](Self::release_closes): runs closing at once, waiting on
    /// their store, as on a busy writer.
    pub fn hold_closes(&self) {
        self.held_closes.on.store(true, Ordering::SeqCst);
    }

    /// How many closing writes wait behind [`hold_closes`](Self::hold_closes).
    pub fn closes_waiting(&self) -> usize {
        self.held_closes.waiting.load(Ordering::SeqCst)
    }

    /// Lets every held closing write, and every later one, go on.
    pub fn release_closes(&self) {
        self.held_closes.on.store(false, Ordering::SeqCst);
        self.held_closes.gate.close();
    }

    /// Says (or stops saying) that a `finish_step` goes on without being polled again, as
    /// SQLite's does, so the runtime parks outcomes here instead of driving them. This
    /// wrapper's own delays and outages then go on only when the next write reads the outcome.
    pub fn park_finishes(&self, on: bool) {
        self.park_finishes.store(on, Ordering::SeqCst);
    }

    /// Makes every `finish_step` answer `delay` late (on Tokio's clock), a failure included: a
    /// slow disk or a far server under an outcome's write.
    pub fn delay_finish(&self, delay: Duration) {
        *self.finish_delay.lock().unwrap() = delay;
    }

    /// Makes `renew_lease` fail (or succeed again): the store is unreachable from this
    /// process, perhaps not from others.
    pub fn fail_renew(&self, on: bool) {
        self.fail_renew.store(on, Ordering::SeqCst);
    }

    /// Makes `list_runs` fail (or succeed again), and so `claim_runnable` (this wrapper keeps
    /// the trait's, which lists the runnable runs first): a worker's claims meet an outage.
    pub fn fail_claims(&self, on: bool) {
        self.fail_claims.store(on, Ordering::SeqCst);
    }

    /// Makes `release_lease` fail (or succeed again).
    pub fn fail_release(&self, on: bool) {
        self.fail_release.store(on, Ordering::SeqCst);
    }

    /// Makes every `renew_lease` of `run_id` hang for good (a stuck connection).
    pub fn hang_renew(&self, run_id: &str) {
        *self.hang_renew.lock().unwrap() = Some(run_id.to_owned());
    }

    /// Makes `finish_step` fail (or succeed again).
    pub fn fail_finish(&self, on: bool) {
        self.fail_from.store(usize::MAX, Ordering::SeqCst);
        self.fail_finish.store(on, Ordering::SeqCst);
    }

    /// Makes the `n`th `finish_step` call from now (0-based) and all later ones fail, until
    /// [`fail_finish`](Self::fail_finish)`(false)`.
    pub fn fail_finish_from(&self, n: usize) {
        self.finishes.store(0, Ordering::SeqCst);
        self.fail_from.store(n, Ordering::SeqCst);
    }

    /// Runs `hook` on the wrapped store after the next `list_runs` has read its list and before
    /// it returns it: the caller then acts on a stale list (another process changed the runs
    /// in between).
    pub fn after_next_list(
        &self,
        hook: impl FnOnce(Arc<dyn kuralle::RunStore>) -> BoxFuture<'static, ()> + Send + 'static,
    ) {
        *self.after_list.lock().unwrap() = Some(Box::new(hook));
    }

    /// Runs `hook` on the wrapped store, with the run's id, before the next
    /// `acquire_lease_and_create_run` goes on to it: another process made a run of that id in
    /// between. The hook is taken when that call is made (not when its future is first
    /// polled), and its time counts against the caller's lease, whose clock starts with the
    /// call.
    pub fn before_next_create(
        &self,
        hook: impl FnOnce(Arc<dyn kuralle::RunStore>, String) -> BoxFuture<'static, ()> + Send + 'static,
    ) {
        *self.before_create.lock().unwrap() = Some(Box::new(hook));
    }

    /// Makes `put_run` fail (or succeed again): a turn's journal is written but the run's row
    /// cannot say the turn ended, as when the process dies between the two.
    pub fn fail_put(&self, on: bool) {
        self.fail_put.store(on, Ordering::SeqCst);
    }

    /// Makes the next `n` appends commit and then fail as an outage: the connection broke after
    /// the commit, so the caller cannot know its write landed.
    pub fn lose_append_answers(&self, n: usize) {
        self.lose_appends.store(n, Ordering::SeqCst);
    }

    /// Makes the next `n` closing writes (`put_run_and_release_after`) land whole in the wrapped
    /// store and then fail as an outage: the connection broke after the commit.
    pub fn lose_close_answers(&self, n: usize) {
        self.lose_closes.store(n, Ordering::SeqCst);
    }

    /// Makes `append_steps` fail (or succeed again).
    pub fn fail_append(&self, on: bool) {
        self.fail_append.store(on, Ordering::SeqCst);
    }
}

fn outage<'a, T: Send + 'a>() -> kuralle::StoreFuture<'a, T> {
    Box::pin(async { Err(kuralle::StoreError::Unavailable("simulated outage: disk full".into())) })
}

impl kuralle::RunStore for FlakyStore {
    fn create_run(&self, run: kuralle::RunRecord, fence: u64) -> kuralle::StoreFuture<'_, ()> {
        self.inner.create_run(run, fence)
    }
    fn get_run<'a>(&'a self, run_id: &'a str) -> kuralle::StoreFuture<'a, Option<kuralle::RunRecord>> {
        self.inner.get_run(run_id)
    }
    fn put_run_and_release_after(
        &self,
        last: kuralle::FinishedStep,
        run: kuralle::RunRecord,
        fence: u64,
    ) -> kuralle::StoreFuture<'_, (u64, bool)> {
        let lose = self.lose_closes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        Box::pin(async move {
            let held = &self.held_closes;
            if held.on.load(Ordering::SeqCst) {
                held.waiting.fetch_add(1, Ordering::SeqCst);
                // Closed, never granted: the gate opens for everyone at once.
                let _ = held.gate.acquire().await;
                held.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            if lose {
                self.inner.put_run_and_release_after(last, run, fence).await?;
                return Err(kuralle::StoreError::Unavailable(
                    "simulated outage: the answer to a committed close was lost".into(),
                ));
            }
            // The trait's provided two writes, through this store's own faults.
            self.append_finished_with_intents(&run.run_id, fence, last.into()).await?;
            self.put_run_and_release(run, fence).await
        })
    }
    fn put_run(&self, run: kuralle::RunRecord, fence: u64) -> kuralle::StoreFuture<'_, u64> {
        if self.fail_put.load(Ordering::SeqCst) {
            return outage();
        }
        self.inner.put_run(run, fence)
    }
    fn list_runs(&self, filter: kuralle::RunFilter) -> kuralle::StoreFuture<'_, Vec<kuralle::RunSummary>> {
        if self.fail_claims.load(Ordering::SeqCst) {
            return outage();
        }
        Box::pin(async move {
            let runs = self.inner.list_runs(filter).await?;
            let hook = self.after_list.lock().unwrap().take();
            if let Some(hook) = hook {
                hook(Arc::clone(&self.inner)).await;
            }
            Ok(runs)
        })
    }
    fn cancel_run<'a>(&'a self, run_id: &'a str) -> kuralle::StoreFuture<'a, Option<kuralle::RunStatus>> {
        self.inner.cancel_run(run_id)
    }
    fn delete_run<'a>(&'a self, run_id: &'a str) -> kuralle::StoreFuture<'a, bool> {
        self.inner.delete_run(run_id)
    }
    fn append_steps<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        steps: Vec<kuralle::NewStep>,
    ) -> kuralle::StoreFuture<'a, Vec<u64>> {
        if self.fail_append.load(Ordering::SeqCst) {
            return outage();
        }
        let lose = self.lose_appends.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if lose {
            return Box::pin(async move {
                self.inner.append_steps(run_id, fence, steps).await?;
                Err(kuralle::StoreError::Unavailable(
                    "simulated outage: the answer to a committed append was lost".into(),
                ))
            });
        }
        self.inner.append_steps(run_id, fence, steps)
    }
    fn finish_step<'a>(
        &'a self,
        run_id: &'a str,
        fence: u64,
        ordinal: u64,
        outcome: kuralle::StepOutcome,
        finished_at_ms: i64,
    ) -> kuralle::StoreFuture<'a, ()> {
        let n = self.finishes.fetch_add(1, Ordering::SeqCst);
        let fail = self.fail_finish.load(Ordering::SeqCst) || n >= self.fail_from.load(Ordering::SeqCst);
        let delay = *self.finish_delay.lock().unwrap();
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if fail {
                return outage().await;
            }
            self.inner.finish_step(run_id, fence, ordinal, outcome, finished_at_ms).await
        })
    }
    /// As told by [`park_finishes`](FlakyStore::park_finishes).
    fn finishes_without_polling(&self) -> bool {
        self.park_finishes.load(Ordering::SeqCst)
    }
    fn steps<'a>(&'a self, run_id: &'a str) -> kuralle::StoreFuture<'a, Vec<kuralle::StepRecord>> {
        self.inner.steps(run_id)
    }
    fn acquire_lease<'a>(
        &'a self,
        run_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> kuralle::StoreFuture<'a, kuralle::Lease> {
        self.inner.acquire_lease(run_id, owner, ttl)
    }
    /// The wrapped store's own (SQLite's one job), after the hook: faults set on `acquire_lease`
    /// or `create_run` do not reach a run that starts with it (an id the runtime made, or a
    /// caller's id with a turn's input).
    fn acquire_lease_and_create_run<'a>(
        &'a self,
        new: kuralle::RunRecord,
        owner: &'a str,
        ttl: Duration,
    ) -> kuralle::StoreFuture<'a, (kuralle::Lease, Option<kuralle::RunRecord>)> {
        let hook = self.before_create.lock().unwrap().take();
        Box::pin(async move {
            if let Some(hook) = hook {
                hook(Arc::clone(&self.inner), new.run_id.clone()).await;
            }
            self.inner.acquire_lease_and_create_run(new, owner, ttl).await
        })
    }
    fn renew_lease<'a>(&'a self, lease: &'a kuralle::Lease, ttl: Duration) -> kuralle::StoreFuture<'a, kuralle::Lease> {
        if self.hang_renew.lock().unwrap().as_deref() == Some(lease.run_id.as_str()) {
            return Box::pin(std::future::pending());
        }
        if self.fail_renew.load(Ordering::SeqCst) {
            return outage();
        }
        self.inner.renew_lease(lease, ttl)
    }
    fn release_lease<'a>(&'a self, lease: &'a kuralle::Lease) -> kuralle::StoreFuture<'a, ()> {
        if self.fail_release.load(Ordering::SeqCst) {
            return outage();
        }
        self.inner.release_lease(lease)
    }
    fn current_lease<'a>(&'a self, run_id: &'a str) -> kuralle::StoreFuture<'a, Option<kuralle::Lease>> {
        self.inner.current_lease(run_id)
    }
}

/// A serial tool named `name` that answers `{"ok": <its arguments>}`.
pub fn echo_tool(name: &str) -> FnTool {
    FnTool::new(name, |args, _| async move { Ok(json!({"ok": args})) })
}

/// The run the span tests watch (`tracing_spans`, `telemetry`): agent `ops` on a
/// `ScriptedModel` calls `lookup` and `drop_db` (which the policy denies), then `wire` (which
/// waits for approval), then answers "Done.".
pub fn ops_runtime() -> kuralle::Runtime {
    use kuralle::testing::{ScriptedModel, Turn};
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("c1", "lookup", r#"{"q":"a"}"#), ("c2", "drop_db", "{}")]),
        Turn::tool_calls([("c3", "wire", r#"{"amount":900}"#)]),
        Turn::text("Done."),
    ]);
    let agent = kuralle::AgentDef::new("ops", "x")
        .tool(echo_tool("lookup"))
        .tool(echo_tool("drop_db"))
        .tool(echo_tool("wire"))
        .policy(kuralle::Policy::new().ask("wire").deny("drop_*", "never"));
    kuralle::Runtime::builder().agent(agent).model(model).build().expect("the span tests' runtime")
}

/// `(call_id, result, is_error)` of every `ToolResult` event, in order.
pub fn tool_results(events: &[kuralle::Event]) -> Vec<(String, Value, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            kuralle::Event::ToolResult { call_id, result, is_error, .. } => {
                Some((call_id.to_string(), result.clone(), *is_error))
            }
            _ => None,
        })
        .collect()
}

/// Streams a child process's stdout lines into a channel (its stdout must be piped), so a test
/// can wait for a line with a timeout.
pub fn lines_of(proc: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = proc.stdout.take().expect("the child's stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}
