//! Measures a restart: how long after a process is SIGKILLed in the middle of a run its
//! replacement (same `instance_id`, `runtime.recover()`) executes the run's next step. The
//! lease TTL is one hour, so the figure is the takeover with proof, not a lease expiry.
//!
//! ```text
//! cargo run --release -p kuralle-examples --example restart                      # SQLite (temp file)
//! cargo run --release -p kuralle-examples --example restart -- postgres://postgres@127.0.0.1:5432/test
//! cargo run --release -p kuralle-examples --example restart -- sqlite 20         # 20 rounds
//! ```
//!
//! Each round: a child process starts a run whose agent calls `step_one` (finished, journaled)
//! then `block`, which hangs; the parent SIGKILLs the child there, then starts a second child
//! with the same instance id that calls `recover()`. The figure is from the SIGKILL to the
//! moment the second child executes `block` again (the first step a restarted process runs;
//! `step_one` replays from the journal), as the parent sees its output line. PostgreSQL runs
//! use the schema `kuralle_restart_demo`, which is left in place.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kuralle::stores::{PostgresOptions, PostgresStore, SqliteStore};
use kuralle::testing::{ScriptedModel, Turn};
use kuralle::{AgentDef, RunRequest, RunStore, Runtime, tool};

/// The first step of the run.
#[tool]
async fn step_one() -> String {
    "one".to_owned()
}

/// The step the first process dies in.
#[tool]
async fn block() -> String {
    if std::env::var("RESTART_BLOCK").is_ok_and(|v| v == "1") {
        say("BLOCKED");
        std::future::pending::<()>().await;
    }
    say("STEP");
    "unblocked".to_owned()
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn open(spec: &str) -> Result<std::sync::Arc<dyn RunStore>, Box<dyn std::error::Error>> {
    Ok(if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        let options = PostgresOptions { schema: "kuralle_restart_demo".into(), ..Default::default() };
        std::sync::Arc::new(PostgresStore::connect_with(spec, options).await?)
    } else {
        std::sync::Arc::new(SqliteStore::open(spec)?)
    })
}

/// A child: `--child run|recover STORE INSTANCE RUN_ID`.
async fn child(mode: &str, spec: &str, instance: &str, run_id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let agent = AgentDef::new("app", "Do both steps.").tool(StepOne).tool(Block);
    let runtime = Runtime::builder()
        .agent(agent)
        .model(ScriptedModel::by_transcript([
            Turn::tool_calls([("call_1", "step_one", "{}")]),
            Turn::tool_calls([("call_2", "block", "{}")]),
            Turn::text("Done."),
        ]))
        .store_arc(open(spec).await?)
        .instance_id(instance)
        .lease_ttl(Duration::from_secs(3600))
        .build()?;
    if mode == "run" {
        runtime.run(RunRequest::new("Do it.").run_id(run_id)).await?;
    } else {
        let recovered = runtime.recover().await?;
        let ok = recovered.resumed.iter().filter(|r| r.result.is_ok()).count();
        say(&format!("RECOVERED {} {ok}", recovered.taken_back.len()));
    }
    Ok(())
}

/// Starts a child and waits for its line `want`; returns the child and when the line came.
fn spawn_until(args: &[&str], env: Option<(&str, &str)>, want: &str) -> (std::process::Child, Instant) {
    let exe = std::env::current_exe().expect("own path");
    let mut cmd = Command::new(exe);
    cmd.arg("--child").args(args).stdout(Stdio::piped()).stderr(Stdio::inherit()).env_remove("RESTART_BLOCK");
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let mut proc = cmd.spawn().expect("spawn child");
    let mut lines = BufReader::new(proc.stdout.take().expect("stdout")).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line == want => {
                let at = Instant::now();
                // Drain the rest in the background so the child never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines.by_ref() {});
                return (proc, at);
            }
            Some(Ok(_)) => {}
            _ => panic!("the child ended before printing {want}"),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let rt = tokio::runtime::Runtime::new()?;
        return rt.block_on(child(&args[1], &args[2], &args[3], &args[4]));
    }
    let target = args.first().cloned().unwrap_or_else(|| "sqlite".into());
    let rounds: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(10);
    let dir = std::env::temp_dir().join(format!("kuralle-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let spec = if target == "sqlite" { dir.join("runs.db").display().to_string() } else { target.clone() };
    let mut figures = Vec::new();
    for round in 0..rounds {
        let instance = format!("restart-{}-{round}", std::process::id());
        let run_id = format!("{instance}-run");
        let (mut first, _) = spawn_until(&["run", &spec, &instance, &run_id], Some(("RESTART_BLOCK", "1")), "BLOCKED");
        first.kill()?; // SIGKILL
        first.wait()?;
        let killed = Instant::now();
        let (mut second, stepped) = spawn_until(&["recover", &spec, &instance, &run_id], None, "STEP");
        second.wait()?;
        figures.push(stepped - killed);
    }
    let _ = std::fs::remove_dir_all(&dir);
    figures.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{}: restart -> first resumed step over {rounds} rounds (lease TTL 1 h): median {:.1} ms, min {:.1} ms, max {:.1} ms",
        if target == "sqlite" { "SQLite" } else { "PostgreSQL" },
        ms(figures[figures.len() / 2]),
        ms(figures[0]),
        ms(figures[figures.len() - 1]),
    );
    Ok(())
}
