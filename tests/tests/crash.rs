//! Real crash tests: a child process (`src/bin/crash_child.rs`) runs a payment agent on a
//! `SqliteStore`; the test SIGKILLs it at each journal boundary of a call, restarts it on the
//! same run id, lets it finish, and checks the journal and the external effects.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use kuralle::{RunStore, StepStatus, stores::SqliteStore};
use serde_json::Value;

const BOUNDARIES: [&str; 5] = ["before_intent", "after_intent", "in_execute", "before_result", "after_result"];

fn child(dir: &Path, crash: Option<(&str, &str)>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_crash_child"));
    cmd.env("DB", dir.join("runs.db"))
        .env("EFFECTS", dir.join("effects.log"))
        .env("RUN_ID", "order-42")
        // A killed child's lease expires quickly, so the restarted one takes over soon.
        .env("LEASE_TTL_MS", "500")
        .env_remove("CRASH_AT")
        .env_remove("CRASH_TOOL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some((at, tool)) = crash {
        cmd.env("CRASH_AT", at).env("CRASH_TOOL", tool);
    }
    cmd
}

/// Runs the child to completion; returns its final JSON line.
fn run_to_end(dir: &Path) -> Value {
    let out = child(dir, None).output().expect("run child");
    assert!(out.status.success(), "child failed: {out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().expect("an output line")).expect("JSON output")
}

/// Starts the child, waits for `MARK <at>`, and SIGKILLs it there.
fn kill_at(dir: &Path, at: &str, tool: &str) {
    let mut proc = child(dir, Some((at, tool))).spawn().expect("spawn child");
    let stdout = proc.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("MARK ") {
                let _ = tx.send(line);
                return;
            }
        }
    });
    let mark = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("child never reached {at}"));
    assert_eq!(mark, format!("MARK {at}"));
    proc.kill().expect("SIGKILL"); // `Child::kill` is SIGKILL on Unix: no destructors, no flush
    proc.wait().unwrap();
}

/// External effects, as (tool, key) → executions.
fn effects(dir: &Path) -> HashMap<(String, String), usize> {
    let text = std::fs::read_to_string(dir.join("effects.log")).unwrap_or_default();
    let mut map = HashMap::new();
    for line in text.lines() {
        let mut parts = line.split('\t');
        let (tool, key) = (parts.next().unwrap().to_owned(), parts.next().unwrap().to_owned());
        *map.entry((tool, key)).or_insert(0) += 1;
    }
    map
}

async fn check_journal(dir: &Path) -> Vec<kuralle::StepRecord> {
    let store = SqliteStore::open(dir.join("runs.db")).unwrap();
    let steps = store.steps("order-42").await.unwrap();
    let ordinals: Vec<u64> = steps.iter().map(|s| s.ordinal).collect();
    assert_eq!(ordinals, (0..steps.len() as u64).collect::<Vec<_>>(), "journal ordinals are gap-free");
    assert!(steps.iter().all(|s| s.status != StepStatus::Running), "nothing left running: {steps:#?}");
    steps
}

#[tokio::test]
async fn killing_the_process_at_every_boundary_never_charges_twice() {
    let clean = tempfile::tempdir().unwrap();
    let baseline = run_to_end(clean.path());
    assert_eq!(baseline["status"], "finished");
    assert_eq!(baseline["text"], "Paid and shipped.");
    let base_effects = effects(clean.path());
    assert_eq!(base_effects.len(), 3);
    let base_steps = check_journal(clean.path()).await;

    for at in BOUNDARIES {
        let dir = tempfile::tempdir().unwrap();
        kill_at(dir.path(), at, "charge");
        let before = effects(dir.path());
        let out = run_to_end(dir.path());
        assert_eq!(out, baseline, "output after a crash {at} differs from a crash-free run");

        let after = effects(dir.path());
        // Exactly once after dedupe by idempotency key: the same keys as a crash-free run.
        let mut keys: Vec<_> = after.keys().cloned().collect();
        let mut base_keys: Vec<_> = base_effects.keys().cloned().collect();
        keys.sort();
        base_keys.sort();
        assert_eq!(keys, base_keys, "crash {at}: effects differ after dedupe");
        for (key, n) in &after {
            let had = before.get(key).copied().unwrap_or(0);
            match at {
                // The call ran but its result was not recorded: at-least-once, one retry.
                "in_execute" | "before_result" if had > 0 && key.0 == "charge" => {
                    assert!(*n <= 2, "{at}: {key:?} ran {n} times")
                }
                // A finished step is never re-executed.
                _ => assert_eq!(*n, 1, "crash {at}: {key:?} ran {n} times"),
            }
        }
        let steps = check_journal(dir.path()).await;
        assert_eq!(steps.len(), base_steps.len(), "crash {at}: no step missing or duplicated");
    }
}

#[tokio::test]
async fn an_at_most_once_tool_killed_mid_execution_is_not_rerun_and_is_indeterminate() {
    let dir = tempfile::tempdir().unwrap();
    kill_at(dir.path(), "in_execute", "ship");
    let out = run_to_end(dir.path());
    let ships = effects(dir.path()).into_iter().filter(|((tool, _), _)| tool == "ship").map(|(_, n)| n).sum::<usize>();
    assert_eq!(ships, 1, "the at-most-once tool must not run again");
    let ship = out["results"].as_array().unwrap().iter().find(|r| r[0] == "call_c").unwrap();
    assert_eq!(ship[2], true);
    assert_eq!(ship[1]["kind"], "indeterminate");
    assert_eq!(out["status"], "finished", "the model is told and the run goes on");
    check_journal(dir.path()).await;

    // Killed before its intent committed, it simply runs (once) after the restart.
    let dir = tempfile::tempdir().unwrap();
    kill_at(dir.path(), "before_intent", "ship");
    let out = run_to_end(dir.path());
    let ship = out["results"].as_array().unwrap().iter().find(|r| r[0] == "call_c").unwrap();
    assert_eq!(ship[1]["shipped"], 7);
    check_journal(dir.path()).await;
}
