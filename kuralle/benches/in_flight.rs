//! Many runs in flight on one `Runtime`, as a service with thousands of conversations open:
//! N runs started at once (or spread over one latency, `--steady`), each three one-call turns
//! and an answer, the model answering every request after a fixed latency (100 ms by default).
//! The ideal wall time is 4 × latency, whatever N (plus the last start with `--steady`); what
//! the runtime adds on top is the figure (issue 27).
//!
//! `cargo bench -p kuralle --bench in_flight -- [--store memory|sqlite|postgres]
//! [--runs 100,1000,10000] [--latency-ms 100] [--svg PATH] [--cap-s 180] [--workers 2]
//! [--pin-workers] [--warm] [--steady] [--caller-ids v7|v4] [--page-cache-kib K] [--repeat 1]`
//! prints, per store and N:
//! - wall time, and wall / ideal (4 × latency, plus the last start with `--steady`);
//! - added latency per turn, p50 and p99: a run's time from one model request to its next, less
//!   the model's latency. That is the turn's wall time beyond the model, as a user waits for it:
//!   the runtime's work between two model calls (journaling the response with the call's
//!   intent, running the tool, journaling its outcome, building the next request), waiting for
//!   a worker thread, and the timer's lateness (tokio's timer ticks in milliseconds). Three
//!   samples per run (the answer's turn has no next request);
//! - answer → next request, p50 and p99: from the moment the answer's events are handed over
//!   (the sleep has ended and the stream was polled) to the next request: the runtime's own
//!   part of the above, without the wait for the timer and for the stream to be polled;
//! - first request p50 / last: when runs made their first model request, from the moment they
//!   were all started, or with `--steady` from each one's own `Runtime::run` call (a run's
//!   start: its run row and lease, before any model call);
//! - `run` calls made in: how long the one task that starts the runs took to make its N
//!   `Runtime::run` calls (each spawns the run's task); the other worker thread starts runs
//!   meanwhile. The span includes the bench's own bookkeeping for each run (its input, the
//!   boxed handle it polls); see `docs/performance.md`, "Where a start's time goes". With
//!   `--steady` it spans the one latency the starts are spread over;
//! - CPU per run: the process's CPU time (every thread) while the runs ran, over N; against
//!   2 cores × wall it tells whether the configuration is CPU-bound;
//! - idle timer lateness, p50 and p99: how late 100 sleeps of the model's latency end on the
//!   same runtime before the runs start; the part of the added latency per turn that is
//!   tokio's millisecond timer, there at any load;
//! - journal writes per second: step records written (an intent, a response journaled finished,
//!   a step's outcome) over the wall time, and the store's write calls per run;
//! - peak RSS per in-flight run: (VmHWM at the end − VmHWM before the runs start) / N;
//! - peak live heap per in-flight run: the most bytes allocated and not yet freed while the runs
//!   ran, less those before, over N, counted by the global allocator (sampled every
//!   millisecond): what the runs hold, without the allocator's own growth that RSS includes;
//! - live heap at the start (`start_heap_bytes` on the `--one` line only): the same count at
//!   the first sample after every run had made its first request. With a model latency longer
//!   than the start (`--one memory 10000 1000`) no run has had an answer yet, so it is the heap
//!   that starting N runs grew by and kept, the bench's own input, handle and stream for each
//!   included. With `--steady` the first runs have had answers by then, so it is not;
//! - on SQLite, store write calls per durable commit (`SqliteStore::commit_count`).
//! - by thread, on the `--one` line only (Linux): CPU time a run of SQLite's writer thread
//!   (`writer_us_per_run`), of its checkpointer (`checkpoint_us_per_run`) and of the runtime's
//!   worker threads (`workers_us_per_run`), and how long the writer and the workers waited
//!   runnable for a CPU (`writer_waited_us_per_run`, `workers_waited_us_per_run`). The
//!   writer's CPU over the wall says how near it is to being the queue every run waits in.
//!
//! `--store postgres` runs the same on `PostgresStore` in this process, on `DATABASE_URL` and a
//! schema of its own (`in_flight_<pid>`, dropped after, by the child and again by the parent):
//! what a turn waits for on a server's round trips, where `in_flight_pg` measures throughput
//! with worker processes. It is not in the default set, since it needs the server.
//!
//! `--store handoff` is a diagnostic, not a store: MemoryStore whose every write a run makes
//! also waits for a thread of its own to answer, in batches, as `SqliteStore`'s writer thread
//! answers, but without SQL. Against `memory` it shows what waiting on another thread for each
//! write costs the runtime's side (`docs/performance.md`, "SQLite at 10,000, eleventh pass").
//!
//! Each configuration runs in a child process of this binary (`--one STORE N LATENCY_MS`), so
//! its peak RSS is its own, and is killed after `--cap-s` seconds. The chart (throughput and
//! p50/p99 added latency against runs in flight) is written as SVG to `--svg`
//! (default `target/in_flight.svg`).
//!
//! `--repeat K` runs each configuration K times, a child each, prints every run's row, and then
//! each configuration's spread (min / median / max of wall / ideal, p99 added latency and CPU
//! per run): on a shared machine one run says little, and a goal met "in most runs" needs the
//! count. The chart gets each configuration's median run (by wall).
//!
//! `--workers N` gives the runtime N worker threads (2 by default, one per core of these
//! machines). With SQLite, one leaves the other core to the store's writer thread
//! (`docs/operations.md`, "SQLite on few cores: one worker fewer").
//!
//! `--warm` runs the same N runs once before the measured ones, on the same store, by a runtime
//! of their own: the process's heap has then grown, the store holds N finished runs, and its
//! connections and caches are warm, as in a service that has been up for minutes. The measured
//! round's CPU then leaves out the page faults of a new process's first heap. Its peak RSS per
//! run is not shown: the first round set the high-water mark, and the measured round's figure
//! is only what it added above that. `--cap-s` covers both rounds.
//!
//! `--steady` starts the N runs spread evenly over one model latency instead of at once: run i
//! at i × latency / N (tokio's timer starts those due in the same millisecond together). From
//! then on every run is in flight until the first finishes, three latencies later, and the
//! model's answers arrive at N per latency, spread out, as a service's do, instead of in a wave
//! of N within the same millisecond. Every answer whose handling the added latency counts (a
//! run's first three) comes after the last start, and while the runtime keeps up, before the
//! first run ends: the figure is then that of N runs in flight in a steady state. A
//! configuration the cores cannot keep up with falls behind instead, and its early runs end
//! while late ones still have turns to go. The ideal wall is 4 × latency plus the last run's
//! offset. Rows so run are labelled "(steady)".
//!
//! `--caller-ids v7|v4` has the bench name every run itself, with a time-ordered UUID v7 or a
//! random v4, as a caller with ids of its own would, instead of leaving the id to the runtime
//! (which makes a v7). `v7` is the baseline for `v4` (before 09dc0e3 a run its caller named
//! also took one store write more, its lease and then its row): on SQLite the runs' and
//! leases' indexes are keyed by run id (the journal's by the run's integer key), and random
//! ids scatter each commit's writes over them.
//! `--page-cache-kib K` gives SQLite's write connection K KiB of page cache
//! (`SqliteOptions::page_cache_bytes`) instead of its default.
//!
//! `--pin-workers` pins the runtime's worker threads to a CPU each (`on_thread_start`), as
//! a service on a small VM may: without it the VM's scheduler can run both on one vCPU for
//! milliseconds, which is the tail of the added latency at 1,000 runs on these machines.

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use futures::{StreamExt, stream::BoxStream};
use kuralle::{
    AgentDef, FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, RunRequest, RunStatus, RunStore,
    Runtime, ToolCallRequest, Usage,
    stores::{MemoryStore, PostgresOptions, PostgresStore, SqliteOptions, SqliteStore},
    testing::CountingStore,
    tool,
};

