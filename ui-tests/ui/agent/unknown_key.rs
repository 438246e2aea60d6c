/// You are a support agent.
#[kuralle::agent(id = "support", tools = [], max_step = 8)]
struct Support;

fn main() {}
