//! JSON Schemas for tools: generation from Rust types (schemars, draft 2020-12) and the
//! OpenAI strict-mode transform applied at the provider edge.

use schemars::{JsonSchema, Schema, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use crate::tool::ToolSpec;

/// The input schema of `T`: draft 2020-12, root `type: object`, root `title` and
/// `description` removed (they are noise to a model; the tool has its own description).
///
/// ```
/// #[derive(schemars::JsonSchema, serde::Deserialize)]
/// /// Ignored at the root.
/// struct Input { city: String, units: Option<String> }
/// let s = kuralle::schema::input_schema::<Input>();
/// assert_eq!(s["type"], "object");
/// assert_eq!(s["required"], serde_json::json!(["city"]));
/// assert!(s.get("title").is_none());
/// ```
pub fn input_schema<T: JsonSchema>() -> Value {
    // Generic only where it must be: every `#[tool]` instantiates this for its input struct.
    finish_input(SchemaSettings::draft2020_12().into_generator().into_root_schema_for::<T>())
}

/// The input schema of a `#[tool]` from its argument table: what [`input_schema`] gives for
/// the input struct with schemars' derive, key order included, without a `JsonSchema` impl
/// per tool (the derive and `into_root_schema_for` were a large part of a tool's build time).
pub(crate) fn args_schema(table: &crate::input::ArgTable) -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut schema = schemars::json_schema!({"type": "object", "additionalProperties": false});
    for ((name, doc), make) in table.names.iter().zip(table.docs).zip(table.schemas) {
        let (mut property, optional) = make(&mut generator);
        let (title, description) = title_and_description(doc);
        for (key, text) in [("title", title), ("description", description)] {
            if !text.is_empty() {
                property.insert(key.to_owned(), text.into());
            }
        }
        let object = schema.ensure_object();
        if let Some(properties) = object.entry("properties").or_insert_with(|| json!({})).as_object_mut() {
            properties.insert((*name).to_owned(), property.into());
        }
        if !optional && let Some(required) = object.entry("required").or_insert_with(|| json!([])).as_array_mut() {
            required.push((*name).into());
        }
    }
    // The derive's description of the input struct, then what `into_root_schema_for` adds.
    // Both titles and descriptions are removed again by `finish_input`, but with
    // `preserve_order` a removal moves the last key into the removed one's place, so they are
    // inserted as they were to keep the keys in the order the models have always seen.
    let object = schema.ensure_object();
    object.insert("description".to_owned(), json!("The arguments of the tool."));
    object.insert("title".to_owned(), json!("Input"));
    if let Some(meta_schema) = &generator.settings().meta_schema {
        object.insert("$schema".to_owned(), json!(meta_schema));
    }
    let mut definitions = generator.take_definitions(false);
    if !definitions.is_empty()
        && let Some(target) = object.entry("$defs").or_insert_with(|| json!({})).as_object_mut()
    {
        target.append(&mut definitions);
    }
    finish_input(schema)
}

/// A doc comment as schemars' derive splits it: a leading `# heading` line is the title, the
/// rest (or the whole text) the description.
fn title_and_description(doc: &str) -> (&str, &str) {
    let doc = doc.trim_ascii();
    match doc.strip_prefix('#') {
        Some(_) => {
            let end = doc.find('\n').unwrap_or(doc.len());
            (doc[..end].trim_start_matches('#').trim_ascii(), doc[end..].trim_ascii())
        }
        None => ("", doc),
    }
}

fn finish_input(schema: Schema) -> Value {
    let mut value = schema.to_value();
    strip_root(&mut value);
    if let Value::Object(map) = &mut value {
        map.entry("type").or_insert_with(|| json!("object"));
    }
    value
}

/// The output schema of `T` (serialize contract), root `title` removed.
pub fn output_schema<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12().for_serialize().into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    strip_root(&mut value);
    value
}

fn strip_root(value: &mut Value) {
    if let Value::Object(map) = value {
        map.remove("title");
        map.remove("description");
    }
}

