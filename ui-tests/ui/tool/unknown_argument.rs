/// Echo.
#[kuralle::tool(parallel_safe, descripton = "Echo back the text.")]
async fn echo(text: String) -> String {
    text
}

fn main() {}
