//! Input/output schemas of representative tools (insta snapshots) and the OpenAI strict-mode
//! transform applied by `ToolSet::to_openai()`.

use std::collections::HashMap;

use kuralle::{Tool, ToolSet, tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Units of temperature.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Units {
    /// Degrees Celsius.
    Celsius,
    /// Degrees Fahrenheit.
    Fahrenheit,
}

/// A weather report.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Weather {
    /// Temperature.
    pub temperature: f64,
}

/// Current weather for a city.
#[tool(parallel_safe)]
async fn get_weather(
    /// City name, for example "Paris".
    city: String,
    /// Temperature units; Celsius when absent.
    units: Option<Units>,
) -> Result<Weather, std::fmt::Error> {
    let _ = (city, units);
    Ok(Weather { temperature: 20.0 })
}

/// A postal address.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct Address {
    /// Street and number.
    pub street: String,
    /// Floor, when relevant.
    pub floor: Option<u8>,
}

/// How to ship.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Shipping {
    /// Standard.
    Standard,
    /// Express within `days`.
    Express {
        /// Days.
        days: u8,
    },
}

/// Ship items to an address.
#[tool]
async fn ship(
    /// Destination.
    address: Address,
    /// Shipping method.
    shipping: Shipping,
    /// Item ids.
    items: Vec<String>,
    /// Gift note.
    note: Option<String>,
) -> String {
    let _ = (address, shipping, items, note);
    String::new()
}

/// Tag things.
#[tool]
async fn tag(tags: HashMap<String, String>) -> usize {
    tags.len()
}

/// Output without a schema.
pub struct NoSchema;

impl Serialize for NoSchema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

/// Return something without a schema.
#[tool]
async fn opaque() -> NoSchema {
    NoSchema
}

#[test]
fn input_and_output_schemas() {
    insta::assert_json_snapshot!("get_weather_input", GetWeather.input_schema());
    insta::assert_json_snapshot!("get_weather_output", GetWeather.output_schema());
    insta::assert_json_snapshot!("ship_input", Ship.input_schema());
    assert_eq!(Ship.input_schema()["additionalProperties"], false, "deny_unknown_fields shows in the schema");
    assert!(Opaque.output_schema().is_none(), "a result type without JsonSchema has no output schema");
    assert_eq!(Opaque.input_schema()["type"], "object");
}

#[test]
fn schemas_are_computed_once() {
    assert!(std::ptr::eq(GetWeather.input_schema(), GetWeather.input_schema()));
}

#[test]
fn strict_transform() {
    let openai = ToolSet::new().with(GetWeather).with(Ship).to_openai().unwrap();
    insta::assert_json_snapshot!("openai_strict", openai);
    let ship = &openai[1]["function"]["parameters"];
    // Optional params become required + nullable.
    assert_eq!(ship["required"], serde_json::json!(["address", "shipping", "items", "note"]));
    assert_eq!(ship["properties"]["note"]["type"], serde_json::json!(["string", "null"]));
    // Nested objects (in $defs) get additionalProperties: false and all-required.
    let address = &ship["$defs"]["Address"];
    assert_eq!(address["additionalProperties"], false);
    assert_eq!(address["required"], serde_json::json!(["street", "floor"]));
    // `$ref` with a sibling description is wrapped so no keyword sits beside `$ref`.
    let prop = &ship["properties"]["address"];
    assert!(prop.get("$ref").is_none() || prop.as_object().unwrap().len() == 1, "{prop}");
    // oneOf becomes anyOf.
    let text = serde_json::to_string(&openai).unwrap();
    assert!(!text.contains("oneOf"), "{text}");
}

#[test]
fn open_map_is_refused_naming_the_path() {
    let err = ToolSet::new().with(Tag).to_openai().unwrap_err();
    assert_eq!(err.tool, "tag");
    assert_eq!(err.path, "/properties/tags");
    assert!(ToolSet::new().with(Tag).to_openai_with(false).is_ok());
}

/// What `ship`'s input struct was before `#[tool]` wrote its own argument table: the derives.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // only its schema is used
struct ShipDerived {
    /// Destination.
    address: Address,
    /// Shipping method.
    shipping: Shipping,
    /// Item ids.
    items: Vec<String>,
    /// Gift note.
    note: Option<String>,
}

/// Doc comments as schemars reads them: a `#` heading is a title, lines are joined.
#[tool]
async fn headed(
    /// # Heading
    ///
    /// Body line one,
    /// body line two.
    a: HashMap<String, u8>,
    #[doc = concat!(" Built ", "by a macro.")] b: Option<Option<bool>>,
    c: serde_json::Value,
) -> u8 {
    let _ = (a, b, c);
    0
}

/// [`Headed`]'s params with the derives.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // only its schema is used
struct HeadedDerived {
    /// # Heading
    ///
    /// Body line one,
    /// body line two.
    a: HashMap<String, u8>,
    #[doc = concat!(" Built ", "by a macro.")]
    b: Option<Option<bool>>,
    c: serde_json::Value,
}

/// No params at all.
#[tool]
async fn nothing() -> u8 {
    0
}

/// No fields at all.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NothingDerived {}

#[test]
fn the_argument_table_gives_the_derived_schema_key_for_key() {
    // As text, so the key order (which models see) is compared too.
    let text = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap();
    for (tool, derived) in [
        (&Ship as &dyn Tool, kuralle::schema::input_schema::<ShipDerived>()),
        (&Headed, kuralle::schema::input_schema::<HeadedDerived>()),
        (&Nothing, kuralle::schema::input_schema::<NothingDerived>()),
    ] {
        assert_eq!(text(tool.input_schema()), text(&derived), "{}", tool.name());
    }
    assert_eq!(Headed.input_schema()["properties"]["a"]["title"], "Heading");
    assert_eq!(Headed.input_schema()["properties"]["b"]["description"], "Built by a macro.");
}

/// A param with serde attributes keeps serde's derive, which knows what they mean.
#[tool]
async fn renamed(
    /// The town.
    #[serde(rename = "town")]
    city: String,
    /// Days ahead.
    #[serde(default)]
    days: u8,
) -> String {
    format!("{city} {days}")
}

#[test]
fn serde_attributes_on_params_still_apply() {
    let schema = Renamed.input_schema();
    assert_eq!(schema["required"], serde_json::json!(["town"]));
    assert_eq!(schema["properties"]["town"]["description"], "The town.");
    assert_eq!(schema["properties"]["days"]["default"], 0);
    assert!(Renamed.prepare(&serde_json::json!({"town": "Oslo"})).is_ok());
    let Err(kuralle::ToolError::InvalidInput { message, .. }) = Renamed.prepare(&serde_json::json!({"city": "Oslo"}))
    else {
        panic!("`city` is not a field of the renamed tool");
    };
    assert!(message.starts_with("`city`: unknown field `city`, expected `town` or `days`"), "{message}");
}
