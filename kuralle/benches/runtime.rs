//! Per-turn cost of a run as it grows: one run of N serial one-call turns (the model asks for
//! one tool call, gets its result, asks for the next), for N = 10, 100, 1,000 and 5,000, on
//! `MemoryStore` and `SqliteStore`. A turn must cost the same at N = 5,000 as at N = 10.
//!
//! `cargo bench -p kuralle --bench runtime` prints, per store and N, medians over several runs
//! of wall and CPU time (of the whole process, every thread):
//! - a turn: from the run's first model request to its last (the N + 1-th), per turn. This is
//!   the figure that must not grow with N.
//! - the whole run per turn, and the run's start and end (creating the run, taking and giving
//!   back its lease, writing its final state, which holds the conversation and so grows with
//!   N), once per run: at N = 10 that is spread over ten turns.
//!
//! Runs are started from a task on the runtime, as a service starts them; a last line shows
//! N = 10 started from `block_on`'s thread instead (two cross-thread hand-offs per run). On
//! SQLite it also prints the durable commits per turn and a turn next to one `fdatasync` in the
//! same directory, measured in the same run.
//!
//! `cargo bench -p kuralle --bench runtime -- --only memory 1000` runs one run once and
//! prints its figures, for `valgrind --tool=callgrind` (instructions per turn are
//! `(Ir(N=1000) - Ir(N=100)) / 900`) or `/usr/bin/time -v` (peak RSS of 5,000 serial calls).
//! `--only memory 10 101` runs 101 runs of 10 turns: `(Ir(10 101) - Ir(10 1)) / 100` is what a
//! warm run of 10 turns costs, set-up included.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::stream::BoxStream;
use kuralle::{
    AgentDef, Model, ModelError, ModelEvent, ModelRequest, RunStatus, RunStore, Runtime,
    stores::{MemoryStore, SqliteStore},
    testing::{ScriptedModel, Turn},
    tool,
};

/// Add one.
#[tool]
async fn inc(
    /// The number.
    x: u64,
) -> u64 {
    x + 1
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Store {
    Memory,
    Sqlite,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
        }
    }
}

