//! The invariants every fault test checks at its end (issue 27): all runs finished (or
//! resumable), journals gap-free with nothing left running in finished runs, no finished step
//! re-ran, every re-execution of a call carried the same idempotency key, no `at_most_once`
//! call ran twice, and no call ran twice at the same time.
//!
//! The input is what the store says ([`Journals`], loaded once the load is over) and what the
//! outside world saw: an effect ledger of [`Execution`]s, which the test's tools write. The
//! in-process tests record through [`Ledger`]; a test whose tools run in a child process turns
//! its own log into executions. [`Invariants::check`] returns a typed [`Report`] that prints
//! its figures and every [`Violation`]; [`Report::assert_holds`] fails the test on any.
//!
//! ```
//! use kuralle::{RunStore, stores::MemoryStore};
//! use kuralle_tests::invariants::{Invariants, Journals, Ledger};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let ledger = Ledger::default();
//! let journals = Journals::load_all(&store).await.unwrap();
//! let report = Invariants::new().check(&journals, &ledger.executions());
//! report.assert_holds();
//! assert_eq!(report.runs, 0);
//! # });
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use kuralle::{RunFilter, RunRecord, RunStatus, RunStore, StepKind, StepRecord, StepStatus, StoreError};

/// A point in a test's history: wall-clock milliseconds (comparable with the journal's
/// `finished_at_ms`) and a sequence number (a total order of the ledger's marks, exact where
/// milliseconds tie).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mark {
    /// Position in the ledger's order; marks of one ledger never share one.
    pub seq: u64,
    /// Milliseconds since the Unix epoch.
    pub at_ms: i64,
}

/// One execution of a tool, as the outside world saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The run.
    pub run_id: String,
    /// The tool.
    pub tool: String,
    /// What names the call apart from its key (the call id, or a label in its arguments): two
    /// executions of one call must carry the same key.
    pub call: String,
    /// The idempotency key it ran under.
    pub key: String,
    /// When it began.
    pub start: Mark,
    /// When it ended, if it did (a killed process leaves executions without an end).
    pub end: Option<Mark>,
}

/// A thread-safe effect ledger for tools running in the test's own process: each execution
/// is stamped at its start and at its end.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    inner: Arc<LedgerInner>,
}

#[derive(Debug, Default)]
struct LedgerInner {
    seq: AtomicU64,
    executions: Mutex<Vec<Execution>>,
}

/// An execution in progress; [`Ledger::end`] closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started(usize);

/// An execution in progress that ends when dropped, so that a call the runtime cancels (its
/// future dropped) is closed too.
#[derive(Debug)]
pub struct Running {
    ledger: Ledger,
    started: Started,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.ledger.end(self.started);
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis()).expect("in range")
}

impl Ledger {
    fn mark(&self) -> Mark {
        Mark { seq: self.inner.seq.fetch_add(1, Ordering::SeqCst), at_ms: now_ms() }
    }

    /// Records that `tool` began executing `call` of `run_id` under `key`.
    pub fn start(&self, run_id: &str, tool: &str, call: &str, key: &str) -> Started {
        let mut executions = self.inner.executions.lock().expect("ledger lock");
        // Marked under the lock, so that the sequence and the vector agree.
        let start = self.mark();
        executions.push(Execution {
            run_id: run_id.to_owned(),
            tool: tool.to_owned(),
            call: call.to_owned(),
            key: key.to_owned(),
            start,
            end: None,
        });
        Started(executions.len() - 1)
    }

    /// [`Ledger::start`], ended when the returned guard drops: hold it across the tool's work.
    pub fn enter(&self, run_id: &str, tool: &str, call: &str, key: &str) -> Running {
        Running { ledger: self.clone(), started: self.start(run_id, tool, call, key) }
    }

    /// Records that the execution `started` ended (returned, failed or was dropped).
    pub fn end(&self, started: Started) {
        let mut executions = self.inner.executions.lock().expect("ledger lock");
        let end = self.mark();
        executions[started.0].end = Some(end);
    }

    /// A tool `name` whose every execution is recorded here (entered when it starts, ended when
    /// it returns or is dropped); it takes `takes`, long enough for a fault to land while
    /// calls run, and answers with its arguments.
    pub fn tool(&self, name: &'static str, takes: std::time::Duration) -> crate::FnTool {
        let ledger = self.clone();
        crate::FnTool::new(name, move |args, ctx| {
            let running = ledger.enter(ctx.run_id(), name, ctx.call_id(), ctx.idempotency_key());
            async move {
                tokio::time::sleep(takes).await;
                drop(running);
                Ok(serde_json::json!({ "done": args }))
            }
        })
    }

