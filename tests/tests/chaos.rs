//! The chaos soak: a child process (`src/bin/chaos_child.rs`) drives a few hundred runs on one
//! `SqliteStore`, mixing parallel, serial, `at_most_once`, approval and progress tools, while
//! this test SIGKILLs it at random moments and starts it again. At the end every run must have
//! finished, every journal must be gap-free with nothing left running, no finished step may
//! have run again, repeated executions of a call must carry the same key, and no
//! `at_most_once` call may have run twice.
//!
//! Bounded: `CHAOS_RUNS` runs (default 300) with kills for `CHAOS_KILL_SECS` seconds (default
//! 30), then one last start without kills to finish.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kuralle::{StepKind, StepStatus, stores::SqliteStore};
use kuralle_tests::invariants::{Execution, Invariants, Journals, Mark};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn child(dir: &Path, runs: u64, seed: u64) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chaos_child"));
    cmd.env("DB", dir.join("runs.db"))
        .env("EFFECTS", dir.join("effects.log"))
        .env("RUNS", runs.to_string())
        .env("SEED", seed.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

/// One line of the effect log.
struct Effect {
    tool: String,
    run: String,
    label: String,
    key: String,
    at_ms: i64,
}

fn effects(dir: &Path) -> Vec<Effect> {
    let text = std::fs::read_to_string(dir.join("effects.log")).unwrap_or_default();
    text.lines()
        // A kill can cut the last line short; a cut line never reached its fsync.
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() != 5 {
                return None;
            }
            Some(Effect {
                tool: f[0].into(),
                run: f[1].into(),
                label: f[2].into(),
                key: f[3].into(),
                at_ms: f[4].parse().ok()?,
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_over_hundreds_of_mixed_runs_lose_and_double_nothing() {
    let runs = env_or("CHAOS_RUNS", 300);
    let kill_for = Duration::from_secs(env_or("CHAOS_KILL_SECS", 30));
    let dir = tempfile::tempdir().unwrap();
    fastrand::seed(env_or("CHAOS_SEED", 16));

    let started = Instant::now();
    let mut kills = 0u32;
    let mut starts = 0u64;
    loop {
        starts += 1;
        let mut proc = child(dir.path(), runs, starts).spawn().expect("spawn chaos_child");
        if started.elapsed() < kill_for {
            std::thread::sleep(Duration::from_millis(fastrand::u64(10..250)));
            if proc.try_wait().unwrap().is_none() {
                proc.kill().expect("SIGKILL"); // `Child::kill` is SIGKILL on Unix
                proc.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let status = proc.wait().unwrap();
        assert!(status.success(), "the last start failed: {status}");
        break;
    }

    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    let effects = effects(dir.path());
    let executions: Vec<Execution> = effects
        .iter()
        .enumerate()
        .map(|(i, e)| Execution {
            run_id: e.run.clone(),
            tool: e.tool.clone(),
            call: e.label.clone(),
            key: e.key.clone(),
            // The log holds starts only: a killed child never wrote an end.
            start: Mark { seq: i as u64, at_ms: e.at_ms },
            end: None,
        })
        .collect();
    let journals = Journals::load(&store, (0..runs).map(|i| format!("run-{i}"))).await.unwrap();
    let report = Invariants::new().at_most_once("ship").check(&journals, &executions);
    report.assert_holds();

    // What this script adds to the general invariants: the calls each run makes, and which
    // may fail.
    let mut indeterminate = 0usize;
    for (run_id, entry) in &journals.runs {
        let (_, steps) = entry.as_ref().expect("no run lost");
        let n: u64 = run_id.trim_start_matches("run-").parse().unwrap();
        let denied = n.is_multiple_of(3);
        let tools: Vec<_> = steps.iter().filter(|s| s.kind == StepKind::Tool).collect();
        assert_eq!(tools.len(), if denied { 9 } else { 10 }, "{run_id}: tool steps {tools:#?}");
        for step in tools.iter().filter(|s| s.status != StepStatus::Finished) {
            // An `at_most_once` call cut off before its first line was written may have been
            // recorded indeterminate without running; nothing else may fail.
            assert_eq!(step.name, "ship", "{run_id}: only at-most-once calls may fail: {step:?}");
            assert_eq!(step.error.as_ref().unwrap().to_value()["kind"], "indeterminate");
            indeterminate += 1;
        }
        if denied {
            assert!(!effects.iter().any(|e| &e.run == run_id && e.tool == "refund"), "{run_id}: a denied call ran");
        }
    }
    println!(
        "chaos: {runs} runs, {starts} starts, {kills} SIGKILLs, {} executions, {} re-runs of interrupted \
         calls, {indeterminate} indeterminate at-most-once calls, {:.1?}; {report}",
        report.executions,
        report.reexecutions,
        started.elapsed()
    );
    assert!(kills > 0, "the soak never killed the child");
}
