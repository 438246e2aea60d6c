/// Charge a card.
#[kuralle::tool(replay = false, at_most_once, idempotency_key = charge_key)]
async fn charge(order_id: String, cents: u64) -> u64 {
    let _ = order_id;
    cents
}

// Still compiles against the input struct: the error above is the only one.
fn charge_key(input: &ChargeInput) -> String {
    input.order_id.clone()
}

fn main() {}
