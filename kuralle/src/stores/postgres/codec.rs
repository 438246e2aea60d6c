//! How values cross into PostgreSQL: JSON as JSONB (losslessly), integers as `bigint`.
//!
//! JSONB cannot hold the character U+0000 in a string or key (PostgreSQL rejects `\u0000`),
//! but a tool may legitimately return one. Such a value is stored as its JSON *text* inside a
//! one-key wrapper object, `{"$kuralle_json": "<text>"}`, whose text escapes the NUL. A value
//! that happens to look like the wrapper is wrapped too, so decoding is unambiguous. Every
//! other value is stored as plain JSONB, queryable with the usual operators.
//!
//! JSONB keeps numbers exactly but not object key order (it sorts keys); values read back
//! compare equal to the values written.

use serde_json::{Map, Value};

use crate::store::StoreError;

/// The key of the wrapper object that carries a value JSONB cannot hold.
const WRAPPER_KEY: &str = "$kuralle_json";

/// The JSONB to store for `value`.
pub(super) fn encode(value: &Value) -> Value {
    if needs_wrapper(value) {
        let mut wrapper = Map::new();
        wrapper.insert(WRAPPER_KEY.to_owned(), Value::String(value.to_string()));
        Value::Object(wrapper)
    } else {
        value.clone()
    }
}

/// The value stored as `stored` (the inverse of [`encode`]).
pub(super) fn decode(column: &str, stored: Value) -> Result<Value, StoreError> {
    match wrapped_text(&stored) {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| StoreError::Corrupt(format!("{column} holds a wrapped value that is not JSON: {e}").into())),
        None => Ok(stored),
    }
}

fn wrapped_text(value: &Value) -> Option<&str> {
    let Value::Object(map) = value else { return None };
    if map.len() != 1 {
        return None;
    }
    map.get(WRAPPER_KEY).and_then(Value::as_str)
}

fn needs_wrapper(value: &Value) -> bool {
    wrapped_text(value).is_some() || has_nul(value)
}

fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(key, item)| key.contains('\0') || has_nul(item)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// A `u64` as PostgreSQL's `bigint`.
pub(super) fn to_i64(what: &str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::LimitExceeded(format!("{what} {value} exceeds {}", i64::MAX).into()))
}

/// A stored `bigint` that must not be negative.
pub(super) fn to_u64(column: &str, value: i64) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} holds a negative value {value}").into()))
}

/// A lease time-to-live in whole milliseconds (at least 1), as `bigint`.
pub(super) fn ttl_ms(ttl: std::time::Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn plain_values_pass_through_and_nul_values_round_trip() {
        let plain = json!({"a": [1, "two", null], "b": {"c": 1.5}});
        assert_eq!(encode(&plain), plain);
        for value in [
            json!("nul \u{0} inside"),
            json!({"k\u{0}": 1}),
            json!([{"deep": ["x\u{0}"]}]),
            json!({"$kuralle_json": "looks like a wrapper"}),
            json!({"$kuralle_json": "{}"}),
        ] {
            let stored = encode(&value);
            assert_ne!(stored, value);
            assert!(!has_nul(&stored), "{stored}");
            assert_eq!(decode("c", stored).unwrap(), value);
        }
        // Not a wrapper: two keys, or a non-string payload.
        for value in [json!({"$kuralle_json": "x", "y": 1}), json!({"$kuralle_json": 1})] {
            assert_eq!(encode(&value), value);
            assert_eq!(decode("c", value.clone()).unwrap(), value);
        }
        assert!(matches!(decode("c", json!({"$kuralle_json": "{"})), Err(StoreError::Corrupt(_))));
    }
}
