//! Arguments → a tool's input struct, with errors that name the field.
//!
//! This module holds the `Value` path, which every error comes from; [`raw`] reads the
//! model's text straight into the fields when it can, and hands everything else to this path.
//!
//! `#[tool]` does not derive `Deserialize` for its input struct: serde's derive (a visitor, a
//! field enum, sequence and map paths) was about half of what a tool cost to compile. The
//! macro writes a table of the argument names ([`ArgTable`]) and one call of [`arg`] per
//! field instead. [`match_args`] (not generic) pairs the object's entries with the names and
//! refuses unknown ones; [`arg`] (generic over the field's type only, so shared by every tool
//! with a field of that type) deserializes one value straight from the `Value`, and only when
//! that fails runs it again under `serde_path_to_error` to name the nested path. The messages
//! are the ones `serde_path_to_error::deserialize` gives for a derived struct: the key for an
//! error in a field's value and the path below it, nothing for errors of the struct itself
//! (`missing field`). Errors are reported unknown fields first, then in declaration order.
//!
//! Tools whose params carry `#[serde(...)]` or `#[schemars(...)]` attributes keep the derives
//! (those attributes change what is accepted) and go through [`parse_input`], which is generic
//! over the whole input struct. There the top level is a minimal map deserializer whose methods
//! are one-line shims around non-generic code; only the field *values* go through
//! `serde_path_to_error`.

use schemars::{Schema, SchemaGenerator};
use serde::de::{self, DeserializeOwned, DeserializeSeed, Error as _, Visitor, value::BorrowedStrDeserializer};
use serde_json::{Map, Value, map::Iter};

use crate::error::ToolError;

mod raw;
mod scalar;
pub(crate) mod text;

pub use raw::{RawArg, match_raw_args, raw_arg};

/// The model-facing arguments of a `#[tool]` fn, in declaration order, as the macro writes
/// them into a `static`: JSON names, doc comments, and how to build each one's schema.
#[derive(Debug)]
pub struct ArgTable {
    /// The JSON property names.
    pub names: &'static [&'static str],
    /// Each argument's doc comment (lines joined with `\n`, one leading space stripped, as
    /// schemars' derive reads them); empty when it has none.
    pub docs: &'static [&'static str],
    /// Each argument's schema and whether it may be left out.
    pub schemas: &'static [ArgSchema],
}

/// Builds one argument's schema, and says whether the argument may be left out.
pub type ArgSchema = fn(&mut SchemaGenerator) -> (Schema, bool);

/// Pairs the entries of the arguments object with `table`'s names: `slots[i]` receives the
/// value of `table.names[i]`, if present.
///
/// # Errors
/// [`ToolError::InvalidInput`] when `args` is not an object or holds a name not in `table`.
pub fn match_args<'a>(
    tool: &str,
    args: &'a Value,
    table: &ArgTable,
    slots: &mut [Option<&'a Value>],
) -> Result<(), ToolError> {
    let map = object(tool, args)?;
    for (key, value) in map {
        match table.names.iter().position(|name| name == key) {
            Some(i) => slots[i] = Some(value),
            None => {
                let error = serde_json::Error::unknown_field(key, table.names);
                return Err(invalid_input(tool, Some(key.clone()), &error));
            }
        }
    }
    Ok(())
}

/// Deserializes argument `name` from its value, or from its absence (which only an `Option`
/// accepts, as `None`).
///
/// # Errors
/// [`ToolError::InvalidInput`] naming the field and the path inside it.
pub fn arg<T: DeserializeOwned>(tool: &str, name: &'static str, value: Option<&Value>) -> Result<T, ToolError> {
    let Some(value) = value else {
        return T::deserialize(Missing(name)).map_err(|e| invalid_input(tool, None, &e));
    };
    match T::deserialize(value) {
        Ok(v) => Ok(v),
        // Deserialization is deterministic: the tracked run fails the same way, with the path.
        Err(e) => Err(match serde_path_to_error::deserialize::<_, T>(value) {
            Err(tracked) => invalid_input(tool, Some(joined(name, tracked.path())), tracked.inner()),
            Ok(_) => invalid_input(tool, Some(name.to_owned()), &e),
        }),
    }
}

