//! Canonical JSON (RFC 8785) of any JSON: valid JSON, a fixed point, and a key, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let text = kuralle::journal::canonical_json(&value);
    let back: Value = serde_json::from_str(&text).expect("canonical JSON parses");
    assert_eq!(kuralle::journal::canonical_json(&back), text);
    let key = kuralle::journal::tool_key("run", 0, 0, "t", &value);
    assert_eq!(key.len(), 64);
});
