//! `JsonText`: a JSON value held as its text, for a run's state and its journal's values.

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{DeserializeOwned, IgnoredAny},
};
use std::sync::Arc;

use serde_json::Value;

/// The largest serialization buffer a thread keeps between calls: a larger one (a long
/// conversation's state) is given back.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

thread_local! {
    static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A JSON value held as JSON text: a run's state ([`RunRecord::state`](crate::RunRecord::state))
/// and a journal step's result or error ([`StepOutcome`](crate::StepOutcome),
/// [`StepRecord::result`](crate::StepRecord::result)).
///
/// A run's state holds its whole transcript. As text, the runtime writes it from its typed
/// state and reads it back in one pass each, with no [`Value`] tree in between (building,
/// measuring and freeing that tree was a sixth of a long run's instructions), and a store keeps
/// it in one allocation instead of one per string, array and object. A model response is
/// journaled the same way: written once from the typed response, measured by its length, and
/// read back on replay straight into the typed response.
///
/// The text is shared: a clone is a reference count, not a copy, so a store can hand out its
/// journal (10,000 steps on a long run) without copying a single value.
///
/// Two `JsonText`s are equal when they hold the same JSON value, whatever their key order or
/// spacing: PostgreSQL's `jsonb` gives keys back sorted.
///
/// ```
/// use kuralle::JsonText;
/// use serde_json::json;
///
/// let state = JsonText::from(json!({"turn": 1, "note": "ok"}));
/// assert_eq!(state.as_str(), r#"{"turn":1,"note":"ok"}"#);
/// assert_eq!(state, JsonText::parse(r#"{ "note": "ok", "turn": 1 }"#)?);
/// assert_eq!(state, json!({"turn": 1, "note": "ok"}));
/// assert_eq!(state.decode::<serde_json::Map<String, serde_json::Value>>()?.len(), 2);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone)]
pub struct JsonText(Arc<str>);

impl JsonText {
    /// `null`. One shared text: a run's record drops its state for it whenever the state is
    /// held decoded elsewhere, and that must not cost an allocation.
    ///
    /// ```
    /// # use kuralle::JsonText;
    /// assert_eq!(JsonText::null().as_str(), "null");
    /// ```
    pub fn null() -> Self {
        static NULL: std::sync::OnceLock<JsonText> = std::sync::OnceLock::new();
        NULL.get_or_init(|| Self(Arc::from("null"))).clone()
    }

    /// `value` serialized as compact JSON text.
    ///
    /// # Errors
    /// When `value`'s `Serialize` fails (a map with non-string keys, or an error of its own).
    pub fn serialize_from<T: Serialize + ?Sized>(value: &T) -> Result<Self, serde_json::Error> {
        // Written into a buffer this thread keeps, then copied once into the shared text: a
        // fresh string grew by doubling, three to six allocations for a response or a run's
        // state, every step. A `Serialize` that serializes a `JsonText` itself finds the
        // buffer taken and writes into a string of its own.
        let fresh = || serde_json::to_string(value).map(|text| Self(text.into()));
        let kept = BUFFER.try_with(|buffer| {
            let Ok(mut buffer) = buffer.try_borrow_mut() else { return fresh() };
            buffer.clear();
            let written = serde_json::to_writer(&mut *buffer, value);
            // serde_json writes UTF-8 only; were that ever not so, the caller hears of it.
            let text = written.and_then(|()| match std::str::from_utf8(&buffer) {
                Ok(text) => Ok(Self(text.into())),
                Err(e) => Err(serde::ser::Error::custom(e)),
            });
            if buffer.capacity() > KEPT_BUFFER_BYTES {
                *buffer = Vec::new();
            }
            text
        });
        // A thread that is ending has no buffer left to lend.
        kept.unwrap_or_else(|_| fresh())
    }

    /// `text`, checked to be one JSON value, kept as given (spacing included).
    ///
    /// # Errors
    /// When `text` is not one JSON value.
    pub fn parse(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        let text = text.into();
        // Checked without building it: one value, nothing but whitespace after it.
        serde_json::from_str::<IgnoredAny>(&text)?;
        Ok(Self(text.into()))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The length of the text in bytes: what a store's value size limit is checked against.
    pub fn len(&self) -> usize {
        self.as_str().len()
    }

    /// Whether the text is empty: never, since it holds one JSON value.
    pub fn is_empty(&self) -> bool {
        self.as_str().is_empty()
    }

    /// The value as a [`Value`] tree.
    pub fn to_value(&self) -> Value {
        // The text is one JSON value (checked when made), so it parses.
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }

    /// The value read straight from the text into `T`.
    ///
    /// # Errors
    /// When the value does not have `T`'s shape.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.as_str())
    }
}

impl From<Value> for JsonText {
    fn from(value: Value) -> Self {
        Self::from(&value)
    }
}

impl From<&Value> for JsonText {
    fn from(value: &Value) -> Self {
        // A `Value` always serializes: its map keys are strings.
        Self::serialize_from(value).unwrap_or_else(|_| Self("null".into()))
    }
}

impl Default for JsonText {
    fn default() -> Self {
        Self::null()
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.as_str() == other.as_str() || self.to_value() == other.to_value()
    }
}

impl PartialEq<Value> for JsonText {
    fn eq(&self, other: &Value) -> bool {
        self.to_value() == *other
    }
}

impl std::fmt::Debug for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for JsonText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // As the value it holds (the runtime never serializes a record; tools that print one
        // do, and they want the value, not a string of JSON).
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Through a `Value`, so any format (and `serde_json::from_value`) can produce one.
        Value::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::JsonText;

    /// A value whose `Serialize` serializes another into a `JsonText` while the thread's
    /// buffer is in use.
    struct Nested(u32);

    impl serde::Serialize for Nested {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let inner = if self.0 == 0 {
                JsonText::serialize_from(&json!({"leaf": true})).map_err(serde::ser::Error::custom)?
            } else {
                JsonText::serialize_from(&Nested(self.0 - 1)).map_err(serde::ser::Error::custom)?
            };
            serializer.serialize_str(inner.as_str())
        }
    }

    #[test]
    fn serializing_inside_a_serialization_and_after_a_large_one_gives_the_same_text() {
        let nested = JsonText::serialize_from(&Nested(2)).unwrap();
        let expected = serde_json::to_string(&Nested(2)).unwrap();
        assert_eq!(nested.as_str(), expected);
        let large = "x".repeat(100_000);
        assert_eq!(JsonText::serialize_from(&large).unwrap().as_str().len(), 100_002);
        assert_eq!(JsonText::serialize_from(&json!([1, "two"])).unwrap().as_str(), r#"[1,"two"]"#);
    }

    #[test]
    fn a_record_round_trips_through_serde_json_as_its_value() {
        let state = JsonText::from(json!({"b": [1, 2.5, null], "a": "é"}));
        let outer = serde_json::to_string(&json!({"x": 1})).unwrap();
        assert_eq!(outer, r#"{"x":1}"#);
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(text, r#"{"b":[1,2.5,null],"a":"é"}"#);
        let back: JsonText = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);
        let from_value: JsonText = serde_json::from_value(json!({"a": "é", "b": [1, 2.5, null]})).unwrap();
        assert_eq!(from_value, state, "key order does not matter");
        assert_ne!(from_value, JsonText::from(json!({"a": "é"})));
        assert!(JsonText::parse("{").is_err());
        assert!(JsonText::parse("1 2").is_err());
        assert_eq!(JsonText::default().as_str(), "null");
        let shared = state.clone();
        assert!(std::ptr::eq(shared.as_str(), state.as_str()), "a clone shares the text");
    }
}