#[path = "shared/pg_schema.rs"]
mod pg_schema;
use pg_schema::drop_schema;

/// Counts the live heap (`heap-count`, a slot per thread updated with a plain store). The
/// counters used before cost the runs' own CPU: `cap` (one `lock xadd` on one cache line for
/// the process) a tenth of it at 10,000 runs on MemoryStore, `accounting-allocator` (three
/// locked instructions per allocation and free) 12%; with `heap-count` the CPU per run is that
/// of a build with no counting (`docs/performance.md`, "The bench's own counting").
#[global_allocator]
static HEAP: heap_count::Counting = heap_count::Counting;

/// Bytes allocated and not yet freed, over every thread (summed from relaxed reads: a sample).
fn allocated() -> usize {
    heap_count::live()
}

/// Add one.
#[tool]
async fn inc(
    /// The number.
    x: u64,
) -> u64 {
    x + 1
}

/// Tool-call turns per run before the answer.
const CALLS: usize = 3;

/// A model that answers after `latency`: [`CALLS`] one-call turns, then a text answer, chosen by
/// the number of assistant messages in the transcript (so runs share it without a script).
/// It notes, per run, when each answer was complete and how long the runtime took from there to
/// the run's next request.
struct Latent {
    latency: Duration,
    shared: Arc<Marks>,
}

struct Marks {
    start: Instant,
    /// Per run: nanoseconds since `start` at which its latest answer was handed over.
    answered: Vec<AtomicU64>,
    /// Per run: nanoseconds since `start` of its latest request.
    requested: Vec<AtomicU64>,
    /// Per run: nanoseconds since `start` of its first request.
    first: Vec<AtomicU64>,
    /// Per run, with `--steady`: nanoseconds since `start` of its `Runtime::run` call.
    launched: Vec<AtomicU64>,
    /// Runs that have made their first request.
    started: AtomicUsize,
    /// Per run and turn after the first: nanoseconds from the answer handed over to the next
    /// request (the runtime's own work between two model calls).
    gaps: Vec<AtomicU64>,
    /// Per run and turn after the first: nanoseconds from one request to the next, less the
    /// model's latency (the turn's wall time beyond the model: timer lateness and waiting for a
    /// worker thread included).
    turns: Vec<AtomicU64>,
}

impl Marks {
    fn new(runs: usize) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            answered: (0..runs).map(|_| AtomicU64::new(0)).collect(),
            requested: (0..runs).map(|_| AtomicU64::new(0)).collect(),
            first: (0..runs).map(|_| AtomicU64::new(0)).collect(),
            launched: (0..runs).map(|_| AtomicU64::new(0)).collect(),
            started: AtomicUsize::new(0),
            gaps: (0..runs * CALLS).map(|_| AtomicU64::new(0)).collect(),
            turns: (0..runs * CALLS).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

impl Model for Latent {
    fn name(&self) -> &str {
        "latent"
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let marks = Arc::clone(&self.shared);
        let now = marks.now();
        // The run's index is in its input, "run {i}".
        let run = match request.messages.first() {
            Some(Message::User { content }) => content.strip_prefix("run ").and_then(|i| i.parse::<usize>().ok()),
            _ => None,
        }
        .expect("the input names the run");
        let turn = request.messages.iter().filter(|m| matches!(m, Message::Assistant { .. })).count();
        let latency = self.latency;
        if turn > 0 {
            let gap = now - marks.answered[run].load(Ordering::Relaxed);
            marks.gaps[run * CALLS + turn - 1].store(gap, Ordering::Relaxed);
            let wall = now - marks.requested[run].load(Ordering::Relaxed);
            marks.turns[run * CALLS + turn - 1]
                .store(wall.saturating_sub(latency.as_nanos() as u64), Ordering::Relaxed);
        }
        marks.requested[run].store(now, Ordering::Relaxed);
        if turn == 0 {
            marks.first[run].store(now, Ordering::Relaxed);
            marks.started.fetch_add(1, Ordering::Release);
        }
        async_stream::stream! {
            tokio::time::sleep(latency).await;
            let usage = Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() };
            if turn < CALLS {
                yield Ok::<_, ModelError>(ModelEvent::ToolCall(ToolCallRequest {
                    call_id: format!("call_{turn}").into(),
                    name: "inc".into(),
                    arguments: format!(r#"{{"x":{turn}}}"#),
                }));
                marks.answered[run].store(marks.now(), Ordering::Relaxed);
                yield Ok(ModelEvent::Finish { reason: FinishReason::ToolCalls, usage });
            } else {
                yield Ok::<_, ModelError>(ModelEvent::TextDelta { delta: "done".to_owned() });
                yield Ok(ModelEvent::Finish { reason: FinishReason::Stop, usage });
            }
        }
        .boxed()
    }
}

/// A field of `/proc/self/status` in KiB (`VmHWM`, `VmRSS`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Each thread of this process: its name, and the nanoseconds it has run and has waited
/// runnable for a CPU, by thread id (`/proc/self/task/*/schedstat`: Linux with scheduler
/// statistics; empty elsewhere).
fn thread_times() -> HashMap<String, (String, u64, u64)> {
    let mut times = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return times;
    };
    for task in tasks.flatten() {
        let read = |file: &str| std::fs::read_to_string(task.path().join(file)).ok();
        let (Some(name), Some(stat)) = (read("comm"), read("schedstat")) else {
            continue;
        };
        let mut fields = stat.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
        let (ran, waited) = (fields.next().unwrap_or(0), fields.next().unwrap_or(0));
        times.insert(task.file_name().to_string_lossy().into_owned(), (name.trim().to_owned(), ran, waited));
    }
    times
}

/// What the threads named `name` did between two reads of [`thread_times`], in ns: each
/// thread's own difference (a thread started between them counts from 0; one that ended is
/// lost, which the bench's store and worker threads do not do), summed.
fn thread_delta(
    before: &HashMap<String, (String, u64, u64)>,
    after: &HashMap<String, (String, u64, u64)>,
    name: &str,
    waited: bool,
) -> u64 {
    let pick = |&(_, ran, wait): &(String, u64, u64)| if waited { wait } else { ran };
    after
        .iter()
        .filter(|(_, t)| t.0 == name)
        .map(|(tid, t)| pick(t).saturating_sub(before.get(tid).map_or(0, pick)))
        .sum()
}

