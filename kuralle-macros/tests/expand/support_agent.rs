//! An agent with two tools and limits.

/// You are a support agent. Use the tools when asked.
#[agent(id = "support", tools = [GetWeather, Charge], max_steps = 8, max_tool_concurrency = 4)]
pub struct Support;
