//! Bad raw arguments through `kuralle::parse_args` and `Tool::prepare`: every message names
//! the field, nothing panics.

use kuralle::{MAX_TOOL_ARGS_BYTES, Tool, ToolError, parse_args, tool};
use serde::Deserialize;

/// Units of temperature.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Units {
    /// Degrees Celsius.
    Celsius,
    /// Degrees Fahrenheit.
    Fahrenheit,
}

/// A place.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Place {
    /// Latitude.
    pub lat: f64,
}

/// Current weather for a city.
#[tool]
async fn get_weather(city: String, units: Option<Units>, days: Option<u8>, place: Option<Place>) -> String {
    let _ = (units, days, place);
    city
}

fn message(result: Result<Box<dyn kuralle::PreparedCall>, ToolError>) -> String {
    match result {
        Err(ToolError::InvalidInput { tool, message }) => {
            assert_eq!(tool, "get_weather");
            message
        }
        Err(other) => panic!("expected InvalidInput, got {other:?}"),
        Ok(_) => panic!("expected an error"),
    }
}

fn prepare(args: serde_json::Value) -> String {
    message(GetWeather.prepare(&args))
}

#[test]
fn not_an_object() {
    assert_eq!(prepare(serde_json::json!([1, 2])), "the arguments must be a JSON object, not an array");
    assert_eq!(prepare(serde_json::json!("Paris")), "the arguments must be a JSON object, not a string");
    assert_eq!(prepare(serde_json::Value::Null), "the arguments must be a JSON object, not null");
}

#[test]
fn wrong_types_name_the_field() {
    assert_eq!(prepare(serde_json::json!({"city": 5})), "`city`: invalid type: integer `5`, expected a string");
    assert_eq!(
        prepare(serde_json::json!({"city": "Paris", "units": "kelvin"})),
        "`units`: unknown variant `kelvin`, expected `celsius` or `fahrenheit`"
    );
    assert_eq!(
        prepare(serde_json::json!({"city": "Paris", "days": 300})),
        "`days`: invalid value: integer `300`, expected u8"
    );
    assert_eq!(
        prepare(serde_json::json!({"city": "Paris", "place": {"lat": "north"}})),
        "`place.lat`: invalid type: string \"north\", expected f64"
    );
}

#[test]
fn missing_unknown_and_null_fields() {
    assert_eq!(prepare(serde_json::json!({})), "missing field `city`");
    let unknown = prepare(serde_json::json!({"city": "Paris", "x": 1}));
    assert!(unknown.starts_with("`x`: unknown field `x`, expected one of `city`"), "{unknown}");
    assert_eq!(prepare(serde_json::json!({"city": null})), "`city`: invalid type: null, expected a string");
    // `null` for an optional field is `None`.
    assert!(GetWeather.prepare(&serde_json::json!({"city": "Paris", "units": null})).is_ok());
}

#[test]
fn deeply_nested_text_is_refused_without_a_panic() {
    let deep = format!("{{\"city\":{}1{}}}", "[".repeat(10_000), "]".repeat(10_000));
    match parse_args("get_weather", &deep) {
        Err(ToolError::InvalidInput { message, .. }) => assert!(message.contains("recursion limit"), "{message}"),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn huge_arguments() {
    let big = "x".repeat(10 * 1024 * 1024);
    let text = serde_json::json!({ "city": big }).to_string();
    match parse_args("get_weather", &text) {
        Err(ToolError::InvalidInput { message, .. }) => {
            assert!(message.contains(&format!("the limit is {MAX_TOOL_ARGS_BYTES} bytes")), "{message}");
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // The size limit is on raw text; a Value handed to `prepare` directly is validated as is.
    assert!(GetWeather.prepare(&serde_json::json!({ "city": big })).is_ok());
}
