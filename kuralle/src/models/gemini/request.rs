//! The `generateContent` request body: the transcript as `contents`, the system text as
//! `systemInstruction`, the tools as `functionDeclarations` (their schemas cut down to the
//! OpenAPI subset Gemini's `parameters` accepts), and `generationConfig`.
//!
//! How a transcript is sent:
//! - A user message is a `user` content with one text part.
//! - An assistant turn is a `model` content with its parts in order. From a Gemini turn every
//!   part goes back as it came: thought text as `{"text", "thought": true}`, a signature-only
//!   part as `{"text": "", "thoughtSignature"}`, each `thoughtSignature` on the part it came
//!   with, and `functionCall.id` only where Gemini gave one. From any other turn (another
//!   provider's, or one without an origin) only text and calls go, with no signature, no
//!   reasoning and no ids, except that the first call of the turn carries the signature
//!   Google documents for calls it did not produce, [`FOREIGN_CALL_SIGNATURE`]: Gemini 3
//!   refuses a call without a signature in the current turn ("Function call is missing a
//!   thought_signature").
//! - The tool results that follow a turn are ONE `user` content of `functionResponse` parts,
//!   in the order of the calls. `response` must be an object: an object result goes as it is,
//!   anything else as `{"result": value}`.
//! - A call's arguments are sent as the object they are; arguments that are not a JSON object
//!   (a turn from another wire can hold invalid JSON) go as `{"arguments": "<raw text>"}`.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::{Inner, PROVIDER};
use crate::{
    ToolSpec,
    model::{Message, ModelError, ModelRequest, Part, ToolChoice, state_goes_to},
};

/// The signature Google documents for function calls that Gemini did not produce (history
/// from another model, calls injected by the application): it tells Gemini 3 to skip the
/// signature check for that call.
pub(super) const FOREIGN_CALL_SIGNATURE: &str = "skip_thought_signature_validator";

impl Inner {
    /// The request body for `request`.
    pub(super) fn body(&self, request: &ModelRequest) -> Result<Value, ModelError> {
        let mut body = Map::new();
        body.insert("contents".into(), Value::Array(contents(request.messages.iter())));
        if !request.system.is_empty() {
            body.insert("systemInstruction".into(), json!({"parts": [{"text": &*request.system}]}));
        }
        if !request.tools.is_empty() {
            let declarations = request.tools.iter().map(function_declaration).collect::<Result<Vec<_>, _>>()?;
            body.insert("tools".into(), json!([{"functionDeclarations": declarations}]));
            let calling = match request.output.as_ref().map(|o| &o.tool_choice) {
                Some(ToolChoice::Required) => Some(json!({"mode": "ANY"})),
                Some(ToolChoice::Tool { name }) => Some(json!({"mode": "ANY", "allowedFunctionNames": [name]})),
                Some(ToolChoice::Auto) | None => None,
            };
            if let Some(calling) = calling {
                body.insert("toolConfig".into(), json!({"functionCallingConfig": calling}));
            }
        }
        let mut config = Map::new();
        if let Some(output) = request.output.as_ref().filter(|o| o.is_native()) {
            // `responseJsonSchema` takes JSON Schema as it is (`$ref`, `additionalProperties`),
            // unlike `parameters`.
            config.insert("responseMimeType".into(), json!("application/json"));
            config.insert("responseJsonSchema".into(), output.plain_schema());
        }
        if let Some(n) = self.max_output_tokens {
            config.insert("maxOutputTokens".into(), json!(n));
        }
        if let Some(t) = self.temperature {
            config.insert("temperature".into(), json!(t));
        }
        let mut thinking = Map::new();
        if let Some(budget) = self.thinking_budget {
            thinking.insert("thinkingBudget".into(), json!(budget));
        }
        if let Some(level) = &self.thinking_level {
            thinking.insert("thinkingLevel".into(), json!(level));
        }
        if !thinking.is_empty() {
            // A budget of 0 turns thinking off: there are no thoughts to ask for.
            if self.thinking_budget != Some(0) {
                thinking.insert("includeThoughts".into(), json!(true));
            }
            config.insert("thinkingConfig".into(), Value::Object(thinking));
        }
        if !config.is_empty() {
            body.insert("generationConfig".into(), Value::Object(config));
        }
        Ok(Value::Object(body))
    }
}

