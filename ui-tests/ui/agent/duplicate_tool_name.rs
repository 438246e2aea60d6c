/// Echo.
#[kuralle::tool]
async fn echo(text: String) -> String {
    text
}

/// Echo, louder.
#[kuralle::tool(name = "echo")]
async fn shout(text: String) -> String {
    text.to_uppercase()
}

/// You are a support agent.
#[kuralle::agent(id = "support", tools = [Echo, Shout])]
struct Support;

fn main() {}
