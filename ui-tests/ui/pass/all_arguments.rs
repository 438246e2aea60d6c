use std::time::Duration;

use kuralle::{Tool, ToolContext};

/// Why a charge failed.
#[derive(Debug)]
pub struct ChargeError(String);

impl std::fmt::Display for ChargeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn recover(error: ChargeError, input: &ChargeCardInput) -> Result<String, ChargeError> {
    if input.amount == 0 { Ok("nothing to charge".into()) } else { Err(error) }
}

fn charge_key(input: &ChargeCardInput) -> String {
    format!("charge:{}", input.order_id)
}

/// Charge a card.
#[kuralle::tool(
    name = "charge",
    description = "Charge the customer's card.",
    parallel_safe = |args: &serde_json::Value| args["amount"].as_u64().is_some_and(|a| a < 100),
    idempotency_key = charge_key,
    timeout = "1500ms",
    interruptible = false,
    needs_approval,
    at_most_once,
    on_error = recover
)]
async fn charge_card(order_id: String, amount: u64) -> Result<String, ChargeError> {
    let _ = order_id;
    if amount == 0 { Err(ChargeError("zero".into())) } else { Ok(format!("charged {amount}")) }
}

/// Read the clock. (`replay = false` is the one argument `charge_card` cannot take: it
/// excludes `at_most_once`.)
#[kuralle::tool(replay = false)]
async fn clock() -> u64 {
    7
}

fn main() {
    assert!(!Clock.replay());
    let tool = ChargeCard;
    assert_eq!(tool.name(), "charge");
    assert_eq!(tool.description(), "Charge the customer's card.");
    assert!(tool.parallel_safe(&serde_json::json!({"amount": 5})));
    assert!(!tool.parallel_safe(&serde_json::json!({"amount": 500})));
    assert_eq!(tool.timeout(), Some(Duration::from_millis(1500)));
    assert!(!tool.interruptible());
    assert!(tool.replay());
    assert!(tool.needs_approval());
    assert!(tool.at_most_once());
    let call = tool.prepare(&serde_json::json!({"order_id": "o-1", "amount": 0})).unwrap();
    assert_eq!(call.idempotency_key().as_deref(), Some("charge:o-1"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(tool.call(serde_json::json!({"order_id": "o-1", "amount": 0}), ToolContext::detached()));
    assert_eq!(out, Ok(serde_json::json!("nothing to charge")));
}
