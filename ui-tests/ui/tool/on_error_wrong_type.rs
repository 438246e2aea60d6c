#[derive(Debug)]
struct LookupError;

impl std::fmt::Display for LookupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("lookup failed")
    }
}

fn recover(error: LookupError) -> Result<String, LookupError> {
    Err(error)
}

/// Look an order up.
#[kuralle::tool(on_error = recover)]
async fn lookup(order_id: String) -> Result<String, LookupError> {
    Ok(order_id)
}

fn main() {}
