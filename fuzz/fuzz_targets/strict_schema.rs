//! Any JSON as a tool's input schema (an MCP server's, say): a strict schema or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let _ = kuralle::schema::to_strict("t", &value);
    let root = json!({"type": "object", "properties": {"x": value}});
    if let Ok(strict) = kuralle::schema::to_strict("t", &root) {
        // A strict schema is a fixed point of the transform.
        assert_eq!(kuralle::schema::to_strict("t", &strict).as_ref(), Ok(&strict));
    }
});
