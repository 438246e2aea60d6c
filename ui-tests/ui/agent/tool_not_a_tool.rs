struct NotATool;

/// You are a support agent.
#[kuralle::agent(id = "support", tools = [NotATool])]
struct Support;

fn main() {}
