//! A generator tool: `progress!` points, and an `std::io::Result` alias as the result.

/// Count to `to`, reporting each step.
#[tool]
async fn count(to: u32) -> std::io::Result<String> {
    for i in 1..=to {
        progress!(i);
    }
    Ok(format!("counted to {to}"))
}
