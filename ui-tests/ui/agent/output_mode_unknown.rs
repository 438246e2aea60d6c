#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Invoice {
    number: String,
}

/// Read the invoice.
#[kuralle::agent(id = "billing", output = Invoice, output_mode = "json")]
struct Billing;

fn main() {}