/// What OpenAI strict mode cannot express, with the JSON path (a JSON Pointer into the
/// tool's input schema) where it occurs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool `{tool}`: strict mode cannot express {what} at `{path}`")]
pub struct StrictSchemaError {
    /// Tool name.
    pub tool: String,
    /// JSON Pointer of the offending schema node (`""` is the root).
    pub path: String,
    /// What it is (for example "an open map (schema-valued `additionalProperties`)").
    pub what: String,
}

/// One OpenAI `tools` entry: `{"type":"function","function":{name,description,parameters,strict}}`.
pub(crate) fn openai_function(spec: &ToolSpec, strict: bool) -> Result<Value, StrictSchemaError> {
    let parameters =
        if strict { to_strict(&spec.name, &spec.input_schema)? } else { without_dialect(&spec.input_schema) };
    Ok(json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": parameters,
            "strict": strict,
        }
    }))
}

fn without_dialect(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(map) = &mut s {
        map.remove("$schema");
    }
    s
}

/// Keywords strict mode rejects that carry no meaning a model needs; dropped silently.
const DROPPED: &[&str] = &[
    "$schema",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "$comment",
];

/// Keywords whose meaning strict mode cannot express; refused with a typed error.
const REFUSED: &[(&str, &str)] = &[
    ("patternProperties", "`patternProperties`"),
    ("propertyNames", "`propertyNames`"),
    ("unevaluatedProperties", "`unevaluatedProperties`"),
    ("prefixItems", "a tuple (`prefixItems`)"),
    ("allOf", "`allOf`"),
    ("not", "`not`"),
    ("if", "a conditional (`if`)"),
    ("dependentSchemas", "`dependentSchemas`"),
    ("dependentRequired", "`dependentRequired`"),
];

/// `format` values strict mode accepts; others (`uint32`, `int64`, `double`, ...) are dropped.
const FORMATS: &[&str] = &["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"];

/// Applies OpenAI's strict-mode rules to a schema: `additionalProperties: false` on every object,
/// every property required with the optional ones made nullable, no siblings next to `$ref`,
/// `oneOf` as `anyOf`, unsupported annotation keywords dropped, and a typed error naming the
/// JSON path of anything strict mode cannot express (open maps, tuples, unconstrained values).
///
/// # Errors
/// [`StrictSchemaError`] for the first construct strict mode cannot express.
///
/// ```
/// let schema = serde_json::json!({
///     "type": "object",
///     "properties": {"city": {"type": "string"}, "units": {"type": ["string", "null"]}},
///     "required": ["city"]
/// });
/// let strict = kuralle::schema::to_strict("weather", &schema).unwrap();
/// assert_eq!(strict["required"], serde_json::json!(["city", "units"]));
/// assert_eq!(strict["additionalProperties"], false);
///
/// let map = serde_json::json!({"type": "object", "properties": {
///     "tags": {"type": "object", "additionalProperties": {"type": "string"}}}});
/// let err = kuralle::schema::to_strict("tagger", &map).unwrap_err();
/// assert_eq!(err.path, "/properties/tags");
/// ```
pub fn to_strict(tool: &str, schema: &Value) -> Result<Value, StrictSchemaError> {
    let mut out = schema.clone();
    let fail = |path: &str, what: &str| StrictSchemaError {
        tool: tool.to_owned(),
        path: path.to_owned(),
        what: what.to_owned(),
    };
    if out.get("type") != Some(&json!("object")) {
        return Err(fail("", "a root that is not `type: object`"));
    }
    walk(&mut out, String::new(), &fail)?;
    Ok(out)
}