/// The name of the runtime's worker threads in the bench.
const WORKER: &str = "bench-worker";

/// One configuration's figures, as the child prints them on one line (`key=value ...`).
#[derive(Debug, Clone, Default)]
struct Figures {
    store: String,
    runs: usize,
    latency_ms: u64,
    wall_s: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    own_p50_us: f64,
    own_p99_us: f64,
    first_p50_us: f64,
    first_max_us: f64,
    calls_us: f64,
    cpu_us_per_run: f64,
    timer_p50_us: f64,
    timer_p99_us: f64,
    step_writes: u64,
    store_writes: u64,
    commits: Option<u64>,
    rss_kib: u64,
    heap_bytes: u64,
    start_heap_bytes: u64,
    /// CPU time a run of the SQLite store's writer thread, of its checkpointer and of the
    /// runtime's worker threads (Linux's per-thread counts; 0 elsewhere or without the thread).
    writer_us_per_run: f64,
    /// How long the writer thread was runnable but not running, a run: waiting for a CPU.
    writer_waited_us_per_run: f64,
    checkpoint_us_per_run: f64,
    workers_us_per_run: f64,
    /// How long the worker threads were runnable but not running, a run: waiting for a CPU.
    workers_waited_us_per_run: f64,
    /// The same runs went once before the measured ones (`--warm`).
    warm: bool,
    /// The runs started spread over one model latency (`--steady`).
    steady: bool,
    timed_out: bool,
}

impl Figures {
    /// The store, and whether its runs started spread out and the process was warmed up first.
    fn label(&self) -> String {
        match (self.steady, self.warm) {
            (false, false) => self.store.clone(),
            (true, false) => format!("{} (steady)", self.store),
            (false, true) => format!("{} (warm)", self.store),
            (true, true) => format!("{} (steady, warm)", self.store),
        }
    }

    /// Every turn's model latency; with `--steady`, after the last run's start.
    fn ideal_s(&self) -> f64 {
        let latency = self.latency_ms as f64 / 1e3;
        let last_start = if self.steady { start_offset(self.runs - 1, self.runs, latency) } else { 0.0 };
        (CALLS + 1) as f64 * latency + last_start
    }

    fn line(&self) -> String {
        format!(
            "store={} runs={} latency_ms={} wall_s={} p50_us={} p99_us={} max_us={} own_p50_us={} own_p99_us={} first_p50_us={} first_max_us={} calls_us={} cpu_us_per_run={} timer_p50_us={} timer_p99_us={} step_writes={} store_writes={} commits={} rss_kib={} heap_bytes={} start_heap_bytes={} writer_us_per_run={:.1} writer_waited_us_per_run={:.1} checkpoint_us_per_run={:.1} workers_us_per_run={:.1} workers_waited_us_per_run={:.1} warm={} steady={}",
            self.store,
            self.runs,
            self.latency_ms,
            self.wall_s,
            self.p50_us,
            self.p99_us,
            self.max_us,
            self.own_p50_us,
            self.own_p99_us,
            self.first_p50_us,
            self.first_max_us,
            self.calls_us,
            self.cpu_us_per_run,
            self.timer_p50_us,
            self.timer_p99_us,
            self.step_writes,
            self.store_writes,
            self.commits.map_or_else(|| "-".to_owned(), |c| c.to_string()),
            self.rss_kib,
            self.heap_bytes,
            self.start_heap_bytes,
            self.writer_us_per_run,
            self.writer_waited_us_per_run,
            self.checkpoint_us_per_run,
            self.workers_us_per_run,
            self.workers_waited_us_per_run,
            u8::from(self.warm),
            u8::from(self.steady)
        )
    }

    fn parse(line: &str) -> Option<Self> {
        let mut f = Self::default();
        for pair in line.split_whitespace() {
            let (k, v) = pair.split_once('=')?;
            match k {
                "store" => f.store = v.to_owned(),
                "runs" => f.runs = v.parse().ok()?,
                "latency_ms" => f.latency_ms = v.parse().ok()?,
                "wall_s" => f.wall_s = v.parse().ok()?,
                "p50_us" => f.p50_us = v.parse().ok()?,
                "p99_us" => f.p99_us = v.parse().ok()?,
                "max_us" => f.max_us = v.parse().ok()?,
                "own_p50_us" => f.own_p50_us = v.parse().ok()?,
                "own_p99_us" => f.own_p99_us = v.parse().ok()?,
                "first_p50_us" => f.first_p50_us = v.parse().ok()?,
                "first_max_us" => f.first_max_us = v.parse().ok()?,
                "calls_us" => f.calls_us = v.parse().ok()?,
                "cpu_us_per_run" => f.cpu_us_per_run = v.parse().ok()?,
                "timer_p50_us" => f.timer_p50_us = v.parse().ok()?,
                "timer_p99_us" => f.timer_p99_us = v.parse().ok()?,
                "step_writes" => f.step_writes = v.parse().ok()?,
                "store_writes" => f.store_writes = v.parse().ok()?,
                "commits" => f.commits = v.parse().ok(),
                "rss_kib" => f.rss_kib = v.parse().ok()?,
                "heap_bytes" => f.heap_bytes = v.parse().ok()?,
                "start_heap_bytes" => f.start_heap_bytes = v.parse().ok()?,
                "writer_us_per_run" => f.writer_us_per_run = v.parse().ok()?,
                "writer_waited_us_per_run" => f.writer_waited_us_per_run = v.parse().ok()?,
                "checkpoint_us_per_run" => f.checkpoint_us_per_run = v.parse().ok()?,
                "workers_us_per_run" => f.workers_us_per_run = v.parse().ok()?,
                "workers_waited_us_per_run" => f.workers_waited_us_per_run = v.parse().ok()?,
                "warm" => f.warm = v == "1",
                "steady" => f.steady = v == "1",
                _ => {}
            }
        }
        Some(f)
    }
}

/// How late 100 concurrent sleeps of `latency` end on the idle runtime, p50 and p99 in µs: the
/// floor under the added latency per turn that comes from the timer (tokio's ticks in whole
/// milliseconds), not from the runtime.
async fn timer_lateness(latency: Duration) -> (f64, f64) {
    let sleeps = (0..100).map(|_| {
        tokio::spawn(async move {
            let start = Instant::now();
            tokio::time::sleep(latency).await;
            start.elapsed().saturating_sub(latency)
        })
    });
    let mut late: Vec<Duration> = futures::future::try_join_all(sleeps).await.expect("the sleeps");
    late.sort_unstable();
    (late[50].as_secs_f64() * 1e6, late[99].as_secs_f64() * 1e6)
}

/// The runtime's worker threads, by default: one per core of these machines.
const WORKERS: usize = 2;

/// How a child runs its configuration: the runtime's worker threads, how many (`--workers`) and
/// whether each is pinned to a CPU of its own (`--pin-workers`); `--warm`; whether the runs
/// start at once or spread over one model latency (`--steady`); who names them
/// (`--caller-ids`); and SQLite's page cache (`--page-cache-kib`).
#[derive(Clone, Copy)]
struct Setup {
    workers: usize,
    pin: bool,
    warm: bool,
    steady: bool,
    /// Who names the runs (`--caller-ids`).
    ids: Ids,
    /// SQLite's page cache, KiB (`--page-cache-kib`).
    page_cache_kib: Option<u64>,
}

