use kuralle::{Tool, ToolContext, ToolError};

/// Why a division failed.
#[derive(Debug)]
pub enum MathError {
    /// Division by zero.
    DivideByZero,
}

impl std::fmt::Display for MathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("division by zero")
    }
}

impl std::error::Error for MathError {}

/// Divide two integers.
#[kuralle::tool]
async fn divide(a: i64, b: i64) -> std::result::Result<i64, MathError> {
    if b == 0 { Err(MathError::DivideByZero) } else { Ok(a / b) }
}

fn main() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(Divide.call(serde_json::json!({"a": 1, "b": 0}), ToolContext::detached()));
    assert_eq!(out, Err(ToolError::failed("divide", "division by zero")));
    assert_eq!(rt.block_on(divide(6, 3)).unwrap(), 2);
}
