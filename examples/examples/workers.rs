//! Workers: any number of processes share one store; `submit` queues runs, `serve` drives
//! them. Kill a worker (Ctrl-C twice, or `kill -9`) mid-run: another worker picks its runs up
//! once their lease expires and resumes them from the journal.
//!
//! ```text
//! # PostgreSQL (workers on many machines):
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
//! cargo run -p kuralle-examples --example workers -- worker          # terminal 1 (and 2, 3, …)
//! cargo run -p kuralle-examples --example workers -- submit 5        # terminal 4: prints results
//!
//! # SQLite (several processes on one machine): name the file instead
//! cargo run -p kuralle-examples --example workers -- worker --store sqlite:/tmp/kuralle-workers.db
//! cargo run -p kuralle-examples --example workers -- submit 5 --store sqlite:/tmp/kuralle-workers.db
//! ```
//!
//! The store is `--store postgres://…` or `--store sqlite:PATH`; without `--store`,
//! `DATABASE_URL` if set, else `sqlite:kuralle-workers.db` in the temp directory.

use std::{error::Error, sync::Arc, time::Duration};

use kuralle::{
    RunRequest, RunStatus, RunStore, Runtime, ToolContext, WorkerOptions, agent,
    stores::{PostgresStore, SqliteStore},
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::{Value, json};

/// Charge the customer's card (slow, like a real provider).
#[tool]
async fn charge_card(
    /// Amount in cents.
    amount: u64,
    ctx: &ToolContext,
) -> Value {
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A real provider call passes the key, so a call re-run after a crash is not charged twice.
    println!(
        "  [{}] charged {amount} cents for {} (key {}…)",
        std::process::id(),
        ctx.run_id(),
        &ctx.idempotency_key()[..12]
    );
    json!({"status": "charged", "amount": amount, "by_pid": std::process::id()})
}

/// Take the payment, then confirm.
#[agent(id = "checkout", tools = [ChargeCard])]
struct Checkout;

async fn open_store(spec: &str) -> Result<Arc<dyn RunStore>, Box<dyn Error>> {
    Ok(match spec.strip_prefix("sqlite:") {
        Some(path) => Arc::new(SqliteStore::open(path)?),
        None => Arc::new(PostgresStore::connect(spec).await?),
    })
}

fn runtime(store: Arc<dyn RunStore>) -> Result<Runtime, Box<dyn Error>> {
    // Offline: a scripted model that answers from the transcript, so any worker resuming a run
    // sees the same conversation.
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("call_1", "charge_card", r#"{"amount":4999}"#)]),
        Turn::text("Paid 49.99."),
    ]);
    // A short lease: a killed worker's runs move to another worker within 5 s.
    Ok(Runtime::builder().agent(Checkout).model(model).store_arc(store).lease_ttl(Duration::from_secs(5)).build()?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let store_spec = match args.iter().position(|a| a == "--store") {
        Some(i) => args.get(i + 1).cloned().ok_or("--store needs a value")?,
        None => std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| format!("sqlite:{}", std::env::temp_dir().join("kuralle-workers.db").display())),
    };
    let runtime = runtime(open_store(&store_spec).await?)?;
    match args.first().map(String::as_str) {
        Some("worker") => {
            println!(
                "worker {} serving {store_spec}; Ctrl-C stops it (after in-flight runs finish)",
                std::process::id()
            );
            let options = WorkerOptions { poll_interval: Duration::from_millis(200), ..WorkerOptions::default() };
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
                println!("stopping: finishing in-flight runs (Ctrl-C again to kill)");
                tokio::spawn(async {
                    let _ = tokio::signal::ctrl_c().await;
                    std::process::exit(130);
                });
            };
            let report = runtime.serve_with(shutdown, options).await?;
            println!("worker {} done: {report:?}", std::process::id());
        }
        Some("submit") => {
            let count: usize = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(3);
            let mut ids = Vec::new();
            for i in 0..count {
                let id = runtime.submit(RunRequest::new(format!("Check out order {i}"))).await?;
                println!("submitted {id}");
                ids.push(id);
            }
            println!("waiting for workers (start one with `-- worker`)…");
            for id in ids {
                let run = loop {
                    let run = runtime.get_run(&id).await?.ok_or("the run vanished")?;
                    if run.status != RunStatus::Running {
                        break run;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                let charged_by = runtime
                    .journal(&id)
                    .await?
                    .into_iter()
                    .find(|s| s.name == "charge_card")
                    .and_then(|s| s.result)
                    .map(|r| r.to_value()["by_pid"].clone())
                    .unwrap_or(Value::Null);
                // Resuming a run whose turn ended returns its last output and runs nothing.
                let output = runtime.resume(&id).await?;
                println!("{id}: {} — {:?} (charged by worker {charged_by})", run.status.as_str(), output.text);
            }
        }
        _ => {
            eprintln!("usage: workers (worker | submit [N]) [--store postgres://…|sqlite:PATH]");
            std::process::exit(2);
        }
    }
    Ok(())
}