/// Who names the runs: the runtime, or the bench as their caller (`--caller-ids`), with a
/// time-ordered or a random UUID.
#[derive(Clone, Copy)]
enum Ids {
    Runtime,
    CallerV7,
    CallerV4,
}

impl Ids {
    fn parse(v: &str) -> Self {
        match v {
            "v7" => Self::CallerV7,
            "v4" => Self::CallerV4,
            _ => panic!("--caller-ids is v7 or v4, not {v}"),
        }
    }

    /// `--caller-ids`' value, `None` for the runtime's own.
    fn flag(self) -> Option<&'static str> {
        match self {
            Self::Runtime => None,
            Self::CallerV7 => Some("v7"),
            Self::CallerV4 => Some("v4"),
        }
    }
}

/// When run `i` of `runs` starts with `--steady`, from the first: spread evenly over one
/// `latency` (in whatever unit `latency` is).
fn start_offset(i: usize, runs: usize, latency: f64) -> f64 {
    latency * i as f64 / runs as f64
}

/// An `on_thread_start` hook that pins the runtime's first `workers` threads, each to a CPU
/// of its own among those the process may use, and the count of threads it has seen. The
/// workers are the threads a multi-thread runtime starts when it is built, but their hooks
/// run on their own threads, later: the caller waits for `workers` of them before it uses the
/// runtime, so that no blocking thread (`spawn_blocking`) comes first and takes a CPU. On a VM
/// whose scheduler packs threads onto few vCPUs, a worker woken to take work otherwise waits,
/// runnable, behind the busy one on its vCPU while the other vCPU idles
/// (`docs/performance.md`, "Added latency at 1,000: where the tail comes from").
#[cfg(target_os = "linux")]
fn pin_workers(workers: usize) -> (impl Fn() + Send + Sync + 'static, Arc<AtomicUsize>) {
    use nix::{
        sched::{CpuSet, sched_getaffinity, sched_setaffinity},
        unistd::Pid,
    };
    let allowed = sched_getaffinity(Pid::from_raw(0)).expect("read the process's CPUs");
    let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect();
    assert!(cpus.len() >= workers, "--pin-workers needs {workers} CPUs, the process may use {cpus:?}");
    let started = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&started);
    let hook = move || {
        let n = seen.fetch_add(1, Ordering::AcqRel);
        if n < workers {
            let mut one = CpuSet::new();
            one.set(cpus[n]).expect("a CPU of the set");
            sched_setaffinity(Pid::from_raw(0), &one).expect("pin a worker thread");
        }
    };
    (hook, started)
}

#[cfg(not(target_os = "linux"))]
fn pin_workers(_workers: usize) -> (fn(), Arc<AtomicUsize>) {
    panic!("--pin-workers pins threads with Linux's sched_setaffinity");
}

/// The store a child runs on (`store` as `--store` names it), and the same store as
/// `SqliteStore` when it is one (for its commit count). A SQLite store is a new file at `file`;
/// PostgreSQL's is the child's schema.
fn open_store(
    store: &str,
    file: &Path,
    rt: &tokio::runtime::Runtime,
    schema: Option<&Dropped>,
    page_cache_kib: Option<u64>,
) -> (Arc<dyn RunStore>, Option<SqliteStore>) {
    match store {
        "sqlite" => {
            let _ = std::fs::remove_file(file);
            let mut options = SqliteOptions::default();
            if let Some(kib) = page_cache_kib {
                options.page_cache_bytes = kib.saturating_mul(1024);
            }
            let sqlite = SqliteStore::open_with(file, options).expect("open the bench database");
            (Arc::new(sqlite.clone()), Some(sqlite))
        }
        "postgres" => {
            let schema = schema.expect("a PostgreSQL child has a schema");
            let options = PostgresOptions { schema: schema.name.clone(), ..PostgresOptions::default() };
            let store =
                rt.block_on(PostgresStore::connect_with(&schema.url, options)).expect("connect to DATABASE_URL");
            (Arc::new(store), None)
        }
        "handoff" => (Arc::new(handoff::Handoff::new(Arc::new(MemoryStore::new()))), None),
        _ => (Arc::new(MemoryStore::new()), None),
    }
}

/// The bench's runtime: one agent with the `inc` tool, the model answering after `latency`.
fn bench_runtime(store: Arc<dyn RunStore>, latency: Duration, marks: Arc<Marks>) -> Runtime {
    Runtime::builder()
        .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(CALLS + 1))
        .model(Latent { latency, shared: marks })
        .store_arc(store)
        .build()
        .expect("build the runtime")
}

/// Starts `runs` runs, at once or (`steady`: the model's latency) spread over one latency, and
/// waits for every one to finish: when they were started (on `clock`), how long the `run` calls
/// took, and the wall. Called from a task, as a service starts runs.
async fn run_all(
    runtime: Runtime,
    runs: usize,
    clock: Arc<Marks>,
    steady: Option<Duration>,
    ids: Ids,
) -> (u64, Duration, Duration) {
    let (start, started) = (Instant::now(), clock.now());
    // Run ids are the runtime's own, as for a service that does not name its runs, unless the
    // bench names them as a caller would.
    let run = |i: usize| {
        let request = RunRequest::new(format!("run {i}"));
        let request = match ids {
            Ids::Runtime => request,
            Ids::CallerV7 => request.run_id(uuid::Uuid::now_v7().to_string()),
            Ids::CallerV4 => request.run_id(uuid::Uuid::new_v4().to_string()),
        };
        if steady.is_some() {
            // Its start is when its timer let it go, up to a tick after its slot.
            clock.launched[i].store(clock.now(), Ordering::Relaxed);
        }
        std::future::IntoFuture::into_future(runtime.run(request))
    };
    // Each output is checked and dropped as its run ends, so the peak RSS is the runs' own and
    // not the bench holding every finished conversation.
    let mut pending: futures::stream::FuturesUnordered<_> = match steady {
        None => (0..runs).map(run).collect(),
        Some(latency) => {
            // `run` spawns the run's task, so the handles need no polling while the rest start;
            // none can finish within the one latency the starts take.
            let pending = futures::stream::FuturesUnordered::new();
            let first = tokio::time::Instant::from_std(start);
            for i in 0..runs {
                let at = Duration::from_secs_f64(start_offset(i, runs, latency.as_secs_f64()));
                tokio::time::sleep_until(first + at).await;
                pending.push(run(i));
            }
            pending
        }
    };
    let calls = start.elapsed();
    while let Some(out) = pending.next().await {
        assert_eq!(out.expect("the run finishes").status, RunStatus::Finished);
    }
    (started, calls, start.elapsed())
}

