#[kuralle::agent(id = "support", tools = [])]
struct Support;

fn main() {}
