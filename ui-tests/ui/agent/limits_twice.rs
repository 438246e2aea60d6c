/// You are a support agent.
#[kuralle::agent(id = "support", tools = [], limits = kuralle::RunLimits::new(), limits = kuralle::RunLimits::new())]
struct Support;

fn main() {}