/// The transcript as `contents`.
fn contents<'a>(messages: impl Iterator<Item = &'a Message>) -> Vec<Value> {
    let mut out = Vec::new();
    // Gemini's own call ids, by the call id the runtime knows, so a result carries the id
    // only when the call did.
    let mut provider_ids: HashMap<&str, &str> = HashMap::new();
    // The `functionResponse` parts of the results being gathered into one content.
    let mut responses: Vec<Value> = Vec::new();
    let flush = |responses: &mut Vec<Value>, out: &mut Vec<Value>| {
        if !responses.is_empty() {
            out.push(json!({"role": "user", "parts": std::mem::take(responses)}));
        }
    };
    for message in messages {
        match message {
            Message::User { content } => {
                flush(&mut responses, &mut out);
                out.push(json!({"role": "user", "parts": [{"text": content}]}));
            }
            Message::Assistant { parts, origin } => {
                flush(&mut responses, &mut out);
                let own = state_goes_to(origin.as_ref(), PROVIDER);
                let encoded = if own { own_parts(parts, &mut provider_ids) } else { foreign_parts(parts) };
                // Gemini refuses a content without parts (a turn that said nothing).
                if !encoded.is_empty() {
                    out.push(json!({"role": "model", "parts": encoded}));
                }
            }
            Message::Tool { call_id, name, content } => {
                let mut response = Map::new();
                response.insert("name".into(), json!(name));
                if let Some(id) = provider_ids.get(call_id.as_str()) {
                    response.insert("id".into(), json!(id));
                }
                let value = match content {
                    Value::Object(_) => content.clone(),
                    other => json!({"result": other}),
                };
                response.insert("response".into(), value);
                responses.push(json!({"functionResponse": response}));
            }
        }
    }
    flush(&mut responses, &mut out);
    out
}

/// The parts of a turn Gemini produced: everything, as it came.
fn own_parts<'a>(parts: &'a [Part], provider_ids: &mut HashMap<&'a str, &'a str>) -> Vec<Value> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let (mut wire, signature) = match part {
            Part::Text { text, signature, .. } if !text.is_empty() || signature.is_some() => {
                (json!({"text": text}), signature)
            }
            Part::Reasoning { text, signature, .. } if !text.is_empty() => {
                (json!({"text": text, "thought": true}), signature)
            }
            // A signature-only part, as it came: empty text, no thought flag.
            Part::Reasoning { signature: signature @ Some(_), .. } => (json!({"text": ""}), signature),
            Part::ToolCall { call, signature, id } => {
                let mut function = Map::new();
                function.insert("name".into(), json!(call.name));
                function.insert("args".into(), arguments(&call.arguments));
                if let Some(id) = id {
                    function.insert("id".into(), json!(id));
                    provider_ids.insert(&call.call_id, id);
                }
                (json!({"functionCall": function}), signature)
            }
            // Empty text, and what Gemini never sends.
            Part::Text { .. } | Part::Reasoning { .. } | Part::RedactedReasoning { .. } => continue,
        };
        if let Some(signature) = signature {
            wire["thoughtSignature"] = json!(signature);
        }
        out.push(wire);
    }
    out
}

/// The parts of another provider's turn: its text and calls only.
fn foreign_parts(parts: &[Part]) -> Vec<Value> {
    let mut out = Vec::with_capacity(parts.len());
    let mut first_call = true;
    for part in parts {
        match part {
            Part::Text { text, .. } if !text.is_empty() => out.push(json!({"text": text})),
            Part::ToolCall { call, .. } => {
                let mut wire = json!({"functionCall": {"name": call.name, "args": arguments(&call.arguments)}});
                if std::mem::take(&mut first_call) {
                    wire["thoughtSignature"] = json!(FOREIGN_CALL_SIGNATURE);
                }
                out.push(wire);
            }
            Part::Text { .. } | Part::Reasoning { .. } | Part::RedactedReasoning { .. } => {}
        }
    }
    out
}

