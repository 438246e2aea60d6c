//! A payment that survives a crash: the run charges a card, then the process dies before the
//! run finishes. The second command resumes the same run from the SQLite journal: the charge is
//! replayed from the journal, not executed again, so the card is charged once.
//!
//! ```text
//! KURALLE_CRASH=1 cargo run -p kuralle-examples --example durable_payment   # aborts mid-run
//! cargo run -p kuralle-examples --example durable_payment                   # resumes it
//! ```

use std::{error::Error, io::Write, path::PathBuf, time::Duration};

use futures::StreamExt;
use kuralle::{
    Event, RunRequest, RunStatus, Runtime, ToolContext, agent,
    stores::SqliteStore,
    testing::{ScriptedModel, Turn},
    tool,
};
use serde_json::{Value, json};

const RUN_ID: &str = "order-1001";

fn dir() -> PathBuf {
    std::env::temp_dir().join("kuralle-durable-payment")
}

/// The payment provider's ledger: one line per charge it received.
fn ledger() -> PathBuf {
    dir().join("charges.log")
}

/// Charge the customer's card.
#[tool]
async fn charge_card(
    /// Amount in cents.
    amount: u64,
    ctx: &ToolContext,
) -> Value {
    // A real provider call would pass `ctx.idempotency_key()` as its idempotency key.
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(ledger()).expect("ledger");
    writeln!(f, "{}\t{amount}", ctx.idempotency_key()).expect("write ledger");
    f.sync_data().expect("sync ledger");
    println!("  [provider] charged {amount} cents (idempotency key {}…)", &ctx.idempotency_key()[..12]);
    json!({"status": "charged", "amount": amount})
}

/// Email the receipt.
#[tool]
async fn send_receipt(
    /// Recipient address.
    to: String,
) -> Value {
    if std::env::var_os("KURALLE_CRASH").is_some() {
        println!("  [crash] the process dies before the run finishes (KURALLE_CRASH is set)");
        std::process::abort();
    }
    println!("  [mail] receipt sent to {to}");
    json!({"sent": true})
}

/// Take the payment, then send the receipt.
#[agent(id = "checkout", tools = [ChargeCard, SendReceipt])]
struct Checkout;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    std::fs::create_dir_all(dir())?;
    let store = SqliteStore::open(dir().join("runs.db"))?;
    let existing = kuralle::RunStore::get_run(&store, RUN_ID).await?;
    let crash = std::env::var_os("KURALLE_CRASH").is_some();
    match &existing {
        Some(run) if run.status == RunStatus::Running && !crash => {
            println!("Resuming run {RUN_ID}, which did not finish (its process died).");
        }
        _ => {
            // A fresh demo: forget the previous run and the provider's ledger.
            kuralle::RunStore::delete_run(&store, RUN_ID).await?;
            let _ = std::fs::remove_file(ledger());
            println!("Starting run {RUN_ID}.");
        }
    }

    // The scripted model answers from the transcript, so a resumed process sees the same
    // conversation; its earlier responses replay from the journal.
    let model = ScriptedModel::by_transcript([
        Turn::tool_calls([("call_1", "charge_card", r#"{"amount":4999}"#)]),
        Turn::tool_calls([("call_2", "send_receipt", r#"{"to":"ada@example.com"}"#)]),
        Turn::text("Paid 49.99 and sent the receipt."),
    ]);
    // The crashed process still holds the run's lease until it expires: a short lease (and
    // waiting for it) lets this process take the run over within a few seconds.
    let runtime =
        Runtime::builder().agent(Checkout).model(model).store(store).lease_ttl(Duration::from_secs(3)).build()?;
    let request = RunRequest::new("Check out order 1001").run_id(RUN_ID).wait_for_lease(Duration::from_secs(10));
    let mut handle = runtime.run(request);
    while let Some(event) = handle.next().await {
        match event {
            Event::ToolResult { name, replayed: true, .. } => {
                println!("  [journal] {name}: replayed the recorded result; the tool did not run again");
            }
            Event::TextDelta { delta } => print!("{delta}"),
            _ => {}
        }
    }
    let output = handle.await?;
    println!();
    let charges = std::fs::read_to_string(ledger()).unwrap_or_default().lines().count();
    println!("Run {} is {}; the card was charged {charges} time(s).", output.run_id, output.status.as_str());
    Ok(())
}
