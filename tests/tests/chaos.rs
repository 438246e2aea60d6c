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
    collections::{HashMap, HashSet},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kuralle::{RunStatus, RunStore, StepKind, StepStatus, stores::SqliteStore};

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
    let mut by_key: HashMap<&str, Vec<&Effect>> = HashMap::new();
    let mut keys_of_call: HashMap<(&str, &str), HashSet<&str>> = HashMap::new();
    for e in &effects {
        by_key.entry(&e.key).or_default().push(e);
        keys_of_call.entry((&e.run, &e.label)).or_default().insert(&e.key);
    }
    for ((run, label), keys) in &keys_of_call {
        assert_eq!(keys.len(), 1, "{run}/{label} ran under different keys: {keys:?}");
    }

    let (mut reran, mut indeterminate) = (0usize, 0usize);
    for i in 0..runs {
        let run_id = format!("run-{i}");
        let record = store.get_run(&run_id).await.unwrap().unwrap_or_else(|| panic!("{run_id} was lost"));
        assert_eq!(record.status, RunStatus::Finished, "{run_id}");
        let steps = store.steps(&run_id).await.unwrap();
        let ordinals: Vec<u64> = steps.iter().map(|s| s.ordinal).collect();
        assert_eq!(ordinals, (0..steps.len() as u64).collect::<Vec<_>>(), "{run_id}: the journal has gaps");
        assert!(steps.iter().all(|s| s.status != StepStatus::Running), "{run_id}: a step was left running");

        let denied = i.is_multiple_of(3);
        let tools: Vec<_> = steps.iter().filter(|s| s.kind == StepKind::Tool).collect();
        assert_eq!(tools.len(), if denied { 9 } else { 10 }, "{run_id}: tool steps {tools:#?}");
        for step in tools {
            let runs_of = by_key.get(step.key.as_str()).map_or(&[][..], Vec::as_slice);
            let finished_at = step.finished_at_ms.expect("a closed step has a finish time");
            // Nothing lost: a finished step's call ran. An `at_most_once` call cut off before
            // its first line was written may have been recorded indeterminate without running.
            if step.status == StepStatus::Finished {
                assert!(!runs_of.is_empty(), "{run_id}: step {} finished but never ran", step.ordinal);
            } else {
                assert_eq!(step.name, "ship", "{run_id}: only at-most-once calls may fail: {step:?}");
                assert_eq!(step.error.as_ref().unwrap().to_value()["kind"], "indeterminate");
                indeterminate += 1;
            }
            // No finished step ran again.
            for e in runs_of {
                assert!(e.at_ms <= finished_at, "{run_id}: {} ran after its step finished", e.label);
            }
            if step.name == "ship" {
                assert!(runs_of.len() <= 1, "{run_id}: an at-most-once call ran {} times", runs_of.len());
            }
            reran += runs_of.len().saturating_sub(1);
        }
        if denied {
            assert!(!effects.iter().any(|e| e.run == run_id && e.tool == "refund"), "{run_id}: a denied call ran");
        }
    }
    println!(
        "chaos: {runs} runs, {starts} starts, {kills} SIGKILLs, {} executions, {reran} re-runs of interrupted \
         calls, {indeterminate} indeterminate at-most-once calls, {:.1?}",
        effects.len(),
        started.elapsed()
    );
    assert!(kills > 0, "the soak never killed the child");
}
