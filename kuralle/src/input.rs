//! Raw arguments → a tool's input struct, with errors that name the field.
//!
//! Every `#[tool]` instantiates [`parse_input`] for its own input type, so what is generic
//! over that type is compiled once per tool. Wrapping the whole `&Value` deserializer in
//! `serde_path_to_error` (as `serde_path_to_error::deserialize(args)` does) instantiates both
//! deserializer stacks for every input struct, which made `#[tool]` cost ~100 ms of build time
//! per tool. Here the top level is a minimal map deserializer whose methods are one-line shims
//! around non-generic code; only the field *values* go through `serde_path_to_error`, and
//! those are instantiated per field type (`String`, `i64`, `Option<u8>` ...), which tools in a
//! crate share. The messages are the ones `serde_path_to_error::deserialize` gives: the key
//! for an error in a field's key or value, the nested path below it, nothing for errors of the
//! struct itself (`missing field`).

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor, value::BorrowedStrDeserializer};
use serde_json::{Map, Value, map::Iter};

use crate::ToolError;

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
            format!("the arguments must be a JSON object, not {}", crate::tool::kind(args)),
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
        let mut path = self.key();
        for segment in &track.path() {
            if !matches!(segment, serde_path_to_error::Segment::Seq { .. }) {
                path.push('.');
            }
            path.push_str(&segment.to_string());
        }
        *self.path = Some(path);
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

    #[test]
    fn messages_match_serde_path_to_error() {
        let cases = [
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
        ];
        for args in cases {
            let ours = parse_input::<Input>("t", &args).map_err(|e| match e {
                ToolError::InvalidInput { message, .. } => message,
                other => panic!("{other:?}"),
            });
            let expected = reference(&args);
            assert_eq!(format!("{ours:?}"), format!("{expected:?}"), "{args}");
        }
    }
}