    /// Every execution so far, in start order.
    pub fn executions(&self) -> Vec<Execution> {
        self.inner.executions.lock().expect("ledger lock").clone()
    }

    /// How many executions began so far.
    pub fn len(&self) -> usize {
        self.inner.executions.lock().expect("ledger lock").len()
    }

    /// Whether nothing executed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The store's side: the runs the test expected and, for each that exists, its record and
/// journal.
#[derive(Debug, Clone, Default)]
pub struct Journals {
    /// Run id to its record and steps (`None`: the run was expected and is not in the store).
    pub runs: BTreeMap<String, Option<(RunRecord, Vec<StepRecord>)>>,
}

impl Journals {
    /// Loads the runs `run_ids` (each must exist; a missing one is a [`Violation::Lost`]).
    pub async fn load(
        store: &dyn RunStore,
        run_ids: impl IntoIterator<Item = impl Into<String>>,
    ) -> Result<Self, StoreError> {
        let mut runs = BTreeMap::new();
        for run_id in run_ids {
            let run_id = run_id.into();
            let entry = match store.get_run(&run_id).await? {
                Some(record) => Some((record, store.steps(&run_id).await?)),
                None => None,
            };
            runs.insert(run_id, entry);
        }
        Ok(Self { runs })
    }

    /// Loads every run in the store.
    pub async fn load_all(store: &dyn RunStore) -> Result<Self, StoreError> {
        let ids: Vec<String> = store.list_runs(RunFilter::default()).await?.into_iter().map(|r| r.run_id).collect();
        Self::load(store, ids).await
    }
}

/// What ends a run may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ends {
    /// Every run finished.
    Finished,
    /// Every run finished or can be resumed (running, paused or interrupted), as after a fault
    /// that the test has not healed yet.
    FinishedOrResumable,
}

/// The checks to make; [`Invariants::new`] makes them all, with no `at_most_once` tools and
/// every run required to finish.
#[derive(Debug, Clone)]
pub struct Invariants {
    ends: Ends,
    at_most_once: BTreeSet<String>,
    recorded: Option<BTreeSet<String>>,
}

impl Default for Invariants {
    fn default() -> Self {
        Self::new()
    }
}

impl Invariants {
    /// Every run must finish; no tool is `at_most_once`; every tool that appears in the ledger
    /// records all of its executions.
    pub fn new() -> Self {
        Self { ends: Ends::Finished, at_most_once: BTreeSet::new(), recorded: None }
    }

    /// What ends runs may reach.
    #[must_use]
    pub fn ends(mut self, ends: Ends) -> Self {
        self.ends = ends;
        self
    }

    /// `tool` is `at_most_once`: no call of it may execute twice.
    #[must_use]
    pub fn at_most_once(mut self, tool: &str) -> Self {
        self.at_most_once.insert(tool.to_owned());
        self
    }

    /// The tools that write every execution to the ledger: a finished step of one of them that
    /// the ledger never saw is [`Violation::NeverRan`]. Without this, the tools seen in the
    /// ledger.
    #[must_use]
    pub fn recorded(mut self, tools: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.recorded = Some(tools.into_iter().map(Into::into).collect());
        self
    }