/// `name` followed by the path inside its value, formatted as `serde_path_to_error::Path`.
fn joined(name: &str, path: &serde_path_to_error::Path) -> String {
    let mut out = name.to_owned();
    for segment in path {
        if !matches!(segment, serde_path_to_error::Segment::Seq { .. }) {
            out.push('.');
        }
        out.push_str(&segment.to_string());
    }
    out
}

/// An absent field, as serde's derive sees it: `None` for an `Option`, else `missing field`.
struct Missing(&'static str);

impl<'de> de::Deserializer<'de> for Missing {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde_json::Error::missing_field(self.0))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_none()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// Validates raw arguments into a tool's input struct. The message names the field:
/// `` `units`: unknown variant `kelvin`, expected `celsius` or `fahrenheit` ``.
///
/// # Errors
/// [`ToolError::InvalidInput`].
pub fn parse_input<T: DeserializeOwned>(tool: &str, args: &Value) -> Result<T, ToolError> {
    let map = object(tool, args)?;
    let mut path = None;
    let result = T::deserialize(Args { map, path: &mut path });
    match result {
        Ok(input) => Ok(input),
        Err(e) => Err(invalid_input(tool, path, &e)),
    }
}

fn object<'a>(tool: &str, args: &'a Value) -> Result<&'a Map<String, Value>, ToolError> {
    match args {
        Value::Object(map) => Ok(map),
        _ => Err(ToolError::invalid_input(
            tool,
            format!("the arguments must be a JSON object, not {}", text::kind(args)),
        )),
    }
}

fn invalid_input(tool: &str, path: Option<String>, error: &serde_json::Error) -> ToolError {
    let message = match path {
        Some(path) => format!("`{path}`: {error}"),
        None => error.to_string(),
    };
    ToolError::invalid_input(tool, message)
}

/// The arguments object as a deserializer: always a map. `path` receives the path of the
/// first error raised below a key.
struct Args<'a> {
    map: &'a Map<String, Value>,
    path: &'a mut Option<String>,
}

impl<'de> de::Deserializer<'de> for Args<'de> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_map(Entries::new(self))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

struct Entries<'a> {
    iter: Iter<'a>,
    pending: Option<(&'a String, &'a Value)>,
    path: &'a mut Option<String>,
}