/// The child: `runs` runs on `store`, started at once or spread over one latency
/// (`setup.steady`), on a Tokio runtime of `setup.workers` worker threads (pinned with
/// `setup.pin`), after a first round of them with `setup.warm`.
fn one(store: &str, runs: usize, latency: Duration, dir: &Path, setup: Setup) -> Figures {
    let steady = setup.steady.then_some(latency);
    // Declared before the runtime, so dropped after it: no task of the runs is left to use the
    // schema when it goes. A schema of the same name, left by an earlier process with this pid,
    // goes first.
    let schema = (store == "postgres").then(|| {
        let url = std::env::var("DATABASE_URL").expect("--store postgres reads the server's URL from DATABASE_URL");
        let schema = Dropped { url, name: schema_of(std::process::id()) };
        drop_schema(&schema.url, &schema.name);
        schema
    });
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(setup.workers).enable_all();
    // The workers are the runtime's first threads; the blocking pool's come after, and would
    // otherwise share their name (the per-thread figures count the workers alone).
    let named = AtomicUsize::new(0);
    builder.thread_name_fn(move || {
        if named.fetch_add(1, Ordering::Relaxed) < setup.workers { WORKER } else { "bench-blocking" }.to_owned()
    });
    let pinned = setup.pin.then(|| {
        let (hook, started) = pin_workers(setup.workers);
        builder.on_thread_start(hook);
        started
    });
    let rt = builder.build().unwrap();
    if let Some(started) = pinned {
        while started.load(Ordering::Acquire) < setup.workers {
            std::thread::yield_now();
        }
    }
    let (inner, sqlite) =
        open_store(store, &dir.join(format!("in-flight-{runs}.db")), &rt, schema.as_ref(), setup.page_cache_kib);
    if setup.warm {
        // A runtime and marks of its own, so that the measured round's counts and samples are
        // its own; the store is the same, so its caches and connections are warm.
        let marks = Marks::new(runs);
        let runtime = bench_runtime(Arc::clone(&inner), latency, Arc::clone(&marks));
        rt.block_on(async move { tokio::spawn(run_all(runtime, runs, marks, steady, setup.ids)).await })
            .expect("the warm-up round");
        // SQLite's checkpointer copies what is left 100 ms after the last commit: past that,
        // its catching up does not land in the measured round's CPU.
        std::thread::sleep(Duration::from_millis(300));
    }
    let counting = Arc::new(CountingStore::new(inner));
    let marks = Marks::new(runs);
    let runtime = bench_runtime(Arc::clone(&counting) as Arc<dyn RunStore>, latency, Arc::clone(&marks));
    let timer = rt.block_on(async move { tokio::spawn(timer_lateness(latency)).await }).expect("the timer task");
    let commits_before = sqlite.as_ref().map(SqliteStore::commit_count);
    let baseline = status_kib("VmHWM");
    let heap_before = allocated();
    // The peak of live heap bytes, sampled every millisecond while the runs run.
    let heap_peak = Arc::new(AtomicU64::new(heap_before as u64));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // The live heap the first time every run had made its first request.
    let heap_started = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (peak, on, at_start, marks) =
            (Arc::clone(&heap_peak), Arc::clone(&sampling), Arc::clone(&heap_started), Arc::clone(&marks));
        std::thread::spawn(move || {
            while on.load(Ordering::Relaxed) {
                // Read before the heap, so the sample is from after the last first request.
                let all_started = marks.started.load(Ordering::Acquire) == runs;
                let live = allocated() as u64;
                peak.fetch_max(live, Ordering::Relaxed);
                if all_started && at_start.load(Ordering::Relaxed) == 0 {
                    at_start.store(live, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };

    // Started from a task on the runtime, as a service starts runs.
    let clock = Arc::clone(&marks);
    let threads_before = thread_times();
    let cpu_start = cpu_time::ProcessTime::now();
    let (started, calls, wall) = rt
        .block_on(async move { tokio::spawn(run_all(runtime, runs, clock, steady, setup.ids)).await })
        .expect("the bench task");

    let cpu = cpu_start.elapsed();
    let threads_after = thread_times();
    // Per run, in µs, of what the threads named `name` did while the runs ran.
    let per_run = |name: &str, waited: bool| {
        thread_delta(&threads_before, &threads_after, name, waited) as f64 / 1e3 / runs as f64
    };
    let peak = status_kib("VmHWM");
    sampling.store(false, Ordering::Relaxed);
    sampler.join().expect("the heap sampler");
    let sorted = |v: &[AtomicU64]| {
        let mut v: Vec<u64> = v.iter().map(|g| g.load(Ordering::Relaxed)).collect();
        v.sort_unstable();
        v
    };
    let (gaps, turns) = (sorted(&marks.gaps), sorted(&marks.turns));
    // When each run's first request came, from the moment they were all started, or with
    // `--steady` from its own `run` call.
    let firsts: Vec<u64> = {
        let at = |i: usize| if steady.is_some() { marks.launched[i].load(Ordering::Relaxed) } else { started };
        let mut v: Vec<u64> =
            marks.first.iter().enumerate().map(|(i, f)| f.load(Ordering::Relaxed).saturating_sub(at(i))).collect();
        v.sort_unstable();
        v
    };
    let q = |v: &[u64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    Figures {
        store: store.to_owned(),
        runs,
        latency_ms: latency.as_millis() as u64,
        wall_s: wall.as_secs_f64(),
        p50_us: q(&turns, 0.5),
        p99_us: q(&turns, 0.99),
        max_us: q(&turns, 1.0),
        own_p50_us: q(&gaps, 0.5),
        own_p99_us: q(&gaps, 0.99),
        cpu_us_per_run: cpu.as_secs_f64() * 1e6 / runs as f64,
        first_p50_us: q(&firsts, 0.5),
        first_max_us: q(&firsts, 1.0),
        calls_us: calls.as_secs_f64() * 1e6,
        timer_p50_us: timer.0,
        timer_p99_us: timer.1,
        step_writes: counting.counts().steps,
        store_writes: counting.counts().writes,
        commits: sqlite.as_ref().zip(commits_before).map(|(s, b)| s.commit_count() - b),
        rss_kib: peak.saturating_sub(baseline),
        heap_bytes: heap_peak.load(Ordering::Relaxed).saturating_sub(heap_before as u64),
        start_heap_bytes: heap_started.load(Ordering::Relaxed).saturating_sub(heap_before as u64),
        writer_us_per_run: per_run("kuralle-writer", false),
        writer_waited_us_per_run: per_run("kuralle-writer", true),
        checkpoint_us_per_run: per_run("kuralle-checkpt", false),
        workers_us_per_run: per_run(WORKER, false),
        workers_waited_us_per_run: per_run(WORKER, true),
        warm: setup.warm,
        steady: setup.steady,
        timed_out: false,
    }
}

/// The bench's PostgreSQL schema, dropped when the child ends, and by the parent once the child
/// is gone, however it ended ([`spawn_one`]).
struct Dropped {
    url: String,
    name: String,
}

impl Drop for Dropped {
    fn drop(&mut self) {
        drop_schema(&self.url, &self.name);
    }
}

/// Drops the schema of the child `pid` on `store`, if that is PostgreSQL.
fn drop_childs_schema(store: &str, pid: u32) {
    if let ("postgres", Ok(url)) = (store, std::env::var("DATABASE_URL")) {
        drop_schema(&url, &schema_of(pid));
    }
}

/// The schema of the child with process id `pid`.
fn schema_of(pid: u32) -> String {
    format!("in_flight_{pid}")
}

/// One configuration's spread over its runs: each figure's own min / median / max (the upper
/// of the two middle values for an even count), over the runs that finished within the cap.
fn spread(runs: &[Figures]) -> String {
    let three = |values: Vec<f64>, unit: &str, digits: usize| {
        let mut v = values;
        if v.is_empty() {
            return "—".to_owned();
        }
        v.sort_by(f64::total_cmp);
        let pick = |q: usize| format!("{:.*}{unit}", digits, v[q]);
        format!("{} / {} / {}", pick(0), pick(v.len() / 2), pick(v.len() - 1))
    };
    let f = &runs[0];
    let finished: Vec<&Figures> = runs.iter().filter(|r| !r.timed_out).collect();
    format!(
        "- {} {} runs, {} ms: wall / ideal {}; p99 added latency per turn {}; CPU per run {}{}",
        f.label(),
        f.runs,
        f.latency_ms,
        three(finished.iter().map(|r| r.wall_s / r.ideal_s()).collect(), "×", 2),
        three(finished.iter().map(|r| r.p99_us / 1e3).collect(), " ms", 1),
        three(finished.iter().map(|r| r.cpu_us_per_run).collect(), " µs", 0),
        if finished.len() < runs.len() {
            format!(" ({} stopped at the cap)", runs.len() - finished.len())
        } else {
            String::new()
        },
    )
}

/// Runs one configuration in a child process, killed after `cap`.
fn spawn_one(store: &str, runs: usize, latency_ms: u64, cap: Duration, setup: Setup) -> Figures {
    let mut child = Command::new(std::env::current_exe().expect("this binary"))
        .args(["--one", store, &runs.to_string(), &latency_ms.to_string()])
        .args(["--workers", &setup.workers.to_string()])
        .args(setup.pin.then_some("--pin-workers"))
        .args(setup.warm.then_some("--warm"))
        .args(setup.steady.then_some("--steady"))
        .args(setup.ids.flag().iter().flat_map(|v| ["--caller-ids", v]))
        .args(setup.page_cache_kib.iter().flat_map(|k| ["--page-cache-kib".to_owned(), k.to_string()]))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the child");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait for the child").is_some() {
            break;
        }
        if start.elapsed() > cap {
            let _ = child.kill();
            let _ = child.wait();
            // A killed child leaves its database behind.
            let _ =
                std::fs::remove_dir_all(std::env::temp_dir().join(format!("kuralle-bench-in-flight-{}", child.id())));
            drop_childs_schema(store, child.id());
            return Figures {
                store: store.to_owned(),
                runs,
                latency_ms,
                wall_s: cap.as_secs_f64(),
                warm: setup.warm,
                steady: setup.steady,
                timed_out: true,
                ..Figures::default()
            };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id();
    let out = child.wait_with_output().expect("the child's output");
    // A child that ended on its own dropped its schema; one that crashed did not.
    drop_childs_schema(store, pid);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(Figures::parse).unwrap_or_else(|| panic!("{store} N={runs}: no figures in {text:?}"))
}

fn kib(v: f64) -> String {
    format!("{:.1} KiB", v)
}

fn print_row(f: &Figures) {
    if f.timed_out {
        // With `--warm` the cap covers both rounds, so it bounds neither's wall.
        let (wall, ratio) = if f.warm {
            (format!("> {:.0} s, both rounds (stopped)", f.wall_s), "—".to_owned())
        } else {
            (format!("> {:.0} s (stopped)", f.wall_s), format!("> {:.1}×", f.wall_s / f.ideal_s()))
        };
        println!(
            "| {} | {} | {} ms | {wall} | {ratio} | — | — | — | — | — | — | — | — | — | — | — |",
            f.label(),
            f.runs,
            f.latency_ms,
        );
        return;
    }
    let per_commit = f.commits.map_or_else(|| "—".to_owned(), |c| format!("{:.2}", f.store_writes as f64 / c as f64));
    // After a warm-up round the high-water mark is mostly that round's: the measured round's
    // growth of it is only what it added above it.
    let rss = if f.warm { "—".to_owned() } else { kib(f.rss_kib as f64 / f.runs as f64) };
    println!(
        "| {} | {} | {} ms | {:.2} s | {:.2}× | {:.0} / {:.0} µs (max {:.0}) | {:.0} / {:.0} µs | {:.1} / {:.1} ms | {:.1} ms | {:.0} µs | {:.0} / {:.0} µs | {:.0} | {:.1} | {} | {} | {} |",
        f.label(),
        f.runs,
        f.latency_ms,
        f.wall_s,
        f.wall_s / f.ideal_s(),
        f.p50_us,
        f.p99_us,
        f.max_us,
        f.own_p50_us,
        f.own_p99_us,
        f.first_p50_us / 1e3,
        f.first_max_us / 1e3,
        f.calls_us / 1e3,
        f.cpu_us_per_run,
        f.timer_p50_us,
        f.timer_p99_us,
        f.step_writes as f64 / f.wall_s,
        f.store_writes as f64 / f.runs as f64,
        rss,
        kib(f.heap_bytes as f64 / 1024.0 / f.runs as f64),
        per_commit
    );
}

/// The chart: per store and latency, throughput (finished runs/s, left axis) and p50/p99 added
/// latency per turn (ms, right axis, log scale) against runs in flight (log scale).
fn svg(all: &[Figures]) -> String {
    let done: Vec<&Figures> = all.iter().filter(|f| !f.timed_out).collect();
    let (w, h, left, right, top, bottom) = (760.0, 420.0, 70.0, 80.0, 40.0, 60.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let runs_max = done.iter().map(|f| f.runs).max().unwrap_or(10).max(10) as f64;
    let runs_min = done.iter().map(|f| f.runs).min().unwrap_or(1).clamp(1, 100) as f64;
    let (lx0, lx1) = (runs_min.log10().floor(), runs_max.log10().ceil().max(runs_min.log10().floor() + 1.0));
    let x = |n: f64| left + (n.log10() - lx0) / (lx1 - lx0) * pw;
    let rate = |f: &Figures| f.runs as f64 / f.wall_s;
    let rate_max = done.iter().map(|f| rate(f)).fold(1.0, f64::max) * 1.1;
    let y_rate = |r: f64| top + ph - r / rate_max * ph;
    let ms = |us: f64| (us / 1e3).max(0.01);
    let lat_max = done.iter().map(|f| ms(f.p99_us)).fold(1.0, f64::max);
    let (ly0, ly1) = (-2.0f64, lat_max.log10().ceil().max(0.0) + 0.0001);
    let y_lat = |m: f64| top + ph - (m.log10() - ly0) / (ly1 - ly0) * ph;

    let mut s = String::new();
    s += &format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="20" text-anchor="middle" font-size="14">kuralle: runs in flight on one runtime (3 tool-call turns + answer each)</text>
<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>
<line x1="{}" y1="{top}" x2="{}" y2="{}" stroke="black"/>
"#,
        w / 2.0,
        top + ph,
        left + pw,
        top + ph,
        top + ph,
        left + pw,
        left + pw,
        top + ph
    );
    let mut decade = lx0;
    while decade <= lx1 + 1e-9 {
        let n = 10f64.powf(decade);
        s += &format!(
            "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{0:.1}\" y2=\"{2:.1}\" stroke=\"#ddd\"/><text x=\"{0:.1}\" y=\"{3:.1}\" text-anchor=\"middle\">{4}</text>\n",
            x(n),
            top,
            top + ph,
            top + ph + 16.0,
            n as u64
        );
        decade += 1.0;
    }
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">runs in flight (log)</text>\n",
        left + pw / 2.0,
        h - 20.0
    );
    for i in 0..=4 {
        let r = rate_max * i as f64 / 4.0;
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}</text>\n",
            left - 6.0,
            y_rate(r) + 4.0,
            r
        );
    }
    s += &format!(
        "<text transform=\"translate(18,{:.1}) rotate(-90)\" text-anchor=\"middle\">finished runs / s (solid)</text>\n",
        top + ph / 2.0
    );
    let mut e = ly0;
    while e <= ly1 {
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">{} ms</text>\n",
            left + pw + 6.0,
            y_lat(10f64.powf(e)) + 4.0,
            10f64.powf(e)
        );
        e += 1.0;
    }
    s += &format!(
        "<text transform=\"translate({:.1},{:.1}) rotate(90)\" text-anchor=\"middle\">added latency per turn, log (p50 dashed, p99 dotted)</text>\n",
        w - 12.0,
        top + ph / 2.0
    );
    let mut series: Vec<(String, u64)> = done.iter().map(|f| (f.label(), f.latency_ms)).collect();
    series.dedup();
    series.sort();
    series.dedup();
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    for (i, (store, latency)) in series.iter().enumerate() {
        let colour = colours[i % colours.len()];
        let mut points: Vec<&&Figures> =
            done.iter().filter(|f| &f.label() == store && f.latency_ms == *latency).collect();
        points.sort_by_key(|f| f.runs);
        let path = |y: &dyn Fn(&Figures) -> f64| {
            points.iter().map(|f| format!("{:.1},{:.1}", x(f.runs as f64), y(f))).collect::<Vec<_>>().join(" ")
        };
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\n",
            path(&|f| y_rate(rate(f)))
        );
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-dasharray=\"6,4\" points=\"{}\"/>\n",
            path(&|f| y_lat(ms(f.p50_us)))
        );
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-dasharray=\"2,3\" points=\"{}\"/>\n",
            path(&|f| y_lat(ms(f.p99_us)))
        );
        for f in &points {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>\n",
                x(f.runs as f64),
                y_rate(rate(f))
            );
        }
        s += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{store}, model latency {latency} ms</text>\n",
            left + 10.0,
            top + 16.0 + 16.0 * i as f64
        );
    }
    s += "</svg>\n";
    s
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',').map(|v| v.trim().parse().unwrap_or_else(|_| panic!("not a number: {v}"))).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let workers: usize = value("--workers").map_or(WORKERS, |v| v.parse().expect("--workers is a count"));
    assert!(workers >= 1, "--workers is at least 1");
    let flag = |name: &str| args.iter().any(|a| a == name);
    let setup = Setup {
        workers,
        pin: flag("--pin-workers"),
        warm: flag("--warm"),
        steady: flag("--steady"),
        ids: value("--caller-ids").map_or(Ids::Runtime, |v| Ids::parse(&v)),
        page_cache_kib: value("--page-cache-kib").map(|v| v.parse().expect("--page-cache-kib is KiB")),
    };
    let dir = std::env::temp_dir().join(format!("kuralle-bench-in-flight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    if let Some(at) = args.iter().position(|a| a == "--one") {
        let store = args.get(at + 1).expect("--one STORE N LATENCY_MS");
        let runs: usize = args.get(at + 2).and_then(|v| v.parse().ok()).expect("--one STORE N LATENCY_MS");
        let latency: u64 = args.get(at + 3).and_then(|v| v.parse().ok()).expect("--one STORE N LATENCY_MS");
        let f = one(store, runs, Duration::from_millis(latency), &dir, setup);
        let _ = std::fs::remove_dir_all(&dir);
        println!("{}", f.line());
        return;
    }
    let stores: Vec<String> = match value("--store") {
        Some(s) => s.split(',').map(str::to_owned).collect(),
        None => vec!["memory".to_owned(), "sqlite".to_owned()],
    };
    for s in &stores {
        assert!(
            ["memory", "sqlite", "postgres", "handoff"].contains(&s.as_str()),
            "--store is memory, sqlite, postgres or handoff, not {s}"
        );
    }
    let runs: Vec<usize> = value("--runs").map_or_else(|| vec![100, 1_000, 10_000], |v| list(&v));
    let latencies: Vec<u64> = value("--latency-ms").map_or_else(|| vec![100], |v| list(&v));
    let cap = Duration::from_secs(value("--cap-s").map_or(180, |v| v.parse().expect("--cap-s is seconds")));
    let repeat: usize = value("--repeat").map_or(1, |v| v.parse().expect("--repeat is a count"));
    assert!(repeat >= 1, "--repeat is at least 1");
    // `cargo bench` runs benches with the package's directory as the working directory.
    let svg_path = value("--svg").map_or_else(
        || {
            PathBuf::from(std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "../target".to_owned()))
                .join("in_flight.svg")
        },
        PathBuf::from,
    );
    let _ = std::fs::remove_dir_all(&dir);

    let pinned = if setup.pin { ", each pinned to a CPU of its own" } else { "" };
    let named = match setup.ids {
        Ids::Runtime => "",
        Ids::CallerV7 => ", runs named by the bench with UUID v7 ids",
        Ids::CallerV4 => ", runs named by the bench with random (v4) ids",
    };
    let cache = setup.page_cache_kib.map_or_else(String::new, |k| format!(", SQLite page cache {k} KiB"));
    println!(
        "runs in flight on one runtime ({} worker threads{pinned}{named}{cache}), each {CALLS} one-call turns and an answer; \
         added latency per turn = request to next request, less the model's latency; \
         answer -> next request = from the answer handed over to the run's next request",
        setup.workers
    );
    println!(
        "| store | runs in flight | model latency | wall | wall / ideal | added latency per turn p50 / p99 | answer → next request p50 / p99 | first request p50 / last | `run` calls made in | CPU per run | idle timer lateness p50 / p99 | journal writes/s | store writes per run | peak RSS per run | peak live heap per run | store writes per commit |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all = Vec::new();
    let mut spreads = Vec::new();
    for latency in &latencies {
        for store in &stores {
            for n in &runs {
                let mut runs_of_this: Vec<Figures> = (0..repeat)
                    .map(|_| {
                        let f = spawn_one(store, *n, *latency, cap, setup);
                        print_row(&f);
                        let _ = std::io::stdout().flush();
                        f
                    })
                    .collect();
                if repeat > 1 {
                    spreads.push(spread(&runs_of_this));
                }
                // The chart's run: the median by wall of those that finished (a run stopped at
                // the cap only when none did).
                runs_of_this.sort_by(|a, b| a.timed_out.cmp(&b.timed_out).then(a.wall_s.total_cmp(&b.wall_s)));
                let finished = runs_of_this.iter().filter(|r| !r.timed_out).count();
                all.push(runs_of_this.swap_remove(if finished > 0 { finished / 2 } else { 0 }));
            }
        }
    }
    if !spreads.is_empty() {
        println!();
        println!(
            "spread over {repeat} runs of each configuration (each figure's own min / median / max, over the runs that finished):"
        );
        for line in spreads {
            println!("{line}");
        }
    }
    if let Some(parent) = svg_path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&svg_path, svg(&all)).expect("write the SVG chart");
    println!("chart: {}", svg_path.display());
}

