use kuralle::{Tool, ToolContext};

/// Look up a thing by its type.
#[kuralle::tool]
async fn r#match(
    /// The kind of thing.
    r#type: String,
    r#ref: Option<u32>,
) -> String {
    format!("{type}:{ref:?}", type = r#type, ref = r#ref)
}

fn main() {
    assert_eq!(Match.name(), "match");
    let schema = Match.input_schema();
    assert_eq!(schema["required"], serde_json::json!(["type"]));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(Match.call(serde_json::json!({"type": "t", "ref": 1}), ToolContext::detached()));
    assert_eq!(out, Ok(serde_json::json!("t:Some(1)")));
}
