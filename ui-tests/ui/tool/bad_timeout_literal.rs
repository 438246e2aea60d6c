/// Echo.
#[kuralle::tool(timeout = "5 seconds")]
async fn echo(text: String) -> String {
    text
}

fn main() {}
