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

/// Every argument back, to tell two inputs apart.
#[tool]
async fn echo_all(
    city: String,
    units: Option<Units>,
    days: Option<u8>,
    place: Option<Place>,
    tags: Option<Vec<String>>,
    extra: Option<serde_json::Value>,
    ratio: Option<f64>,
) -> String {
    format!("{city}|{units:?}|{days:?}|{place:?}|{tags:?}|{extra:?}|{ratio:?}")
}

/// The call's outcome (or the validation error) from `prepare_raw` on the text, and from
/// `prepare` on the `Value` `parse_args` makes of it.
fn both_paths(text: &str) -> (Result<serde_json::Value, ToolError>, Result<serde_json::Value, ToolError>) {
    let run = |prepared: Result<Box<dyn kuralle::PreparedCall>, ToolError>| {
        prepared.and_then(|call| {
            let events: Vec<kuralle::ToolEvent> = futures::executor::block_on(futures::StreamExt::collect(
                call.execute(kuralle::ToolContext::detached()),
            ));
            match events.into_iter().last() {
                Some(kuralle::ToolEvent::Outcome(out)) => out,
                other => panic!("no outcome: {other:?}"),
            }
        })
    };
    let raw = run(EchoAll.prepare_raw(&kuralle::RawArgs::new(text)));
    let parsed = run(parse_args("echo_all", text).and_then(|v| EchoAll.prepare(&v)));
    (raw, parsed)
}

/// `#[tool]` reads raw text straight into its input without a `Value`; whatever the text, the
/// outcome (the input it built, or the error naming the field) is the one the `Value` path gives.
#[test]
fn raw_text_and_parsed_value_give_the_same_input_or_error() {
    let deep = format!("{{\"city\":\"a\",\"extra\":{}1{}}}", "[".repeat(126), "]".repeat(126));
    let deeper = format!("{{\"city\":\"a\",\"extra\":{}1{}}}", "[".repeat(127), "]".repeat(127));
    let big = serde_json::json!({ "city": "x".repeat(MAX_TOOL_ARGS_BYTES) }).to_string();
    let texts = [
        "",
        "  ",
        "{}",
        "[1]",
        "\"Paris\"",
        "null",
        "{",
        "{} x",
        r#"{"city":"Paris"}"#,
        r#" { "city" : "Pa\"ris\u00e9\ud83d\ude00" , "units" : "celsius" } "#,
        r#"{"city":"Paris","units":"kelvin"}"#,
        r#"{"city":"Paris","units":null,"days":null}"#,
        r#"{"city":"Paris","days":300}"#,
        r#"{"city":"Paris","days":-1}"#,
        r#"{"city":"Paris","days":1.0}"#,
        r#"{"city":"Paris","days":7}"#,
        r#"{"city":5}"#,
        r#"{"city":null}"#,
        r#"{"city":"Paris","x":1}"#,
        r#"{"x":1,"city":5}"#,
        r#"{"city":"a","city":"b"}"#,
        r#"{"city":5,"city":"b"}"#,
        r#"{"city":"b","city":5}"#,
        r#"{"\u0063ity":"escaped key"}"#,
        r#"{"city":"Paris","place":{"lat":"north"}}"#,
        r#"{"city":"Paris","place":{"lat":1.5,"lat":2}}"#,
        r#"{"city":"Paris","place":{"lat":1,"x":2}}"#,
        r#"{"city":"Paris","tags":["a",1]}"#,
        r#"{"city":"Paris","tags":["a","b"],"extra":{"k":[1,2.5,-0,12345678901234567890,{"z":null}]}}"#,
        r#"{"city":"Paris","ratio":1e400}"#,
        r#"{"city":"Paris","ratio":5e-324,"extra":123456789012345678901234567890}"#,
        r#"{"__kuralle_oversized_arguments":{"bytes":5000000,"limit":1048576}}"#,
        &deep,
        &deeper,
        &big,
    ];
    for text in texts {
        let (raw, parsed) = both_paths(text);
        let shown = &text[..text.len().min(80)];
        assert_eq!(raw, parsed, "{shown}");
    }
    assert!(both_paths(r#"{"city":"a","city":"b"}"#).0.is_ok_and(|v| v.as_str().unwrap().starts_with("b|")));
}
