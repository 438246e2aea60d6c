use kuralle::{Tool, ToolContext, tool};

/// Greet someone.
#[tool]
async fn greet(greeting: String, ctx: &ToolContext, name: String) -> String {
    format!("{greeting}, {name} (run {})", ctx.run_id())
}

fn main() {
    let schema = Greet.input_schema();
    assert_eq!(schema["required"], serde_json::json!(["greeting", "name"]));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(Greet.call(serde_json::json!({"greeting": "Hi", "name": "Ada"}), ToolContext::detached()));
    assert_eq!(out, Ok(serde_json::json!("Hi, Ada (run detached)")));
}
