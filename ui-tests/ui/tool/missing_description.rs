#[kuralle::tool]
async fn echo(text: String) -> String {
    text
}

fn main() {}
