//! A fallible tool with the context and the durability arguments.

/// Charge a card once.
#[tool(timeout = "5s", at_most_once, idempotency_key = |input: &ChargeInput| input.order_id.clone(), on_error = recover)]
pub async fn charge(order_id: String, cents: u64, ctx: &ToolContext) -> Result<Receipt, PaymentError> {
    payments::charge(&order_id, cents, ctx.idempotency_key()).await
}
