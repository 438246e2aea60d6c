//! Basic behaviour of `#[tool]` through the public API.

use futures::StreamExt;
use kuralle::{Tool, ToolContext, ToolError, ToolEvent, ToolSet, progress, tool};
use serde::{Deserialize, Serialize};

/// Units of temperature.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Units {
    /// Degrees Celsius.
    Celsius,
    /// Degrees Fahrenheit.
    Fahrenheit,
}

/// A weather report.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Weather {
    /// Temperature.
    pub temperature: f64,
    /// Units of `temperature`.
    pub units: Units,
}

/// Why a weather lookup failed.
#[derive(Debug)]
pub struct WeatherError(String);

impl std::fmt::Display for WeatherError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Current weather for a city.
///
/// Second paragraph, not part of the description.
#[tool(parallel_safe)]
async fn get_weather(
    /// City name, for example "Paris".
    city: String,
    units: Option<Units>,
) -> Result<Weather, WeatherError> {
    if city == "Atlantis" {
        return Err(WeatherError("no such city".into()));
    }
    Ok(Weather { temperature: 21.5, units: units.unwrap_or(Units::Celsius) })
}

/// Count to `to`, reporting each step.
#[tool]
async fn count(to: u32, ctx: &ToolContext) -> Result<String, WeatherError> {
    for i in 1..=to {
        progress!(i);
    }
    if ctx.is_cancelled() {
        return Err(WeatherError("cancelled".into()));
    }
    let n: u32 = "7".parse().map_err(|_| WeatherError("bad".into()))?;
    Ok(format!("counted to {to} ({n})"))
}

#[tokio::test]
async fn calls_and_describes() {
    let out = GetWeather.call(serde_json::json!({"city": "Paris"}), ToolContext::detached()).await;
    assert_eq!(out, Ok(serde_json::json!({"temperature": 21.5, "units": "celsius"})));
    assert_eq!(GetWeather.description(), "Current weather for a city.");
    assert!(GetWeather.parallel_safe(&serde_json::json!({})));
    let specs = ToolSet::new().with(GetWeather).specs();
    assert_eq!(specs[0].input_schema["properties"]["city"]["description"], "City name, for example \"Paris\".");
    assert!(specs[0].output_schema.is_some());
    let out = GetWeather.call(serde_json::json!({"city": "Atlantis"}), ToolContext::detached()).await;
    assert_eq!(out, Err(ToolError::failed("get_weather", "no such city")));
}

#[tokio::test]
async fn generator_streams_progress_then_result() {
    let events: Vec<_> = Count.execute(&serde_json::json!({"to": 2}), ToolContext::detached()).collect().await;
    assert_eq!(
        events,
        vec![
            ToolEvent::Progress(serde_json::json!(1)),
            ToolEvent::Progress(serde_json::json!(2)),
            ToolEvent::Outcome(Ok(serde_json::json!("counted to 2 (7)"))),
        ]
    );
}
