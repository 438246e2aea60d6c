//! Any one-argument `Result` alias is a fallible tool: its error's `Display` text is the
//! failure the model sees.
use kuralle::{Tool, ToolContext, ToolError};

mod app {
    /// The app's error.
    #[derive(Debug)]
    pub struct Error(pub String);

    impl std::fmt::Display for Error {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    /// The app's result alias, in the style of `anyhow::Result<T>`.
    pub type Result<T> = std::result::Result<T, Error>;
}

/// Read a file.
#[kuralle::tool]
async fn read(path: String) -> std::io::Result<String> {
    std::fs::read_to_string(path)
}

/// Check a name.
#[kuralle::tool(on_error = recover)]
async fn check(name: String) -> app::Result<String> {
    if name.is_empty() { Err(app::Error("empty name".into())) } else { Ok(name) }
}

fn recover(error: app::Error, input: &CheckInput) -> app::Result<String> {
    if input.name.is_empty() { Ok("anonymous".into()) } else { Err(error) }
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(Read.call(serde_json::json!({"path": "/nonexistent/kuralle"}), ToolContext::detached()));
    assert!(matches!(out, Err(ToolError::Failed { .. })), "{out:?}");
    let out = rt.block_on(Check.call(serde_json::json!({"name": ""}), ToolContext::detached()));
    assert_eq!(out, Ok(serde_json::json!("anonymous")));
}