/// A call's raw argument text as the object `functionCall.args` must be.
fn arguments(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(object @ Value::Object(_)) => object,
        _ if raw.trim().is_empty() => json!({}),
        _ => json!({"arguments": raw}),
    }
}

/// One `functionDeclarations` entry. A tool without arguments has no `parameters`: Gemini
/// refuses an object schema without properties.
fn function_declaration(spec: &ToolSpec) -> Result<Value, ModelError> {
    let mut declaration = json!({"name": spec.name, "description": spec.description});
    let parameters = parameters(&spec.name, &spec.input_schema)?;
    let empty = parameters.get("properties").and_then(Value::as_object).is_none_or(Map::is_empty)
        && parameters.get("anyOf").is_none();
    if !empty {
        declaration["parameters"] = parameters;
    }
    Ok(declaration)
}

/// Keywords of Gemini's `Schema` (an OpenAPI 3.0 subset) kept from a JSON Schema. Everything
/// else is dropped: the API refuses unknown fields (`$schema`, `additionalProperties`,
/// `const`, `$ref`, ...) with a 400. Dropping narrows nothing the model is told, except an
/// open map's value schema, which `parameters` cannot express.
const KEPT: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "items",
    "properties",
    "required",
    "anyOf",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "minProperties",
    "maxProperties",
];

/// A tool's JSON Schema as Gemini's `parameters`: `$ref`s inlined from `$defs` (a recursive
/// one is refused with [`ModelError::InvalidRequest`], `parameters` has no references),
/// `["T", "null"]` types and `anyOf` with a `null` branch as `nullable: true`, `oneOf` as
/// `anyOf`, `allOf` merged, a string `const` as a one-value `enum`, `format`s only where
/// Gemini knows them, and every other keyword dropped (see [`KEPT`]).
pub(super) fn parameters(tool: &str, schema: &Value) -> Result<Value, ModelError> {
    let defs = Defs { root: schema };
    let mut stack = Vec::new();
    convert(schema, &defs, &mut stack, "").map_err(|e| ModelError::InvalidRequest(format!("tool `{tool}`: {e}")))
}

struct Defs<'a> {
    root: &'a Value,
}

impl<'a> Defs<'a> {
    /// The schema `reference` (`#/$defs/Name`, `#/definitions/Name`, or any pointer into the
    /// root) points at.
    fn get(&self, reference: &str) -> Option<&'a Value> {
        let pointer = reference.strip_prefix('#')?;
        self.root.pointer(pointer)
    }
}