/// `--store handoff`: a run's writes go to a `MemoryStore`, and each then waits for a thread of
/// its own to answer, which answers what is queued together, after 300 µs (a commit's time
/// without its CPU). Reads and the background writes (renewals, releases) do not wait.
mod handoff {
    use std::{
        sync::{Arc, Mutex, mpsc},
        time::Duration,
    };

    use futures::future::BoxFuture;
    use kuralle::{
        FinishedStep, FinishedWithIntents, InstanceLock, Lease, NewStep, RunFilter, RunRecord, RunStatus, RunStore,
        RunSummary, StepOutcome, StepRecord, StoreError, StoreFuture,
    };
    use tokio::sync::oneshot;

    /// The most writes answered together (as the SQLite writer's batch).
    const BATCH: usize = 512;

    pub struct Handoff {
        inner: Arc<dyn RunStore>,
        queue: Mutex<mpsc::Sender<oneshot::Sender<()>>>,
    }

    impl Handoff {
        pub fn new(inner: Arc<dyn RunStore>) -> Self {
            let (queue, waiting) = mpsc::channel::<oneshot::Sender<()>>();
            std::thread::spawn(move || {
                let mut batch = Vec::with_capacity(BATCH);
                while let Ok(first) = waiting.recv() {
                    batch.push(first);
                    batch.extend(waiting.try_iter().take(BATCH - 1));
                    std::thread::sleep(Duration::from_micros(300));
                    for answer in batch.drain(..) {
                        let _ = answer.send(());
                    }
                }
            });
            Self { inner, queue: Mutex::new(queue) }
        }

