//! The schema every wire is sent for a typed output: an object at the root, as tool
//! arguments and strict structured output require.

use serde_json::{Map, Value, json};

/// `schema` when its root is an object, else `schema` wrapped as the required property
/// `response` of a closed object (its `$defs` kept at the root, where `$ref`s point); the bool
/// says whether it was wrapped.
pub(super) fn wire_schema(mut schema: Value) -> (Value, bool) {
    let root_object = schema.get("type") == Some(&json!("object")) && schema.get("properties").is_some();
    if root_object {
        return (schema, false);
    }
    let mut root = Map::new();
    if let Value::Object(map) = &mut schema {
        if let Some(dialect) = map.remove("$schema") {
            root.insert("$schema".into(), dialect);
        }
        // `input_schema` adds `type: object` to any root; a root that is not one loses it.
        if map.get("type") == Some(&json!("object")) && map.keys().any(|k| k == "anyOf" || k == "oneOf") {
            map.remove("type");
        }
    }
    let defs = schema.as_object_mut().and_then(|m| m.remove("$defs"));
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), json!({ "response": schema }));
    root.insert("required".into(), json!(["response"]));
    root.insert("additionalProperties".into(), json!(false));
    if let Some(defs) = defs {
        root.insert("$defs".into(), defs);
    }
    (Value::Object(root), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_stays_and_anything_else_is_wrapped_with_its_defs_at_the_root() {
        let object = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(wire_schema(object.clone()), (object, false));
        let list = json!({"$schema": "d", "type": "array", "items": {"$ref": "#/$defs/Line"}, "$defs": {"Line": {}}});
        let (wrapped, was) = wire_schema(list);
        assert!(was);
        assert_eq!(wrapped["properties"]["response"], json!({"type": "array", "items": {"$ref": "#/$defs/Line"}}));
        assert_eq!(wrapped["$defs"], json!({"Line": {}}));
        assert_eq!(wrapped["$schema"], "d");
    }
}
