/// Charge a card.
#[kuralle::tool(at_most_once, timeout = "5s", replay = false)]
async fn charge(cents: u64) -> u64 {
    cents
}

fn main() {}