    /// Checks `journals` against `executions`.
    pub fn check(&self, journals: &Journals, executions: &[Execution]) -> Report {
        let mut report = Report { executions: executions.len(), ..Report::default() };
        let mut by_key: HashMap<(&str, &str), Vec<&Execution>> = HashMap::new();
        let mut keys_of_call: HashMap<(&str, &str), BTreeSet<&str>> = HashMap::new();
        for e in executions {
            by_key.entry((&e.run_id, &e.key)).or_default().push(e);
            keys_of_call.entry((&e.run_id, &e.call)).or_default().insert(&e.key);
        }
        let recorded: BTreeSet<String> =
            self.recorded.clone().unwrap_or_else(|| executions.iter().map(|e| e.tool.clone()).collect());

        for ((run_id, call), keys) in &keys_of_call {
            if keys.len() > 1 {
                report.violations.push(Violation::KeyChanged {
                    run_id: (*run_id).to_owned(),
                    call: (*call).to_owned(),
                    keys: keys.iter().map(|k| (*k).to_owned()).collect(),
                });
            }
        }
        for ((run_id, key), runs) in &by_key {
            report.reexecutions += runs.len() - 1;
            if runs.len() > 1 && self.at_most_once.contains(&runs[0].tool) {
                report.violations.push(Violation::AtMostOnceTwice {
                    run_id: (*run_id).to_owned(),
                    key: (*key).to_owned(),
                    times: runs.len(),
                });
            }
            for (i, a) in runs.iter().enumerate() {
                for b in &runs[i + 1..] {
                    if overlap(a, b) {
                        report.violations.push(Violation::Concurrent {
                            run_id: (*run_id).to_owned(),
                            key: (*key).to_owned(),
                            first: Box::new((*a).clone()),
                            second: Box::new((*b).clone()),
                        });
                    }
                }
            }
        }

        for (run_id, entry) in &journals.runs {
            report.runs += 1;
            let Some((record, steps)) = entry else {
                report.violations.push(Violation::Lost { run_id: run_id.clone() });
                continue;
            };
            *report.statuses.entry(record.status.as_str().to_owned()).or_default() += 1;
            let resumable = matches!(record.status, RunStatus::Running | RunStatus::Paused | RunStatus::Interrupted);
            let ok_end = record.status == RunStatus::Finished || (self.ends == Ends::FinishedOrResumable && resumable);
            if !ok_end {
                report.violations.push(Violation::Unfinished { run_id: run_id.clone(), status: record.status });
            }
            for (expected, step) in steps.iter().enumerate() {
                if step.ordinal != expected as u64 {
                    report.violations.push(Violation::Gap {
                        run_id: run_id.clone(),
                        expected: expected as u64,
                        found: step.ordinal,
                    });
                    break;
                }
            }
            report.steps += steps.len();
            for step in steps {
                if step.status == StepStatus::Running && !resumable {
                    report.violations.push(Violation::LeftRunning {
                        run_id: run_id.clone(),
                        ordinal: step.ordinal,
                        status: record.status,
                    });
                }
                if step.kind != StepKind::Tool {
                    continue;
                }
                if step.status == StepStatus::Failed {
                    report.failed_calls += 1;
                }
                let runs = by_key.get(&(run_id.as_str(), step.key.as_str())).map_or(&[][..], Vec::as_slice);
                if step.status == StepStatus::Finished && runs.is_empty() && recorded.contains(&step.name) {
                    report.violations.push(Violation::NeverRan { run_id: run_id.clone(), key: step.key.clone() });
                }
                if let Some(finished_at) = step.finished_at_ms.filter(|_| step.status != StepStatus::Running) {
                    for e in runs.iter().filter(|e| e.start.at_ms > finished_at) {
                        report.violations.push(Violation::RanAfterFinish {
                            run_id: run_id.clone(),
                            key: step.key.clone(),
                            finished_at_ms: finished_at,
                            started_at_ms: e.start.at_ms,
                        });
                    }
                }
            }
        }
        report
    }
}

/// Whether two executions of one key ran at the same time. Without an end, an execution is
/// taken to have ended when its process did, which the ledger cannot tell: only executions
/// with both ends are compared.
fn overlap(a: &Execution, b: &Execution) -> bool {
    match (a.end, b.end) {
        (Some(a_end), Some(b_end)) => a.start.seq < b_end.seq && b.start.seq < a_end.seq,
        _ => false,
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An expected run is not in the store.
    Lost {
        /// The run.
        run_id: String,
    },
    /// A run ended where it may not (failed, cancelled, or not finished when it had to).
    Unfinished {
        /// The run.
        run_id: String,
        /// Where it is.
        status: RunStatus,
    },
    /// A journal skips an ordinal.
    Gap {
        /// The run.
        run_id: String,
        /// The ordinal due.
        expected: u64,
        /// The ordinal found there.
        found: u64,
    },
    /// A step is still running in a run that is not.
    LeftRunning {
        /// The run.
        run_id: String,
        /// The step.
        ordinal: u64,
        /// The run's status.
        status: RunStatus,
    },
    /// A finished tool step whose execution the ledger never saw.
    NeverRan {
        /// The run.
        run_id: String,
        /// The step's key.
        key: String,
    },
    /// A call executed again after its step had finished.
    RanAfterFinish {
        /// The run.
        run_id: String,
        /// The step's key.
        key: String,
        /// When the step finished.
        finished_at_ms: i64,
        /// When the late execution began.
        started_at_ms: i64,
    },
    /// One call executed under different keys.
    KeyChanged {
        /// The run.
        run_id: String,
        /// The call.
        call: String,
        /// The keys it ran under.
        keys: Vec<String>,
    },
    /// An `at_most_once` call executed more than once.
    AtMostOnceTwice {
        /// The run.
        run_id: String,
        /// The call's key.
        key: String,
        /// How many times it ran.
        times: usize,
    },
    /// Two executions of one call overlapped in time.
    Concurrent {
        /// The run.
        run_id: String,
        /// The call's key.
        key: String,
        /// The execution that began first (boxed: violations stay small).
        first: Box<Execution>,
        /// The one that began while it ran.
        second: Box<Execution>,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Lost { run_id } => write!(f, "{run_id}: lost (not in the store)"),
            Self::Unfinished { run_id, status } => write!(f, "{run_id}: ended {}", status.as_str()),
            Self::Gap { run_id, expected, found } => {
                write!(f, "{run_id}: journal gap, ordinal {found} where {expected} was due")
            }
            Self::LeftRunning { run_id, ordinal, status } => {
                write!(f, "{run_id}: step {ordinal} left running in a {} run", status.as_str())
            }
            Self::NeverRan { run_id, key } => write!(f, "{run_id}: step {key} finished but never ran"),
            Self::RanAfterFinish { run_id, key, finished_at_ms, started_at_ms } => {
                write!(f, "{run_id}: {key} ran again {} ms after its step finished", started_at_ms - finished_at_ms)
            }
            Self::KeyChanged { run_id, call, keys } => write!(f, "{run_id}: call {call} ran under keys {keys:?}"),
            Self::AtMostOnceTwice { run_id, key, times } => {
                write!(f, "{run_id}: at-most-once call {key} ran {times} times")
            }
            Self::Concurrent { run_id, key, first, second } => write!(
                f,
                "{run_id}: {key} ran twice at once (seq {}..{:?} and {}..{:?})",
                first.start.seq,
                first.end.map(|m| m.seq),
                second.start.seq,
                second.end.map(|m| m.seq)
            ),
        }
    }
}

