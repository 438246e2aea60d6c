//! Real crash tests: a child process (`src/bin/crash_child.rs`) runs a payment agent on a
//! `SqliteStore`; the test SIGKILLs it at each journal boundary of a call, restarts it on the
//! same run id, lets it finish, and checks the journal and the external effects. Then the
//! ownership cases with real processes: two processes resuming one run, a SIGSTOPped zombie
//! that wakes up after another process took its run over, and a soak of random SIGKILLs with
//! two resumers racing each time.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use kuralle::{RunStatus, RunStore, StepKind, StepStatus, stores::SqliteStore};
use kuralle_tests::lines_of;
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
    run_to_end_with(dir, &[])
}

/// [`run_to_end`] with extra environment for the child.
fn run_to_end_with(dir: &Path, env: &[(&str, &str)]) -> Value {
    let out = child(dir, None).envs(env.iter().copied()).output().expect("run child");
    assert!(out.status.success(), "child failed: {out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().expect("an output line")).expect("JSON output")
}

/// Starts the child, waits for `MARK <at>`, and SIGKILLs it there.
fn kill_at(dir: &Path, at: &str, tool: &str) {
    kill_at_with(dir, at, tool, &[]);
}

/// [`kill_at`] with extra environment for the child.
fn kill_at_with(dir: &Path, at: &str, tool: &str, env: &[(&str, &str)]) {
    let mut proc = child(dir, Some((at, tool))).envs(env.iter().copied()).spawn().expect("spawn child");
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

/// Run limits hold across a crash: a run allowed two model requests is SIGKILLed inside the
/// call its second response asked for; the restarted process replays both responses from the
/// journal and is refused the third request (used 2 of 2), where a fresh budget would let it
/// finish. With a cap of three the same crash finishes, so it is the spend that stops it.
#[tokio::test]
async fn a_run_killed_mid_turn_resumes_on_what_it_already_spent() {
    for (cap, finishes) in [("2", false), ("3", true)] {
        let dir = tempfile::tempdir().unwrap();
        let env = [("MAX_REQUESTS", cap)];
        kill_at_with(dir.path(), "in_execute", "ship", &env);
        let out = run_to_end_with(dir.path(), &env);
        let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
        let status = store.get_run("order-42").await.unwrap().unwrap().status;
        let requests = store.steps("order-42").await.unwrap().iter().filter(|s| s.kind == StepKind::Model).count();
        if finishes {
            assert_eq!(out["status"], "finished", "{out}");
            assert_eq!(requests, 3);
        } else {
            assert_eq!(out["error"], "limit_exceeded", "{out}");
            let message = out["message"].as_str().unwrap();
            assert!(message.contains("requests limit: used 2 of 2"), "{message}");
            assert_eq!(status, RunStatus::LimitExceeded);
            assert_eq!(requests, 2, "no request past the cap was sent");
        }
        check_journal(dir.path()).await;
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

/// One execution in the effect log.
#[derive(Debug, Clone)]
struct Effect {
    tool: String,
    key: String,
    pid: u32,
    /// The journal already held an outcome for this key when it executed.
    rerun: bool,
}

fn effect_rows(dir: &Path) -> Vec<Effect> {
    let text = std::fs::read_to_string(dir.join("effects.log")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let parts: Vec<&str> = line.split('\t').collect();
            Effect {
                tool: parts[0].to_owned(),
                key: parts[1].to_owned(),
                pid: parts[3].parse().unwrap(),
                rerun: parts[4] == "1",
            }
        })
        .collect()
}

fn executions_by_key(rows: &[Effect]) -> HashMap<String, usize> {
    let mut map = HashMap::new();
    for row in rows {
        *map.entry(row.key.clone()).or_insert(0) += 1;
    }
    map
}

/// A child on run `run_id` with extra environment.
fn child_with(dir: &Path, run_id: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = child(dir, None);
    cmd.env("RUN_ID", run_id).env_remove("MODE").env_remove("SLOW_MS").env_remove("ZOMBIE_MS");
    for (key, value) in env {
        cmd.env(key, value);
    }
    cmd
}

/// The child's last JSON line on stdout: its run's output. A lease renewal still running as
/// the child prints it can print its `WRITE renew_lease` line after it.
fn last_json(stdout: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stdout);
    let line =
        text.lines().rev().find(|l| !l.starts_with("WRITE ")).unwrap_or_else(|| panic!("no output line: {text}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

fn signal(proc: &Child, sig: &str) {
    // The shell's builtin `kill`: no dependency on a `kill` binary being installed.
    let status = Command::new("sh").arg("-c").arg(format!("kill {sig} {}", proc.id())).status().expect("sh runs");
    assert!(status.success(), "kill {sig} failed");
}

/// Leaves run `run_id` with its first charge in flight: a child with a short lease is
/// SIGKILLed inside the charge; returns once that lease has expired.
fn crash_in_first_charge(dir: &Path, run_id: &str) {
    // Short, so that the next process can take the run over soon after the kill; not shorter:
    // with 100 ms, a debug-build child on a busy machine (a full workspace run) once lost its
    // lease before it reached the charge.
    const TTL_MS: u64 = 500;
    let ttl = TTL_MS.to_string();
    let mut proc =
        child_with(dir, run_id, &[("CRASH_AT", "in_execute"), ("CRASH_TOOL", "charge"), ("LEASE_TTL_MS", &ttl)])
            .spawn()
            .expect("spawn child");
    let lines = lines_of(&mut proc);
    let mut printed = Vec::new();
    loop {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if line == "MARK in_execute" => break,
            Ok(line) => printed.push(line),
            Err(e) => {
                let exit = proc.try_wait();
                let _ = proc.kill();
                panic!("the child did not reach the charge ({e}, exit {exit:?}); it printed {printed:#?}")
            }
        }
    }
    proc.kill().unwrap();
    proc.wait().unwrap();
    std::thread::sleep(Duration::from_millis(TTL_MS + 100));
}

/// Two processes resume the same crashed run at once, 20 times: the in-flight charge is
/// executed again exactly once (by the winner), the loser ends with `Busy` before executing
/// anything, and every other call runs once.
#[tokio::test]
async fn two_processes_resuming_one_run_never_execute_anything_twice() {
    let dir = tempfile::tempdir().unwrap();
    for trial in 0..20 {
        let run_id = format!("race-{trial}");
        crash_in_first_charge(dir.path(), &run_id);
        let before = effect_rows(dir.path()).len();
        // Each charge takes a while, so the two overlap whatever their start-up order.
        let env = [("MODE", "resume"), ("SLOW_MS", "300"), ("LEASE_TTL_MS", "5000")];
        let racers: Vec<Child> =
            (0..2).map(|_| child_with(dir.path(), &run_id, &env).spawn().expect("spawn resumer")).collect();
        let outs: Vec<(u32, Value)> = racers
            .into_iter()
            .map(|proc| {
                let pid = proc.id();
                let out = proc.wait_with_output().unwrap();
                assert!(out.status.success(), "trial {trial}: resumer failed: {out:?}");
                (pid, last_json(&out.stdout))
            })
            .collect();
        let winners: Vec<&(u32, Value)> = outs.iter().filter(|(_, out)| out["status"] == "finished").collect();
        let losers: Vec<&(u32, Value)> = outs.iter().filter(|(_, out)| out["error"] == "busy").collect();
        assert_eq!((winners.len(), losers.len()), (1, 1), "trial {trial}: {outs:?}");
        assert_eq!(winners[0].1["text"], "Paid and shipped.");

        let rows = effect_rows(dir.path());
        let trial_rows: Vec<Effect> = rows[before - 1..].to_vec(); // from the crashed charge on
        assert!(trial_rows.iter().all(|row| row.pid != losers[0].0), "trial {trial}: the loser executed something");
        assert!(trial_rows.iter().all(|row| !row.rerun), "trial {trial}: a finished step ran again");
        let per_key = executions_by_key(&trial_rows);
        let crashed_key = &rows[before - 1].key;
        for (key, n) in &per_key {
            let expected = if key == crashed_key { 2 } else { 1 };
            assert_eq!(*n, expected, "trial {trial}: {key} ran {n} times: {trial_rows:#?}");
        }
        assert_eq!(per_key.len(), 3, "trial {trial}: two charges and a shipment");
    }
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    for trial in 0..20 {
        let run_id = format!("race-{trial}");
        let steps = store.steps(&run_id).await.unwrap();
        assert!(steps.iter().all(|s| s.status != StepStatus::Running), "{run_id}: {steps:#?}");
        assert_eq!(steps.len(), 6, "{run_id}: three model responses and three calls, once each");
    }
}

/// A child is SIGSTOPped inside a charge past its lease's TTL; another process takes the run
/// over and finishes it; then the zombie is SIGCONTed: every write it attempts is `Fenced`,
/// it ends with `LeaseLost`, executes nothing more, and the journal holds one outcome per step.
/// It may attempt no write at all (seen once in CI, on a loaded machine): when its renewals
/// lose the fence (the lease's local deadline passed) and the turn sees the interrupt before
/// the charge's sleep completes, the charge ends `Cancelled`, which is not journaled, and the
/// turn writes nothing more.
#[tokio::test]
async fn a_stopped_zombie_is_fenced_after_another_process_took_its_run_over() {
    let clean = tempfile::tempdir().unwrap();
    let baseline = run_to_end(clean.path());
    let base_steps = check_journal(clean.path()).await;

    let dir = tempfile::tempdir().unwrap();
    let zombie_env =
        [("CRASH_AT", "in_execute"), ("CRASH_TOOL", "charge"), ("ZOMBIE_MS", "1000"), ("LEASE_TTL_MS", "600")];
    let mut zombie = child_with(dir.path(), "order-42", &zombie_env).spawn().expect("spawn zombie");
    let lines = lines_of(&mut zombie);
    let next = |what: &str| loop {
        let line =
            lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("zombie never printed {what}"));
        if line.starts_with(what) {
            break;
        }
    };
    next("MARK in_execute");
    // Stop it just after a renewal committed, so it is stopped far from any SQLite
    // transaction (a process stopped inside one would hold the database's write lock).
    next("WRITE renew_lease ok");
    signal(&zombie, "-STOP");
    std::thread::sleep(Duration::from_millis(1_500)); // well past the 600 ms TTL

    let out = child_with(dir.path(), "order-42", &[("MODE", "resume")]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(last_json(&out.stdout), baseline, "the new owner finishes the run");
    let executions_before_wakeup = effect_rows(dir.path()).len();

    while lines.try_recv().is_ok() {} // everything the zombie said before it was stopped
    signal(&zombie, "-CONT");
    let status = zombie.wait().unwrap();
    assert!(status.success());
    let after: Vec<String> = lines.iter().collect();
    let result: Value = serde_json::from_str(after.last().expect("a result line")).unwrap();
    assert_eq!(result["error"], "lease_lost", "{after:#?}");
    let writes: Vec<&String> = after.iter().filter(|line| line.starts_with("WRITE ")).collect();
    assert!(writes.iter().all(|w| w.ends_with(" fenced")), "every zombie write is fenced: {writes:#?}");

    let rows = effect_rows(dir.path());
    assert_eq!(rows.len(), executions_before_wakeup, "the zombie executed nothing after waking up");
    assert_eq!(rows.iter().filter(|r| r.pid == zombie.id()).count(), 1, "only the charge it was stopped in");
    let steps = check_journal(dir.path()).await;
    assert_eq!(steps.len(), base_steps.len(), "one outcome per step, nothing duplicated");
}

/// A tiny xorshift generator: the soak's kill times, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// 200 SIGKILLs at random moments, each while two processes race to resume the same run
/// (short lease, so the survivor takes a killed holder's run over quickly): every run
/// finishes, no finished step is executed again, and the at-most-once tool never runs twice.
#[tokio::test]
async fn crash_soak_with_two_racing_resumers_per_kill() {
    const KILLS: usize = 200;
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    eprintln!("crash soak seed {seed} (set SOAK_SEED to replay)");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let env = [("MODE", "soak"), ("LEASE_TTL_MS", "150"), ("SLOW_MS", "10")];
    let mut runs = 0usize;
    let mut kills = 0usize;
    let mut finished: Vec<String> = Vec::new();
    while kills < KILLS {
        let run_id = format!("soak-{runs}");
        let mut pair: Vec<Child> = (0..2)
            .map(|_| child_with(dir.path(), &run_id, &env).stdout(Stdio::piped()).spawn().expect("spawn soak child"))
            .collect();
        std::thread::sleep(Duration::from_millis(rng.below(250)));
        // Usually one of the two dies and the other carries the run on; sometimes both die
        // and the next pair resumes the same run.
        let victims = if rng.below(3) == 0 { 2 } else { 1 };
        for _ in 0..victims {
            let mut victim = pair.remove(rng.below(pair.len() as u64) as usize);
            victim.kill().unwrap();
            victim.wait().unwrap();
            kills += 1;
        }
        let Some(survivor) = pair.pop() else { continue };
        let mut survivor = survivor.wait_with_output().unwrap();
        // On a loaded machine a survivor can stall past the short lease (another process then
        // owns the run, and this one ends `lease_lost`) or give up waiting for SQLite's lock.
        // Neither loses anything: a fresh process carries the run on, and the invariants
        // below still judge every execution.
        for retry in 0.. {
            let out = survivor.status.success().then(|| last_json(&survivor.stdout));
            if out.as_ref().is_some_and(|out| out["status"] == "finished") {
                break;
            }
            assert!(retry < 5, "the run never finished: {survivor:?}");
            eprintln!("soak: {run_id} did not finish in its survivor ({out:?}); resuming it again");
            survivor = child_with(dir.path(), &run_id, &env).stdout(Stdio::piped()).output().unwrap();
        }
        let out = last_json(&survivor.stdout);
        assert_eq!(out["text"], "Paid and shipped.");
        finished.push(run_id);
        runs += 1;
    }
    // The last kills may have left a run unfinished: a last process finishes it.
    let pending = format!("soak-{runs}");
    if SqliteStore::open(dir.path().join("runs.db")).unwrap().get_run(&pending).await.unwrap().is_some() {
        let out = child_with(dir.path(), &pending, &env).output().unwrap();
        assert_eq!(last_json(&out.stdout)["status"], "finished", "{out:?}");
        finished.push(pending);
    }
    let runs = finished.len() - 1;
    eprintln!("crash soak: {kills} kills over {} runs", runs + 1);

    let rows = effect_rows(dir.path());
    let reruns: Vec<&Effect> = rows.iter().filter(|row| row.rerun).collect();
    assert!(reruns.is_empty(), "finished steps executed again: {reruns:#?}");
    let ships = executions_by_key(&rows.iter().filter(|row| row.tool == "ship").cloned().collect::<Vec<_>>());
    assert!(ships.values().all(|&n| n == 1), "an at-most-once call ran more than once: {ships:?}");

    // A child killed while it held a finished run's lease (it was only reading) leaves that
    // lease to expire.
    std::thread::sleep(Duration::from_millis(300));
    let store = SqliteStore::open(dir.path().join("runs.db")).unwrap();
    for run in 0..=runs {
        let run_id = format!("soak-{run}");
        let record = store.get_run(&run_id).await.unwrap().unwrap_or_else(|| panic!("{run_id} exists"));
        assert_eq!(record.status, RunStatus::Finished, "{run_id} finished");
        let steps = store.steps(&run_id).await.unwrap();
        let ordinals: Vec<u64> = steps.iter().map(|s| s.ordinal).collect();
        assert_eq!(ordinals, (0..steps.len() as u64).collect::<Vec<_>>(), "{run_id}: gap-free");
        assert!(steps.iter().all(|s| s.status != StepStatus::Running), "{run_id}: {steps:#?}");
        let tools = steps.iter().filter(|s| s.kind == StepKind::Tool).count();
        assert_eq!(tools, 6, "{run_id}: every call journaled once");
        assert_eq!(store.current_lease(&run_id).await.unwrap(), None, "{run_id}: no owner left");
    }
}
