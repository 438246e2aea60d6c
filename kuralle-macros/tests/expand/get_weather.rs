//! A plain tool: doc comments, an optional param, `parallel_safe`.

/// Current weather for a city.
#[tool(parallel_safe)]
pub async fn get_weather(
    /// City name, for example "Paris".
    city: String,
    units: Option<Units>,
) -> Weather {
    Weather::sunny(city, units)
}