impl<'de> de::MapAccess<'de> for Entries<'de> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        let Some(key) = self.advance() else { return Ok(None) };
        let key = BorrowedStrDeserializer::<serde_json::Error>::new(key);
        match seed.deserialize(key) {
            Ok(key) => Ok(Some(key)),
            Err(e) => Err(self.key_error(e)),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Self::Error> {
        let value = self.value();
        let mut track = serde_path_to_error::Track::new();
        match seed.deserialize(serde_path_to_error::Deserializer::new(value, &mut track)) {
            Ok(value) => Ok(value),
            Err(e) => Err(self.value_error(e, track)),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

impl<'a> Entries<'a> {
    fn new(args: Args<'a>) -> Self {
        Self { iter: args.map.iter(), pending: None, path: args.path }
    }

    fn advance(&mut self) -> Option<&'a String> {
        let (key, value) = self.iter.next()?;
        self.pending = Some((key, value));
        Some(key)
    }

    fn value(&mut self) -> &'a Value {
        // serde calls `next_value_seed` only after `next_key_seed` returned a key.
        self.pending.map_or(&Value::Null, |(_, value)| value)
    }

    fn key(&self) -> String {
        self.pending.map(|(key, _)| key.clone()).unwrap_or_default()
    }

    fn key_error(&mut self, error: serde_json::Error) -> serde_json::Error {
        *self.path = Some(self.key());
        error
    }

    /// `key` followed by the path inside the value, formatted as `serde_path_to_error::Path`.
    fn value_error(&mut self, error: serde_json::Error, track: serde_path_to_error::Track) -> serde_json::Error {
        *self.path = Some(joined(&self.key(), &track.path()));
        error
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Units {
        Celsius,
        Fahrenheit,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only deserialized
    struct Place {
        lat: f64,
        tags: Vec<Tag>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // only deserialized
    enum Tag {
        Name(String),
        Point { x: u8 },
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized
    struct Input {
        city: String,
        units: Option<Units>,
        #[serde(default)]
        days: u8,
        place: Option<Place>,
        #[serde(rename = "list")]
        items: Option<Vec<Vec<i32>>>,
        map: Option<std::collections::BTreeMap<String, u8>>,
    }

    /// What `parse_input` did before it stopped wrapping the whole deserializer.
    fn reference(args: &Value) -> Result<Input, String> {
        serde_path_to_error::deserialize(args).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." { inner.to_string() } else { format!("`{path}`: {inner}") }
        })
    }

    fn cases() -> Vec<Value> {
        vec![
            json!({"city": "Paris"}),
            json!({"city": "Paris", "units": "celsius", "days": 3, "list": [[1], [2, 3]]}),
            json!({}),
            json!({"city": 5}),
            json!({"city": null}),
            json!({"city": "Paris", "x": 1}),
            json!({"city": "Paris", "units": "kelvin"}),
            json!({"city": "Paris", "days": 300}),
            json!({"city": "Paris", "days": -1}),
            json!({"city": "Paris", "place": {"lat": "north"}}),
            json!({"city": "Paris", "place": {"lat": 1.0}}),
            json!({"city": "Paris", "place": {"lat": 1.0, "tags": [{"Name": "a"}, {"Point": {"x": "y"}}]}}),
            json!({"city": "Paris", "place": {"lat": 1.0, "tags": [{"Nope": 1}]}}),
            json!({"city": "Paris", "place": [1.0, []]}),
            json!({"city": "Paris", "list": [[1], [2, "3"]]}),
            json!({"city": "Paris", "list": {}}),
            json!({"city": "Paris", "map": {"a": 1, "b": "c"}}),
            json!({"city": "Paris", "map": {"a": 1, "b": 2}}),
            json!({"city": "Paris", "list": null}),
        ]
    }

    #[test]
    fn messages_match_serde_path_to_error() {
        for args in cases() {
            let ours = parse_input::<Input>("t", &args).map_err(|e| match e {
                ToolError::InvalidInput { message, .. } => message,
                other => panic!("{other:?}"),
            });
            let expected = reference(&args);
            assert_eq!(format!("{ours:?}"), format!("{expected:?}"), "{args}");
        }
    }

    /// What `#[tool]` writes for a tool with the params of [`Plain`] and no serde attributes.
    fn lean(args: &Value) -> Result<Plain, ToolError> {
        static TABLE: ArgTable =
            ArgTable { names: &["city", "units", "place", "list", "map"], docs: &["", "", "", "", ""], schemas: &[] };
        let mut slots = [None; 5];
        match_args("t", args, &TABLE, &mut slots)?;
        Ok(Plain {
            city: arg("t", "city", slots[0])?,
            units: arg("t", "units", slots[1])?,
            place: arg("t", "place", slots[2])?,
            list: arg("t", "list", slots[3])?,
            map: arg("t", "map", slots[4])?,
        })
    }

    /// The same fields, derived as the input struct of a tool with serde attributes is.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // only deserialized
    struct Plain {
        city: String,
        units: Option<Units>,
        place: Option<Place>,
        list: Option<Vec<Vec<i32>>>,
        map: Option<std::collections::BTreeMap<String, u8>>,
    }

    #[test]
    fn the_lean_parse_says_what_the_derive_says() {
        let mut cases = cases();
        cases.extend([json!({}), json!({"x": 1}), json!([1]), json!({"city": "Paris", "units": null})]);
        for args in cases {
            let ours = lean(&args).map_err(|e| match e {
                ToolError::InvalidInput { message, .. } => message,
                other => panic!("{other:?}"),
            });
            let expected = match &args {
                Value::Object(_) => serde_path_to_error::deserialize::<_, Plain>(&args).map_err(|e| {
                    let path = e.path().to_string();
                    let inner = e.into_inner();
                    if path == "." { inner.to_string() } else { format!("`{path}`: {inner}") }
                }),
                _ => Err("the arguments must be a JSON object, not an array".to_owned()),
            };
            assert_eq!(format!("{ours:?}"), format!("{expected:?}"), "{args}");
        }
    }
}