        /// `write`, then a wait for the thread's answer.
        fn handed<'a, T: Send + 'a>(&'a self, write: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
            Box::pin(async move {
                let written = write.await;
                let (answer, answered) = oneshot::channel();
                self.queue.lock().unwrap().send(answer).expect("the hand-off thread runs");
                let _ = answered.await;
                written
            })
        }
    }

    impl RunStore for Handoff {
        fn create_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, ()> {
            self.handed(self.inner.create_run(run, fence))
        }
        fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
            self.inner.get_run(run_id)
        }
        fn put_run(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, u64> {
            self.handed(self.inner.put_run(run, fence))
        }
        fn put_run_and_release(&self, run: RunRecord, fence: u64) -> StoreFuture<'_, (u64, bool)> {
            self.handed(self.inner.put_run_and_release(run, fence))
        }
        fn put_run_and_release_after(
            &self,
            last: FinishedStep,
            run: RunRecord,
            fence: u64,
        ) -> StoreFuture<'_, (u64, bool)> {
            self.handed(self.inner.put_run_and_release_after(last, run, fence))
        }
        fn list_runs(&self, filter: RunFilter) -> StoreFuture<'_, Vec<RunSummary>> {
            self.inner.list_runs(filter)
        }
        fn delete_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, bool> {
            self.inner.delete_run(run_id)
        }
        fn append_steps<'a>(&'a self, run_id: &'a str, fence: u64, steps: Vec<NewStep>) -> StoreFuture<'a, Vec<u64>> {
            self.handed(self.inner.append_steps(run_id, fence, steps))
        }
        fn finish_step<'a>(
            &'a self,
            run_id: &'a str,
            fence: u64,
            ordinal: u64,
            outcome: StepOutcome,
            finished_at_ms: i64,
        ) -> StoreFuture<'a, ()> {
            self.handed(self.inner.finish_step(run_id, fence, ordinal, outcome, finished_at_ms))
        }
        fn append_finished_with_intents<'a>(
            &'a self,
            run_id: &'a str,
            fence: u64,
            write: FinishedWithIntents,
        ) -> StoreFuture<'a, Vec<u64>> {
            self.handed(self.inner.append_finished_with_intents(run_id, fence, write))
        }
        fn cancel_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunStatus>> {
            self.inner.cancel_run(run_id)
        }
        fn steps<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Vec<StepRecord>> {
            self.inner.steps(run_id)
        }
        fn acquire_lease<'a>(&'a self, run_id: &'a str, owner: &'a str, ttl: Duration) -> StoreFuture<'a, Lease> {
            self.handed(self.inner.acquire_lease(run_id, owner, ttl))
        }
        fn acquire_lease_and_get_run<'a>(
            &'a self,
            run_id: &'a str,
            owner: &'a str,
            ttl: Duration,
        ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
            self.handed(self.inner.acquire_lease_and_get_run(run_id, owner, ttl))
        }
        fn acquire_lease_and_create_run<'a>(
            &'a self,
            new: RunRecord,
            owner: &'a str,
            ttl: Duration,
        ) -> StoreFuture<'a, (Lease, Option<RunRecord>)> {
            self.handed(self.inner.acquire_lease_and_create_run(new, owner, ttl))
        }
        fn renew_lease<'a>(&'a self, lease: &'a Lease, ttl: Duration) -> StoreFuture<'a, Lease> {
            self.inner.renew_lease(lease, ttl)
        }
        fn renew_leases<'a>(
            &'a self,
            leases: &'a [Lease],
            ttl: Duration,
        ) -> StoreFuture<'a, Vec<Result<Lease, StoreError>>> {
            self.inner.renew_leases(leases, ttl)
        }
        fn release_lease<'a>(&'a self, lease: &'a Lease) -> StoreFuture<'a, ()> {
            self.inner.release_lease(lease)
        }
        fn current_lease<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Lease>> {
            self.inner.current_lease(run_id)
        }
        fn claim_runnable<'a>(&'a self, owner: &'a str, ttl: Duration, limit: usize) -> StoreFuture<'a, Vec<Lease>> {
            self.inner.claim_runnable(owner, ttl, limit)
        }
        fn lock_instance<'a>(&'a self, instance_id: &'a str) -> StoreFuture<'a, Option<Box<dyn InstanceLock>>> {
            self.inner.lock_instance(instance_id)
        }
        fn notify_runnable(&self) -> StoreFuture<'_, ()> {
            self.inner.notify_runnable()
        }
        fn wait_runnable(&self, poll: Duration) -> BoxFuture<'_, ()> {
            self.inner.wait_runnable(poll)
        }
    }
}