fn walk(
    node: &mut Value,
    path: String,
    fail: &dyn Fn(&str, &str) -> StrictSchemaError,
) -> Result<(), StrictSchemaError> {
    let map = match node {
        Value::Object(map) => map,
        Value::Bool(_) => return Err(fail(&path, "an unconstrained value (a boolean schema)")),
        _ => return Ok(()),
    };
    if map.is_empty() {
        return Err(fail(&path, "an unconstrained value (an empty schema)"));
    }
    for (key, what) in REFUSED {
        if map.contains_key(*key) {
            return Err(fail(&path, what));
        }
    }
    for key in DROPPED {
        map.remove(*key);
    }
    if let Some(Value::String(f)) = map.get("format")
        && !FORMATS.contains(&f.as_str())
    {
        map.remove("format");
    }
    if let Some(one_of) = map.remove("oneOf") {
        map.insert("anyOf".into(), one_of);
    }
    if map.contains_key("$ref") && map.len() > 1 {
        // Strict mode forbids keywords beside `$ref`; keep the description on a one-branch
        // `anyOf` wrapper so the model still reads it.
        let reference = map.remove("$ref").unwrap_or(Value::Null);
        let description = map.remove("description");
        map.clear();
        map.insert("anyOf".into(), json!([{ "$ref": reference }]));
        if let Some(d) = description {
            map.insert("description".into(), d);
        }
    }

    let is_object = type_includes(map, "object") || map.contains_key("properties");
    if is_object {
        match map.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => return Err(fail(&path, "an open map (schema-valued `additionalProperties`)")),
        }
        map.insert("additionalProperties".into(), Value::Bool(false));
        map.entry("properties").or_insert_with(|| Value::Object(Map::new()));
        let required: Vec<String> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let Some(Value::Object(props)) = map.get_mut("properties") else {
            return Err(fail(&path, "`properties` that is not an object"));
        };
        let mut all = Vec::with_capacity(props.len());
        for (name, prop) in props.iter_mut() {
            walk(prop, format!("{path}/properties/{}", escape(name)), fail)?;
            if !required.contains(name) {
                make_nullable(prop);
            }
            all.push(Value::String(name.clone()));
        }
        map.insert("required".into(), Value::Array(all));
    }

    for key in ["items", "contains"] {
        if let Some(child) = map.get_mut(key) {
            walk(child, format!("{path}/{key}"), fail)?;
        }
    }
    for key in ["anyOf"] {
        if let Some(Value::Array(branches)) = map.get_mut(key) {
            for (i, b) in branches.iter_mut().enumerate() {
                walk(b, format!("{path}/{key}/{i}"), fail)?;
            }
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = map.get_mut(key) {
            for (name, d) in defs.iter_mut() {
                walk(d, format!("{path}/{key}/{}", escape(name)), fail)?;
            }
        }
    }
    Ok(())
}

fn type_includes(map: &Map<String, Value>, ty: &str) -> bool {
    match map.get("type") {
        Some(Value::String(t)) => t == ty,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == ty),
        _ => false,
    }
}

fn is_nullable(map: &Map<String, Value>) -> bool {
    type_includes(map, "null")
        || map
            .get("anyOf")
            .and_then(Value::as_array)
            .is_some_and(|bs| bs.iter().any(|b| b.get("type") == Some(&json!("null"))))
        || map.get("const") == Some(&Value::Null)
        || map.get("enum").and_then(Value::as_array).is_some_and(|e| e.contains(&Value::Null))
}

