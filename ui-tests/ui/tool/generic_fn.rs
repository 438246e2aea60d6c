/// Echo.
#[kuralle::tool]
async fn echo<T: ToString>(text: String) -> String {
    text
}

fn main() {}
