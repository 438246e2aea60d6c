//! A tool as you write it. `get_weather-expanded.rs` beside this file is what `#[tool]` turns
//! it into, simplified and commented; `kuralle-macros/tests/expand/` has the exact output.
//!
//! `cargo run -p kuralle-examples --example get_weather`

use kuralle::{Tool, ToolContext, tool};

/// Temperature units.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Units {
    /// Degrees Celsius.
    Celsius,
    /// Degrees Fahrenheit.
    Fahrenheit,
}

/// Current weather for a city.
#[tool(parallel_safe, timeout = "5s")]
pub async fn get_weather(
    /// City name, for example "Paris".
    city: String,
    units: Option<Units>,
) -> String {
    match units {
        Some(Units::Fahrenheit) => format!("70°F in {city}"),
        _ => format!("21°C in {city}"),
    }
}

#[tokio::main]
async fn main() {
    println!("{}", serde_json::to_string_pretty(GetWeather.input_schema()).expect("a schema is JSON"));
    let out = GetWeather.call(serde_json::json!({"city": "Paris"}), ToolContext::detached()).await;
    println!("{out:?}");
}
