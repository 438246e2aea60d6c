struct Service;

impl Service {
    /// Echo.
    #[kuralle::tool]
    async fn echo(&self, text: String) -> String {
        text
    }
}

fn main() {}