fn make_nullable(prop: &mut Value) {
    let Value::Object(map) = prop else { return };
    if is_nullable(map) {
        return;
    }
    let simple = map.keys().all(|k| !matches!(k.as_str(), "anyOf" | "$ref" | "enum" | "const"));
    match map.get_mut("type") {
        Some(Value::String(t)) if simple => {
            let t = std::mem::take(t);
            map.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(ts)) if simple => ts.push(json!("null")),
        _ => {
            let description = map.remove("description");
            let inner = Value::Object(std::mem::take(map));
            map.insert("anyOf".into(), json!([inner, {"type": "null"}]));
            if let Some(d) = description {
                map.insert("description".into(), d);
            }
        }
    }
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::*;

    /// Schemas of the shapes `schemars` and hand-written tools produce.
    fn schema() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!({"type": "string", "description": "d", "default": "x"})),
            Just(json!({"type": "integer", "format": "int64", "minimum": 0})),
            Just(json!({"type": ["number", "null"]})),
            Just(json!({"type": "string", "format": "date-time"})),
            Just(json!({"enum": ["a", "b"]})),
            Just(json!({"const": 1})),
            Just(json!({"$ref": "#/$defs/Thing", "description": "a thing"})),
        ];
        leaf.prop_recursive(4, 40, 5, |inner| {
            prop_oneof![
                (proptest::collection::vec(("[a-z/~]{1,5}", inner.clone(), any::<bool>()), 0..5)).prop_map(|props| {
                    let required: Vec<Value> =
                        props.iter().filter(|(_, _, r)| *r).map(|(k, _, _)| Value::String(k.clone())).collect();
                    let properties: Map<String, Value> = props.into_iter().map(|(k, v, _)| (k, v)).collect();
                    json!({"type": "object", "properties": properties, "required": required})
                }),
                inner.clone().prop_map(|items| json!({"type": "array", "items": items})),
                proptest::collection::vec(inner, 1..3).prop_map(|branches| json!({"oneOf": branches})),
            ]
        })
    }

    /// Checks the strict-mode rules on every object schema reachable from `node`.
    fn check(node: &Value) -> Result<(), TestCaseError> {
        let Value::Object(map) = node else { return Ok(()) };
        for key in DROPPED {
            prop_assert!(!map.contains_key(*key), "{key} kept in {node}");
        }
        prop_assert!(!map.contains_key("oneOf"));
        if map.contains_key("$ref") {
            prop_assert_eq!(map.len(), 1, "siblings beside $ref: {}", node);
        }
        if let Some(Value::Object(props)) = map.get("properties") {
            prop_assert_eq!(map.get("additionalProperties"), Some(&Value::Bool(false)));
            let required: Vec<&str> = map["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
            let keys: Vec<&str> = props.keys().map(String::as_str).collect();
            prop_assert_eq!(required, keys);
            for prop in props.values() {
                check(prop)?;
            }
        }
        for key in ["items", "contains"] {
            if let Some(child) = map.get(key) {
                check(child)?;
            }
        }
        if let Some(Value::Array(branches)) = map.get("anyOf") {
            for b in branches {
                check(b)?;
            }
        }
        Ok(())
    }

    /// Whether `schema` admits `null`.
    fn admits_null(schema: &Value) -> bool {
        let Value::Object(map) = schema else { return false };
        is_nullable(map)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// The transform yields a schema obeying every strict-mode rule, with exactly the
        /// optional properties made nullable, or (never for these shapes) an error.
        #[test]
        fn strict_transform_obeys_the_rules(props in proptest::collection::btree_map("[a-z]{1,5}", (schema(), any::<bool>()), 0..5)) {
            let props: Vec<(String, Value, bool)> = props.into_iter().map(|(k, (v, r))| (k, v, r)).collect();
            let required: Vec<Value> = props.iter().filter(|(_, _, r)| *r).map(|(k, _, _)| json!(k)).collect();
            let was_nullable: Map<String, Value> =
                props.iter().map(|(k, v, _)| (k.clone(), json!(admits_null(v)))).collect();
            let optional: Vec<String> = props.iter().filter(|(_, _, r)| !*r).map(|(k, _, _)| k.clone()).collect();
            let properties: Map<String, Value> = props.into_iter().map(|(k, v, _)| (k, v)).collect();
            let root = json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object", "properties": properties, "required": required,
                "$defs": {"Thing": {"type": "object", "properties": {"id": {"type": "integer"}}}},
            });
            let strict = to_strict("t", &root).expect("these shapes are expressible");
            check(&strict)?;
            check(&strict["$defs"]["Thing"])?;
            for (name, prop) in strict["properties"].as_object().unwrap() {
                let should = optional.contains(name) || was_nullable[name] == json!(true);
                prop_assert_eq!(admits_null(prop), should, "{}: {}", name, prop);
            }
            // Idempotent: a strict schema is already strict.
            prop_assert_eq!(to_strict("t", &strict).unwrap(), strict);
        }

        /// Any JSON under `properties`: a schema or a typed error naming a JSON path, never a
        /// panic.
        #[test]
        fn arbitrary_json_never_panics(v in crate::strategies::json_value()) {
            let root = json!({"type": "object", "properties": {"x": v.clone()}, "items": v.clone(), "anyOf": [v]});
            if let Err(e) = to_strict("t", &root) {
                prop_assert!(e.path.is_empty() || e.path.starts_with('/'));
            }
        }
    }
}
