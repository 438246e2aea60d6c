//! Tool flags and error mapping: panicking predicates, idempotency keys, `Err` → `Failed`,
//! `on_error` recovery (not when the call is cancelled), invalid output.

use kuralle::{Tool, ToolContext, ToolError, tool};
use tokio_util::sync::CancellationToken;

/// Why a charge failed.
#[derive(Debug)]
pub struct ChargeError(String);

impl std::fmt::Display for ChargeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "card declined: {}", self.0)
    }
}

fn recover(error: ChargeError, input: &ChargeInput) -> Result<String, ChargeError> {
    if input.amount < 10 { Ok(format!("waived {}", input.amount)) } else { Err(error) }
}

/// Charge a card.
#[tool(
    parallel_safe = |args: &serde_json::Value| args["amount"].as_u64().unwrap() < 100,
    idempotency_key = |input: &ChargeInput| format!("{}:{}", input.order_id, input.amount),
    on_error = recover
)]
async fn charge(order_id: String, amount: u64) -> Result<String, ChargeError> {
    Err(ChargeError(format!("{order_id}/{amount}")))
}

/// Always fails.
#[tool]
async fn fail(reason: String) -> Result<u8, ChargeError> {
    Err(ChargeError(reason))
}

/// Returns a map with non-string keys, which JSON cannot represent.
#[tool]
async fn bad_output() -> std::collections::HashMap<Vec<u8>, u8> {
    std::collections::HashMap::from([(vec![1], 1)])
}

#[test]
fn a_panicking_predicate_is_not_parallel_safe() {
    assert!(Charge.parallel_safe(&serde_json::json!({"amount": 5})));
    assert!(!Charge.parallel_safe(&serde_json::json!({"amount": 500})));
    // `unwrap()` on a missing amount panics: fail closed.
    assert!(!Charge.parallel_safe(&serde_json::json!({})));
    assert!(!Fail.parallel_safe(&serde_json::json!({})), "not parallel-safe by default");
}

#[test]
fn idempotency_key_comes_from_the_validated_input() {
    let call = Charge.prepare(&serde_json::json!({"order_id": "o-7", "amount": 3})).unwrap();
    assert_eq!(call.idempotency_key().as_deref(), Some("o-7:3"));
    let call = Fail.prepare(&serde_json::json!({"reason": "x"})).unwrap();
    assert_eq!(call.idempotency_key(), None);
}

#[tokio::test]
async fn err_maps_to_failed_with_the_display_text() {
    let out = Fail.call(serde_json::json!({"reason": "no funds"}), ToolContext::detached()).await;
    assert_eq!(out, Err(ToolError::failed("fail", "card declined: no funds")));
}

#[tokio::test]
async fn on_error_recovers_or_passes_the_error_on() {
    let out = Charge.call(serde_json::json!({"order_id": "o", "amount": 3}), ToolContext::detached()).await;
    assert_eq!(out, Ok(serde_json::json!("waived 3")));
    let out = Charge.call(serde_json::json!({"order_id": "o", "amount": 50}), ToolContext::detached()).await;
    assert_eq!(out, Err(ToolError::failed("charge", "card declined: o/50")));
}

#[tokio::test]
async fn on_error_is_not_called_when_the_call_is_cancelled() {
    let token = CancellationToken::new();
    token.cancel();
    let ctx = ToolContext::new("run", "call", "key", token);
    let out = Charge.call(serde_json::json!({"order_id": "o", "amount": 3}), ctx).await;
    assert_eq!(out, Err(ToolError::failed("charge", "card declined: o/3")));
}

#[tokio::test]
async fn unserializable_output_is_invalid_output() {
    let out = BadOutput.call(serde_json::json!({}), ToolContext::detached()).await;
    assert!(matches!(out, Err(ToolError::InvalidOutput { ref tool, .. }) if tool == "bad_output"), "{out:?}");
}
