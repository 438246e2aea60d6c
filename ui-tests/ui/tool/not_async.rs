/// Echo.
#[kuralle::tool]
fn echo(text: String) -> String {
    text
}

fn main() {}
