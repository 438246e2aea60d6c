/// You are a support agent.
#[kuralle::agent(id = "Support Desk", tools = [])]
struct Support;

fn main() {}