fn script(n: usize) -> Vec<Turn> {
    let mut turns: Vec<Turn> = (0..n)
        .map(|i| Turn::tool_calls([(format!("call_{i}"), "inc".to_owned(), format!(r#"{{"x":{i}}}"#))]))
        .collect();
    turns.push(Turn::text("done"));
    turns
}

struct Measured {
    /// The whole run: its start (run record, lease), its N turns, its end.
    elapsed: Duration,
    cpu: Duration,
    /// The N turns alone: from the first model request to the last (the N + 1-th).
    turns: Duration,
    turns_cpu: Duration,
    commits: Option<u64>,
}

/// `ScriptedModel`, noting when the first and the latest request arrived (wall and CPU).
struct Timed {
    model: ScriptedModel,
    marks: std::sync::Mutex<Option<[(Instant, Duration); 2]>>,
}

impl Timed {
    fn new(model: ScriptedModel) -> Self {
        Self { model, marks: std::sync::Mutex::new(None) }
    }

    /// Forgets the marks, before the next run.
    fn reset(&self) {
        *self.marks.lock().unwrap() = None;
    }

    /// Wall and CPU time from the first request to the latest.
    fn between(&self) -> (Duration, Duration) {
        let marks = self.marks.lock().unwrap().expect("the model was asked");
        (marks[1].0 - marks[0].0, marks[1].1 - marks[0].1)
    }
}

impl Model for Timed {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let now = (Instant::now(), process_cpu());
        let mut marks = self.marks.lock().unwrap();
        *marks = Some([marks.map_or(now, |m| m[0]), now]);
        drop(marks);
        self.model.stream(request)
    }
}

/// CPU time used by the whole process so far (all threads).
fn process_cpu() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}

/// The next run of `cell`: its serial one-call turns; only the run itself is timed.
async fn one_run(cell: &Cell) -> Measured {
    cell.model.reset();
    let before = cell.sqlite.as_ref().map(SqliteStore::commit_count);
    let (start, cpu_start) = (Instant::now(), process_cpu());
    let out = cell.runtime.run("go").await.expect("the run finishes");
    let (elapsed, cpu) = (start.elapsed(), process_cpu() - cpu_start);
    assert_eq!(out.status, RunStatus::Finished);
    let commits = cell.sqlite.as_ref().zip(before).map(|(s, b)| s.commit_count() - b);
    let (turns, turns_cpu) = cell.model.between();
    Measured { elapsed, cpu, turns, turns_cpu, commits }
}

/// One runtime, store and model for a cell's runs, as a service keeps them: each run is a new
/// run of `n` turns in the same store (on SQLite, the same database file).
struct Cell {
    runtime: Runtime,
    model: Arc<Timed>,
    sqlite: Option<SqliteStore>,
}

impl Cell {
    fn new(store: Store, n: usize, rounds: usize, dir: &std::path::Path) -> Self {
        let sqlite = match store {
            Store::Memory => None,
            Store::Sqlite => {
                let path = dir.join(format!("runtime-{n}.db"));
                let _ = std::fs::remove_file(&path);
                Some(SqliteStore::open(&path).expect("open the bench database"))
            }
        };
        let store_arc: Arc<dyn RunStore> = match &sqlite {
            Some(s) => Arc::new(s.clone()),
            None => Arc::new(MemoryStore::new()),
        };
        // The runs one after the other: each takes `n + 1` turns of the script.
        let model = Arc::new(Timed::new(ScriptedModel::new((0..rounds).flat_map(|_| script(n)))));
        let runtime = Runtime::builder()
            .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(n + 1))
            .model_arc(Arc::clone(&model) as Arc<dyn Model>)
            .store_arc(store_arc)
            .max_journal_entries(2 * n as u64 + 8)
            .build()
            .expect("build the runtime");
        Self { runtime, model, sqlite }
    }
}

/// `rounds` runs of [`one_run`], one after the other, from one task on the runtime's workers,
/// as a service starts runs (from a request handler, or a worker's loop): each run's own task
/// and its result stay on that worker. From `block_on`'s thread (a `#[tokio::main]` body),
/// each run would add two cross-thread hand-offs, its start and its result: tens of
/// microseconds of waiting on an idle machine and a few of CPU, whatever the run's length.
fn in_task(
    rt: &tokio::runtime::Runtime,
    store: Store,
    n: usize,
    dir: &std::path::Path,
    rounds: usize,
) -> Vec<Measured> {
    let cell = Cell::new(store, n, rounds, dir);
    rt.block_on(async move {
        tokio::spawn(async move {
            let mut all = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                all.push(one_run(&cell).await);
            }
            all
        })
        .await
    })
    .expect("the bench task")
}

/// A run whose first model response asks for `n` calls, all finished, and whose second model
/// request failed; with `resume`, the time to resume it (every step replays, the run ends).
async fn replay(n: usize, resume: bool) -> Duration {
    let store: Arc<dyn RunStore> = Arc::new(MemoryStore::new());
    let build = |model: ScriptedModel| {
        Runtime::builder()
            .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(4))
            .model(model)
            .store_arc(Arc::clone(&store))
            .max_journal_entries(n as u64 + 8)
            .build()
            .expect("build the runtime")
    };
    let calls = (0..n).map(|i| (format!("call_{i}"), "inc".to_owned(), format!(r#"{{"x":{i}}}"#)));
    let first = build(ScriptedModel::new([Turn::tool_calls(calls), Turn::error("the process died here")]));
    first.run(kuralle::RunRequest::new("go").run_id("replay")).await.expect_err("the second request fails");
    if !resume {
        return Duration::ZERO;
    }
    let second = build(ScriptedModel::by_transcript([Turn::text("unused"), Turn::text("done")]));
    let start = Instant::now();
    let out = second.resume("replay").await.expect("the run resumes");
    assert_eq!(out.status, RunStatus::Finished);
    start.elapsed()
}

/// The median time of a 256-byte `write` + `fdatasync` in `dir`: the floor under any durable
/// commit on this disk.
fn fdatasync_median(dir: &std::path::Path) -> f64 {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("fdatasync.bin")).expect("create the fdatasync file");
    let mut samples: Vec<f64> = (0..200)
        .map(|_| {
            let start = Instant::now();
            file.write_all(&[7u8; 256]).expect("write");
            file.sync_data().expect("fdatasync");
            start.elapsed().as_secs_f64()
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("kuralle-bench-runtime-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    if let Some(at) = args.iter().position(|a| a == "--replay") {
        // For callgrind: `--replay N` builds a run left unfinished after one response of N
        // calls and resumes it; `--replay N build` stops before the resume, so the difference
        // between the two is what resuming costs.
        let n: usize = args.get(at + 1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
        let resume = args.get(at + 2).is_none_or(|a| a != "build");
        let elapsed = rt.block_on(replay(n, resume));
        println!("memory replay of {} steps: {:.1} ms", n + 2, elapsed.as_secs_f64() * 1e3);
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--only") {
        let store = match args.get(at + 1).map(String::as_str) {
            Some("sqlite") => Store::Sqlite,
            _ => Store::Memory,
        };
        let n: usize = args.get(at + 2).and_then(|s| s.parse().ok()).unwrap_or(1000);
        // `--only memory N K`: K runs one after the other (the last is reported), so callgrind
        // can tell a warm run's fixed cost from the process's start.
        let runs: usize = args.get(at + 3).and_then(|s| s.parse().ok()).unwrap_or(1);
        let m = in_task(&rt, store, n, &dir, runs).pop().expect("one run at least");
        println!(
            "{} N={n}: {:.1} us/turn, {:.1} us CPU/turn{}",
            store.name(),
            m.elapsed.as_secs_f64() * 1e6 / n as f64,
            m.cpu.as_secs_f64() * 1e6 / n as f64,
            m.commits.map(|c| format!(", {:.2} commits/turn", c as f64 / n as f64)).unwrap_or_default()
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // `cargo bench` passes `--bench`; any other argument filters by store name.
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();

    println!(
        "serial one-call turns, medians over runs [runs per cell]: a turn (first model request to last, per turn), \
         the whole run per turn, and the run's start and end (run record, lease; once per run)"
    );
    for store in [Store::Memory, Store::Sqlite] {
        if filter.as_deref().is_some_and(|f| !store.name().contains(f)) {
            continue;
        }
        let (mut per_turn, mut cpu_per_turn) = (Vec::new(), Vec::new());
        // Warm-up, discarded: the first cell measured would otherwise also pay for the
        // process's first runs (page faults as the heap grows, cold caches).
        drop(in_task(&rt, store, 10, &dir, if store == Store::Sqlite { 20 } else { 500 }));
        for n in [10usize, 100, 1000, 5000] {
            // About the same number of turns per cell, at least three runs; a SQLite turn is
            // a few fdatasyncs, so it gets a tenth as many.
            let turns = if store == Store::Sqlite { 2_000 } else { 20_000 };
            let rounds = (turns / n).clamp(3, 200);
            let runs = in_task(&rt, store, n, &dir, rounds);
            let commits = runs.last().and_then(|m| m.commits);
            let median_of = |f: &dyn Fn(&Measured) -> f64| {
                let mut v: Vec<f64> = runs.iter().map(f).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let turn = median_of(&|m| m.turns.as_secs_f64() / n as f64);
            let turn_cpu = median_of(&|m| m.turns_cpu.as_secs_f64() / n as f64);
            let whole = median_of(&|m| m.elapsed.as_secs_f64() / n as f64);
            let whole_cpu = median_of(&|m| m.cpu.as_secs_f64() / n as f64);
            let ends = median_of(&|m| (m.elapsed - m.turns).as_secs_f64());
            per_turn.push(turn);
            cpu_per_turn.push(turn_cpu);
            println!(
                "  {:<6} N={n:<5} turn {:>7.1} us, {:>7.1} us CPU | whole run {:>7.1} us/turn, {:>7.1} us CPU/turn | start+end {:>7.1} us  [{rounds}]{}",
                store.name(),
                turn * 1e6,
                turn_cpu * 1e6,
                whole * 1e6,
                whole_cpu * 1e6,
                ends * 1e6,
                commits.map(|c| format!("  {:.2} commits/turn", c as f64 / n as f64)).unwrap_or_default()
            );
        }
        let spread = |v: &[f64]| {
            let (lo, hi) = v.iter().fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            hi / lo
        };
        println!(
            "  {:<6} a turn at N=5000 / N=10: {:.2}x wall, {:.2}x CPU; largest / smallest over all N: {:.2}x wall, {:.2}x CPU",
            store.name(),
            per_turn[3] / per_turn[0],
            cpu_per_turn[3] / cpu_per_turn[0],
            spread(&per_turn),
            spread(&cpu_per_turn)
        );
        if store == Store::Memory {
            // For comparison: the same N = 10 runs started from `block_on`'s thread.
            let cell = Cell::new(store, 10, 200, &dir);
            let (mut wall, mut cpu): (Vec<f64>, Vec<f64>) = (0..200)
                .map(|_| {
                    let m = rt.block_on(one_run(&cell));
                    (m.elapsed.as_secs_f64() / 10.0, m.cpu.as_secs_f64() / 10.0)
                })
                .unzip();
            wall.sort_by(f64::total_cmp);
            cpu.sort_by(f64::total_cmp);
            println!(
                "  {:<6} N=10 started from block_on's thread (two cross-thread hand-offs per run): {:.1} us/turn {:.1} us CPU/turn",
                store.name(),
                wall[100] * 1e6,
                cpu[100] * 1e6
            );
        }
        if store == Store::Sqlite {
            let sync = fdatasync_median(&dir);
            // The steadiest turn: the smallest N carries the fewest turns per sample.
            let turn = per_turn[1..3].iter().copied().fold(f64::INFINITY, f64::min);
            println!(
                "  sqlite one-call turn {:.1} us / one fdatasync {:.1} us (same directory, this run) = {:.2}x",
                turn * 1e6,
                sync * 1e6,
                turn / sync
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
