//! Per-turn cost of a run as it grows: one run of N serial one-call turns (the model asks for
//! one tool call, gets its result, asks for the next), for N = 10, 100, 1,000 and 5,000, on
//! `MemoryStore` and `SqliteStore`. A turn must cost the same at N = 5,000 as at N = 10.
//!
//! `cargo bench -p kuralle --bench runtime` prints, per store and N, the median time per turn
//! over several runs, and on SQLite the durable commits per turn and the fastest N's turn next
//! to one `fdatasync` in the same directory, measured in the same run.
//!
//! `cargo bench -p kuralle --bench runtime -- --only memory 1000` runs one run once and
//! prints its figures, for `valgrind --tool=callgrind` (instructions per turn are
//! `(Ir(N=5000) - Ir(N=10)) / 4990`) or `/usr/bin/time -v` (peak RSS of 5,000 serial calls).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use kuralle::{
    AgentDef, RunStatus, RunStore, Runtime,
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
    elapsed: Duration,
    commits: Option<u64>,
}

/// One run of `n` serial one-call turns; only the run itself is timed.
async fn one_run(store: Store, n: usize, dir: &std::path::Path, round: usize) -> Measured {
    let sqlite = match store {
        Store::Memory => None,
        Store::Sqlite => {
            let path = dir.join(format!("runtime-{n}-{round}.db"));
            let _ = std::fs::remove_file(&path);
            Some(SqliteStore::open(&path).expect("open the bench database"))
        }
    };
    let store_arc: Arc<dyn RunStore> = match &sqlite {
        Some(s) => Arc::new(s.clone()),
        None => Arc::new(MemoryStore::new()),
    };
    let runtime = Runtime::builder()
        .agent(AgentDef::new("bench", "Count.").tool(Inc).max_steps(n + 1))
        .model(ScriptedModel::new(script(n)))
        .store_arc(store_arc)
        .max_steps_per_run(2 * n as u64 + 8)
        .build()
        .expect("build the runtime");
    let before = sqlite.as_ref().map(SqliteStore::commit_count);
    let start = Instant::now();
    let out = runtime.run("go").await.expect("the run finishes");
    let elapsed = start.elapsed();
    assert_eq!(out.status, RunStatus::Finished);
    let commits = sqlite.as_ref().zip(before).map(|(s, b)| s.commit_count() - b);
    Measured { elapsed, commits }
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
            .max_steps_per_run(n as u64 + 8)
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
        let m = rt.block_on(one_run(store, n, &dir, 0));
        println!(
            "{} N={n}: {:.1} us/turn{}",
            store.name(),
            m.elapsed.as_secs_f64() * 1e6 / n as f64,
            m.commits.map(|c| format!(", {:.2} commits/turn", c as f64 / n as f64)).unwrap_or_default()
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // `cargo bench` passes `--bench`; any other argument filters by store name.
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();

    println!("serial one-call turns: median time per turn (runs per cell in brackets)");
    for store in [Store::Memory, Store::Sqlite] {
        if filter.as_deref().is_some_and(|f| !store.name().contains(f)) {
            continue;
        }
        let mut per_turn = Vec::new();
        for n in [10usize, 100, 1000, 5000] {
            // About the same number of turns per cell, at least three runs; a SQLite turn is
            // a few fdatasyncs, so it gets a tenth as many.
            let turns = if store == Store::Sqlite { 2_000 } else { 20_000 };
            let rounds = (turns / n).clamp(3, 200);
            let mut samples = Vec::with_capacity(rounds);
            let mut commits = None;
            for round in 0..rounds {
                let m = rt.block_on(one_run(store, n, &dir, round));
                samples.push(m.elapsed.as_secs_f64() / n as f64);
                commits = m.commits;
            }
            samples.sort_by(f64::total_cmp);
            let median = samples[samples.len() / 2];
            per_turn.push(median);
            println!(
                "  {:<6} N={n:<5} {:>9.1} us/turn  [{rounds}]{}",
                store.name(),
                median * 1e6,
                commits.map(|c| format!("  {:.2} commits/turn", c as f64 / n as f64)).unwrap_or_default()
            );
        }
        println!("  {:<6} per-turn cost at N=5000 / N=10: {:.2}x", store.name(), per_turn[3] / per_turn[0]);
        if store == Store::Sqlite {
            let sync = fdatasync_median(&dir);
            let turn = per_turn[..3].iter().copied().fold(f64::INFINITY, f64::min);
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
