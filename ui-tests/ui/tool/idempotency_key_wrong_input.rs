/// Charge a card.
#[kuralle::tool(idempotency_key = |input: &String| input.clone())]
async fn charge(order_id: String, amount: u64) -> String {
    format!("{order_id}: {amount}")
}

fn main() {}