fn convert(node: &Value, defs: &Defs<'_>, stack: &mut Vec<String>, path: &str) -> Result<Value, String> {
    let Value::Object(source) = node else {
        // `true` (anything) or a malformed node: no constraint Gemini can state.
        return Ok(json!({}));
    };
    // `$ref`: the target, with the referring node's own keywords (a description) on top.
    if let Some(reference) = source.get("$ref").and_then(Value::as_str) {
        if stack.iter().any(|r| r == reference) {
            return Err(format!("`parameters` cannot express the recursive schema `{reference}` at `{path}`"));
        }
        let target = defs.get(reference).ok_or_else(|| format!("`{reference}` at `{path}` points at nothing"))?;
        stack.push(reference.to_owned());
        let inlined = convert(target, defs, stack, path);
        stack.pop();
        let mut merged = inlined?;
        let mut rest = source.clone();
        rest.remove("$ref");
        if let (Value::Object(m), Value::Object(own)) = (&mut merged, convert(&Value::Object(rest), defs, stack, path)?)
        {
            m.extend(own);
        }
        return Ok(merged);
    }
    let mut map = source.clone();
    // `allOf`: one schema with every branch's keywords (properties and `required` joined).
    if let Some(Value::Array(branches)) = map.remove("allOf") {
        for (i, branch) in branches.iter().enumerate() {
            let Value::Object(branch) = convert(branch, defs, stack, &format!("{path}/allOf/{i}"))? else { continue };
            for (key, value) in branch {
                match (key.as_str(), map.get_mut(&key), value) {
                    ("properties", Some(Value::Object(mine)), Value::Object(theirs)) => mine.extend(theirs),
                    ("required", Some(Value::Array(mine)), Value::Array(theirs)) => mine.extend(theirs),
                    (_, Some(_), _) => {}
                    (_, None, value) => {
                        map.insert(key, value);
                    }
                }
            }
        }
    }
    if let Some(one_of) = map.remove("oneOf") {
        map.entry("anyOf").or_insert(one_of);
    }
    let mut out = Map::new();
    let mut nullable = false;
    // `type`: one name; `null` among several becomes `nullable`.
    match map.get("type") {
        Some(Value::String(t)) if t == "null" => nullable = true,
        Some(Value::String(t)) => {
            out.insert("type".into(), json!(t));
        }
        Some(Value::Array(types)) => {
            let named: Vec<&str> = types.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect();
            nullable = named.len() < types.len();
            match named.as_slice() {
                [] => {}
                [one] => {
                    out.insert("type".into(), json!(one));
                }
                several => {
                    out.insert("anyOf".into(), Value::Array(several.iter().map(|t| json!({"type": t})).collect()));
                }
            }
        }
        _ => {}
    }
    if let Some(value) = map.get("const") {
        match value {
            Value::String(_) => {
                out.insert("type".into(), json!("string"));
                out.insert("enum".into(), json!([value]));
            }
            Value::Null => nullable = true,
            _ => {}
        }
    }
    if let Some(Value::Array(values)) = map.get("enum") {
        // Gemini's enums are string enums; a `null` member makes the field nullable.
        nullable |= values.contains(&Value::Null);
        let strings: Vec<&Value> = values.iter().filter(|v| v.is_string()).collect();
        if !strings.is_empty() && strings.len() + usize::from(values.contains(&Value::Null)) == values.len() {
            out.insert("type".into(), json!("string"));
            out.insert("enum".into(), json!(strings));
        }
    }
    for key in KEPT {
        let Some(value) = map.get(*key) else { continue };
        match *key {
            "type" | "enum" | "nullable" => {}
            "format" => {
                let ty = out.get("type").and_then(Value::as_str).unwrap_or("");
                if let Some(format) = value.as_str()
                    && known_format(ty, format)
                {
                    out.insert("format".into(), json!(format));
                }
            }
            "properties" => {
                let Value::Object(properties) = value else { continue };
                let mut converted = Map::new();
                for (name, property) in properties {
                    let child = format!("{path}/properties/{}", name.replace('~', "~0").replace('/', "~1"));
                    converted.insert(name.clone(), convert(property, defs, stack, &child)?);
                }
                out.insert("properties".into(), Value::Object(converted));
            }
            "items" => {
                out.insert("items".into(), convert(value, defs, stack, &format!("{path}/items"))?);
            }
            "anyOf" => {
                let Value::Array(branches) = value else { continue };
                let mut converted = Vec::with_capacity(branches.len());
                for (i, branch) in branches.iter().enumerate() {
                    let branch = convert(branch, defs, stack, &format!("{path}/anyOf/{i}"))?;
                    if is_null_only(&branch) {
                        nullable = true;
                    } else {
                        converted.push(branch);
                    }
                }
                match converted.len() {
                    0 => {}
                    // `Option<T>` is `anyOf [T, null]`: T itself, nullable.
                    1 => {
                        if let Some(Value::Object(only)) = converted.pop() {
                            for (k, v) in only {
                                out.entry(k).or_insert(v);
                            }
                        }
                    }
                    _ => {
                        out.insert("anyOf".into(), Value::Array(converted));
                    }
                }
            }
            "required" => {
                // Only names that are properties: Gemini refuses the others.
                let names = map.get("properties").and_then(Value::as_object);
                let required: Vec<&Value> = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|n| n.as_str().is_some_and(|n| names.is_some_and(|p| p.contains_key(n))))
                    .collect();
                if !required.is_empty() {
                    out.insert("required".into(), json!(required));
                }
            }
            _ => {
                out.insert((*key).to_owned(), value.clone());
            }
        }
    }
    if nullable || map.get("nullable") == Some(&Value::Bool(true)) {
        out.insert("nullable".into(), json!(true));
    }
    Ok(Value::Object(out))
}

