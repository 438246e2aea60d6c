/// Read the invoice.
#[kuralle::agent(id = "billing", output_mode = "native")]
struct Billing;

fn main() {}