/// What [`Invariants::check`] found: figures and violations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Runs checked.
    pub runs: usize,
    /// Runs per status (as stored).
    pub statuses: BTreeMap<String, usize>,
    /// Journal steps checked.
    pub steps: usize,
    /// Executions in the ledger.
    pub executions: usize,
    /// Executions beyond the first of their key (interrupted calls run again).
    pub reexecutions: usize,
    /// Tool steps that closed with an error (e.g. an `at_most_once` call left indeterminate).
    pub failed_calls: usize,
    /// Every broken invariant.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Whether every invariant holds.
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }

    /// Panics, listing the violations, unless every invariant holds.
    #[track_caller]
    pub fn assert_holds(&self) {
        assert!(self.holds(), "invariants broken:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} runs {:?}, {} steps, {} executions ({} re-executions), {} failed calls, {} violations",
            self.runs,
            self.statuses,
            self.steps,
            self.executions,
            self.reexecutions,
            self.failed_calls,
            self.violations.len()
        )?;
        for v in self.violations.iter().take(50) {
            write!(f, "\n  {v}")?;
        }
        if self.violations.len() > 50 {
            write!(f, "\n  … and {} more", self.violations.len() - 50)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(ordinal: u64, key: &str, name: &str, status: StepStatus, finished_at_ms: Option<i64>) -> StepRecord {
        StepRecord {
            ordinal,
            key: key.into(),
            kind: StepKind::Tool,
            name: name.into(),
            epoch: 0,
            status,
            result: None,
            error: None,
            started_at_ms: 0,
            finished_at_ms,
        }
    }

    fn run(status: RunStatus, steps: Vec<StepRecord>) -> Option<(RunRecord, Vec<StepRecord>)> {
        let mut record = RunRecord::new("r", "agent");
        record.status = status;
        Some((record, steps))
    }

    fn journals(entry: Option<(RunRecord, Vec<StepRecord>)>) -> Journals {
        Journals { runs: BTreeMap::from([("r".to_owned(), entry)]) }
    }

    fn exec(tool: &str, call: &str, key: &str, start: (u64, i64), end: Option<(u64, i64)>) -> Execution {
        let mark = |(seq, at_ms)| Mark { seq, at_ms };
        Execution {
            run_id: "r".into(),
            tool: tool.into(),
            call: call.into(),
            key: key.into(),
            start: mark(start),
            end: end.map(mark),
        }
    }

    fn kinds(report: &Report) -> Vec<&'static str> {
        report
            .violations
            .iter()
            .map(|v| match v {
                Violation::Lost { .. } => "lost",
                Violation::Unfinished { .. } => "unfinished",
                Violation::Gap { .. } => "gap",
                Violation::LeftRunning { .. } => "left running",
                Violation::NeverRan { .. } => "never ran",
                Violation::RanAfterFinish { .. } => "ran after finish",
                Violation::KeyChanged { .. } => "key changed",
                Violation::AtMostOnceTwice { .. } => "at most once twice",
                Violation::Concurrent { .. } => "concurrent",
            })
            .collect()
    }

    #[test]
    fn a_clean_history_holds_and_counts_reexecutions() {
        let j = journals(run(RunStatus::Finished, vec![step(0, "k", "pay", StepStatus::Finished, Some(100))]));
        // Interrupted once, run again after the first ended, under the same key.
        let e = [exec("pay", "c1", "k", (0, 10), Some((1, 20))), exec("pay", "c1", "k", (2, 50), Some((3, 90)))];
        let report = Invariants::new().check(&j, &e);
        report.assert_holds();
        assert_eq!((report.runs, report.steps, report.executions, report.reexecutions), (1, 1, 2, 1));
    }

    #[test]
    fn each_broken_invariant_is_reported() {
        let lost = Invariants::new().check(&journals(None), &[]);
        assert_eq!(kinds(&lost), ["lost"]);

        let failed = Invariants::new().check(&journals(run(RunStatus::Failed, vec![])), &[]);
        assert_eq!(kinds(&failed), ["unfinished"]);
        let paused = journals(run(RunStatus::Paused, vec![step(0, "k", "pay", StepStatus::Running, None)]));
        assert_eq!(kinds(&Invariants::new().check(&paused, &[])), ["unfinished"]);
        Invariants::new().ends(Ends::FinishedOrResumable).check(&paused, &[]).assert_holds();

        let gap = journals(run(RunStatus::Finished, vec![step(1, "k", "pay", StepStatus::Finished, Some(5))]));
        assert_eq!(kinds(&Invariants::new().recorded(Vec::<String>::new()).check(&gap, &[])), ["gap"]);

        let running = journals(run(RunStatus::Finished, vec![step(0, "k", "pay", StepStatus::Running, None)]));
        assert_eq!(kinds(&Invariants::new().check(&running, &[])), ["left running"]);

        let finished = journals(run(RunStatus::Finished, vec![step(0, "k", "pay", StepStatus::Finished, Some(100))]));
        let never = Invariants::new().recorded(["pay"]).check(&finished, &[]);
        assert_eq!(kinds(&never), ["never ran"]);
        let after = [exec("pay", "c1", "k", (0, 10), Some((1, 20))), exec("pay", "c1", "k", (2, 101), Some((3, 120)))];
        assert_eq!(kinds(&Invariants::new().check(&finished, &after)), ["ran after finish"]);

        let two_keys = journals(run(
            RunStatus::Finished,
            vec![
                step(0, "k", "pay", StepStatus::Finished, Some(100)),
                step(1, "k2", "pay", StepStatus::Finished, Some(100)),
            ],
        ));
        let changed = [exec("pay", "c1", "k", (0, 10), Some((1, 20))), exec("pay", "c1", "k2", (2, 30), Some((3, 40)))];
        assert_eq!(kinds(&Invariants::new().check(&two_keys, &changed)), ["key changed"]);

        let again = [exec("ship", "c1", "k", (0, 10), Some((1, 20))), exec("ship", "c1", "k", (2, 30), Some((3, 40)))];
        assert_eq!(kinds(&Invariants::new().at_most_once("ship").check(&finished, &again)), ["at most once twice"]);
        Invariants::new().check(&finished, &again).assert_holds();

        // Overlap is decided by the sequence, even where milliseconds tie; an execution
        // without an end is never taken to overlap.
        let at_once = [exec("pay", "c1", "k", (0, 10), Some((2, 10))), exec("pay", "c1", "k", (1, 10), Some((3, 10)))];
        assert_eq!(kinds(&Invariants::new().check(&finished, &at_once)), ["concurrent"]);
        let unended = [exec("pay", "c1", "k", (0, 10), None), exec("pay", "c1", "k", (1, 10), Some((3, 10)))];
        Invariants::new().check(&finished, &unended).assert_holds();
    }

    #[test]
    fn the_ledger_stamps_starts_and_ends_in_one_order() {
        let ledger = Ledger::default();
        let first = ledger.enter("r", "pay", "c1", "k");
        let second = ledger.start("r", "pay", "c1", "k");
        drop(first);
        ledger.end(second);
        let e = ledger.executions();
        assert_eq!((e[0].start.seq, e[1].start.seq, e[0].end.unwrap().seq, e[1].end.unwrap().seq), (0, 1, 2, 3));
        let j = journals(run(RunStatus::Finished, vec![step(0, "k", "pay", StepStatus::Finished, Some(now_ms()))]));
        assert_eq!(kinds(&Invariants::new().check(&j, &e)), ["concurrent"]);
    }
}
