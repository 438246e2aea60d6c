mod tools {
    /// Echo back the text.
    #[kuralle::tool]
    pub(crate) async fn echo(text: String) -> String {
        text
    }
}

fn main() {
    let set = kuralle::ToolSet::new().with(tools::Echo);
    assert_eq!(set.specs()[0].name, "echo");
    let input = tools::EchoInput { text: "direct".into() };
    assert_eq!(input.text, "direct");
}
