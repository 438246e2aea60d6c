/// Echo.
#[kuralle::tool(timeout = "5s", replay = false, timeout = "10s")]
async fn echo(text: String) -> String {
    text
}

fn main() {}