/// Whether a converted schema admits only `null` (the `null` branch of an `anyOf`).
fn is_null_only(schema: &Value) -> bool {
    schema.as_object().is_some_and(|m| m.len() == 1 && m.get("nullable") == Some(&Value::Bool(true)))
}

/// The `format`s Gemini's `Schema` documents, per type; others are refused by the API.
fn known_format(ty: &str, format: &str) -> bool {
    matches!(
        (ty, format),
        ("string", "enum" | "date-time") | ("integer", "int32" | "int64") | ("number", "float" | "double")
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn schemas_become_the_openapi_subset() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "city": {"type": "string", "description": "City name", "default": "Oslo"},
                "units": {"type": ["string", "null"], "enum": ["metric", "imperial", null]},
                "days": {"type": "integer", "format": "uint32", "minimum": 0, "maximum": 14},
                "at": {"type": "string", "format": "date-time"},
                "kind": {"const": "forecast"},
                "place": {"$ref": "#/$defs/Place", "description": "Where"},
                "maybe": {"anyOf": [{"$ref": "#/$defs/Place"}, {"type": "null"}]},
                "either": {"oneOf": [{"type": "string"}, {"type": "integer", "format": "int64"}]},
                "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                "both": {"allOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                    {"properties": {"b": {"type": "number"}}, "required": ["b"]}
                ]}
            },
            "required": ["city", "ghost"],
            "$defs": {"Place": {"type": "object", "properties": {"lat": {"type": "number", "format": "double"}}, "required": ["lat"]}}
        });
        let got = parameters("weather", &schema).unwrap();
        let place = json!({"type": "object", "properties": {"lat": {"type": "number", "format": "double"}}, "required": ["lat"]});
        let mut described = place.clone();
        described["description"] = json!("Where");
        let mut maybe = place.clone();
        maybe["nullable"] = json!(true);
        assert_eq!(
            got,
            json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "units": {"type": "string", "enum": ["metric", "imperial"], "nullable": true},
                    "days": {"type": "integer", "minimum": 0, "maximum": 14},
                    "at": {"type": "string", "format": "date-time"},
                    "kind": {"type": "string", "enum": ["forecast"]},
                    "place": described,
                    "maybe": maybe,
                    "either": {"anyOf": [{"type": "string"}, {"type": "integer", "format": "int64"}]},
                    "tags": {"type": "object"},
                    "both": {
                        "type": "object",
                        "properties": {"a": {"type": "string"}, "b": {"type": "number"}},
                        "required": ["a", "b"]
                    }
                },
                "required": ["city"]
            })
        );
    }

    #[test]
    fn recursive_and_dangling_references_are_refused() {
        let recursive = json!({
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}
        });
        let err = parameters("walk", &recursive).unwrap_err();
        assert!(
            matches!(&err, ModelError::InvalidRequest(m) if m.contains("walk") && m.contains("recursive") && m.contains("/properties/tree/properties/children/items")),
            "{err}"
        );
        let dangling = json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}});
        assert!(
            matches!(parameters("t", &dangling), Err(ModelError::InvalidRequest(m)) if m.contains("points at nothing"))
        );
    }

    #[test]
    fn a_tool_without_arguments_has_no_parameters() {
        let spec = |schema| ToolSpec {
            name: "now".into(),
            description: "The time.".into(),
            input_schema: schema,
            output_schema: None,
        };
        for schema in
            [json!({"type": "object"}), json!({"type": "object", "properties": {}, "additionalProperties": false})]
        {
            assert_eq!(
                function_declaration(&spec(schema)).unwrap(),
                json!({"name": "now", "description": "The time."})
            );
        }
    }

    #[test]
    fn arguments_are_always_an_object() {
        assert_eq!(arguments(r#"{"a": 1}"#), json!({"a": 1}));
        assert_eq!(arguments(""), json!({}));
        assert_eq!(arguments(r#"{"city": "Ro"#), json!({"arguments": r#"{"city": "Ro"#}));
        assert_eq!(arguments("[1]"), json!({"arguments": "[1]"}));
    }
}
