/// You are a support agent.
#[kuralle::agent(id = "support", tools = [], limits = 10)]
struct Support;

fn main() {}
