#[derive(Debug)]
struct LookupFailed;

/// Look an order up.
#[kuralle::tool]
async fn lookup(order_id: String) -> Result<String, LookupFailed> {
    if order_id.is_empty() { Err(LookupFailed) } else { Ok(order_id) }
}

fn main() {}
