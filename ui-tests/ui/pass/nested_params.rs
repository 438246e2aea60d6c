use std::collections::HashMap;

use kuralle::{Tool, ToolContext};

/// A street address.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
pub struct Address {
    /// Street and number.
    pub street: String,
    /// City.
    pub city: String,
}

/// How to ship.
#[derive(Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Shipping {
    /// Standard.
    Standard,
    /// Express, with a deadline in days.
    Express {
        /// Days.
        days: u8,
    },
}

/// Place an order.
#[kuralle::tool]
async fn place_order(
    /// Where to ship.
    address: Address,
    shipping: Shipping,
    items: Vec<String>,
    quantities: HashMap<String, u32>,
    note: Option<String>,
) -> usize {
    let _ = (address, shipping, note);
    items.len() + quantities.len()
}

fn main() {
    let schema = PlaceOrder.input_schema();
    assert_eq!(schema["required"], serde_json::json!(["address", "shipping", "items", "quantities"]));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(PlaceOrder.call(
        serde_json::json!({
            "address": {"street": "1 Main St", "city": "Paris"},
            "shipping": {"express": {"days": 2}},
            "items": ["a", "b"],
            "quantities": {"a": 1}
        }),
        ToolContext::detached(),
    ));
    assert_eq!(out, Ok(serde_json::json!(3)));
}
