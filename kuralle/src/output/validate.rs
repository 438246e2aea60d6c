//! Checking a value against a JSON Schema: the keywords schemars generates for serde types
//! (`type`, `enum`, `const`, `properties`, `required`, `additionalProperties`, `items`,
//! `anyOf`/`oneOf`/`allOf`, local `$ref`, numeric bounds, length bounds), each failure named
//! by its JSON Pointer. Keywords outside that set (`pattern`, `format`) are not checked; serde
//! has the last word on the value.

use serde_json::{Map, Value};

/// The most `$ref`s followed on one path: a recursive schema cannot loop forever.
const MAX_DEPTH: usize = 64;

/// Checks `value` against `schema`; the error names the JSON Pointer of the first violation
/// and what is wrong.
///
/// # Errors
/// The first violation, for example ``at `/lines/0/qty`: -1 is less than the minimum 0``.
///
/// ```
/// use serde_json::json;
/// let schema = json!({"type": "object", "properties": {"qty": {"type": "integer", "minimum": 0}},
///     "required": ["qty"], "additionalProperties": false});
/// assert!(kuralle::check_schema(&schema, &json!({"qty": 2})).is_ok());
/// assert_eq!(kuralle::check_schema(&schema, &json!({})).unwrap_err(), "at `/`: missing required property `qty`");
/// assert_eq!(kuralle::check_schema(&schema, &json!({"qty": 1.5})).unwrap_err(), "at `/qty`: expected integer, got 1.5");
/// ```
pub fn check_schema(schema: &Value, value: &Value) -> Result<(), String> {
    let defs = schema.get("$defs").and_then(Value::as_object);
    Checker { defs }.check(schema, value, "", 0)
}

struct Checker<'s> {
    defs: Option<&'s Map<String, Value>>,
}

fn at(path: &str, what: impl std::fmt::Display) -> String {
    format!("at `{}`: {what}", if path.is_empty() { "/" } else { path })
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

fn is_type(value: &Value, name: &str) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => true,
    }
}

