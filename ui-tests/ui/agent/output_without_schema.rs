#[derive(serde::Deserialize)]
struct Invoice {
    number: String,
}

/// Read the invoice.
#[kuralle::agent(id = "billing", output = Invoice)]
struct Billing;

fn main() {}
