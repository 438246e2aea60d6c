#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Invoice {
    number: String,
}

/// Read the invoice.
#[kuralle::agent(id = "billing", output = Invoice, output_retries = "two")]
struct Billing;

fn main() {}