impl<'s> Checker<'s> {
    fn check(&self, schema: &'s Value, value: &Value, path: &str, depth: usize) -> Result<(), String> {
        let map = match schema {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return Err(at(path, "no value is allowed here")),
            Value::Object(map) => map,
            _ => return Ok(()),
        };
        if let Some(Value::String(reference)) = map.get("$ref") {
            if depth >= MAX_DEPTH {
                return Err(at(path, "the schema nests too deeply"));
            }
            let target = reference
                .strip_prefix("#/$defs/")
                .and_then(|name| self.defs?.get(name))
                .ok_or_else(|| at(path, format!("unresolvable `$ref` {reference}")))?;
            self.check(target, value, path, depth + 1)?;
        }
        if let Some(types) = map.get("type") {
            let names: Vec<&str> = match types {
                Value::String(t) => vec![t.as_str()],
                Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !names.is_empty() && !names.iter().any(|t| is_type(value, t)) {
                return Err(at(path, format!("expected {}, got {}", names.join(" or "), short(value))));
            }
        }
        if let Some(Value::Array(allowed)) = map.get("enum")
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(short).collect();
            return Err(at(path, format!("{} is not one of {}", short(value), list.join(", "))));
        }
        if let Some(expected) = map.get("const")
            && expected != value
        {
            return Err(at(path, format!("expected {}, got {}", short(expected), short(value))));
        }
        if let Some(Value::Array(all)) = map.get("allOf") {
            for branch in all {
                self.check(branch, value, path, depth + 1)?;
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = map.get(key) {
                let mut first = None;
                if !branches.iter().any(|b| match self.check(b, value, path, depth + 1) {
                    Ok(()) => true,
                    Err(e) => {
                        first.get_or_insert(e);
                        false
                    }
                }) {
                    return Err(match (branches.len(), first) {
                        (1, Some(e)) => e,
                        _ => {
                            at(path, format!("{} matches none of the {} allowed shapes", short(value), branches.len()))
                        }
                    });
                }
            }
        }
        self.numbers(map, value, path)?;
        self.lengths(map, value, path)?;
        match value {
            Value::Object(object) => self.object(map, object, path, depth),
            Value::Array(items) => {
                if let Some(item) = map.get("items") {
                    for (i, v) in items.iter().enumerate() {
                        self.check(item, v, &format!("{path}/{i}"), depth + 1)?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn numbers(&self, map: &Map<String, Value>, value: &Value, path: &str) -> Result<(), String> {
        let Some(n) = value.as_f64() else { return Ok(()) };
        let bound = |k: &str| map.get(k).and_then(Value::as_f64);
        if let Some(min) = bound("minimum").filter(|m| n < *m) {
            return Err(at(path, format!("{value} is less than the minimum {min}")));
        }
        if let Some(max) = bound("maximum").filter(|m| n > *m) {
            return Err(at(path, format!("{value} is greater than the maximum {max}")));
        }
        if let Some(min) = bound("exclusiveMinimum").filter(|m| n <= *m) {
            return Err(at(path, format!("{value} is not greater than {min}")));
        }
        if let Some(max) = bound("exclusiveMaximum").filter(|m| n >= *m) {
            return Err(at(path, format!("{value} is not less than {max}")));
        }
        Ok(())
    }

    fn lengths(&self, map: &Map<String, Value>, value: &Value, path: &str) -> Result<(), String> {
        let (len, min_key, max_key, unit) = match value {
            Value::String(s) => (s.chars().count(), "minLength", "maxLength", "characters"),
            Value::Array(a) => (a.len(), "minItems", "maxItems", "items"),
            _ => return Ok(()),
        };
        let bound = |k: &str| map.get(k).and_then(Value::as_u64).map(|b| usize::try_from(b).unwrap_or(usize::MAX));
        if let Some(min) = bound(min_key).filter(|m| len < *m) {
            return Err(at(path, format!("{len} {unit}, fewer than the minimum {min}")));
        }
        if let Some(max) = bound(max_key).filter(|m| len > *m) {
            return Err(at(path, format!("{len} {unit}, more than the maximum {max}")));
        }
        Ok(())
    }

    fn object(
        &self,
        map: &'s Map<String, Value>,
        object: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<(), String> {
        if let Some(Value::Array(required)) = map.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if !object.contains_key(name) {
                    return Err(at(path, format!("missing required property `{name}`")));
                }
            }
        }
        let properties = map.get("properties").and_then(Value::as_object);
        for (name, v) in object {
            let child = format!("{path}/{}", name.replace('~', "~0").replace('/', "~1"));
            match (properties.and_then(|p| p.get(name)), map.get("additionalProperties")) {
                (Some(schema), _) => self.check(schema, v, &child, depth + 1)?,
                (None, Some(Value::Bool(false))) => {
                    return Err(at(path, format!("unexpected property `{name}`")));
                }
                (None, Some(extra @ Value::Object(_))) => self.check(extra, v, &child, depth + 1)?,
                (None, _) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check_schema;

    #[test]
    fn refs_nullable_branches_and_items_are_followed() {
        let schema = json!({
            "type": "object",
            "properties": {
                "lines": {"type": "array", "items": {"$ref": "#/$defs/Line"}, "minItems": 1},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "kind": {"enum": ["a", "b"]}
            },
            "required": ["lines"],
            "$defs": {"Line": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1}}, "required": ["qty"]}}
        });
        assert!(check_schema(&schema, &json!({"lines": [{"qty": 1}], "note": null})).is_ok());
        assert_eq!(
            check_schema(&schema, &json!({"lines": [{"qty": 0}]})).unwrap_err(),
            "at `/lines/0/qty`: 0 is less than the minimum 1"
        );
        assert_eq!(
            check_schema(&schema, &json!({"lines": []})).unwrap_err(),
            "at `/lines`: 0 items, fewer than the minimum 1"
        );
        assert_eq!(
            check_schema(&schema, &json!({"lines": [{"qty": 1}], "kind": "c"})).unwrap_err(),
            "at `/kind`: \"c\" is not one of \"a\", \"b\""
        );
        assert!(
            check_schema(&schema, &json!({"lines": [{"qty": 1}], "note": 3})).unwrap_err().contains("matches none")
        );
    }

    #[test]
    fn a_recursive_schema_ends() {
        let schema = json!({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}});
        assert!(check_schema(&schema, &json!(1)).unwrap_err().contains("nests too deeply"));
    }
}
