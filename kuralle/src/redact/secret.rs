//! `Secret<T>`: a value a tool needs that no display may show.

use std::{borrow::Cow, fmt};

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::REDACTED;

/// A sensitive value: a card number, a token, personal data.
///
/// On the wire it is `T` itself (the model sends it and, for a result, reads it as `T`), so
/// the schema, serde and the journal see no wrapper. A `#[tool]` parameter or result of this
/// type (or `Option<Secret<T>>` for a parameter) is shown as `"[redacted]"` in events, the
/// CLI, the console and exports; `Debug` and `Display` print `[redacted]` too, so a stray
/// `tracing::debug!(?input)` in a tool does not leak it. The journal keeps the value: a
/// resumed run needs it (see `docs/secrets.md`).
///
/// ```
/// use kuralle::Secret;
///
/// let card: Secret<String> = serde_json::from_str(r#""4242 4242 4242 4242""#).unwrap();
/// assert_eq!(format!("{card:?}"), "[redacted]");
/// assert_eq!(card.expose(), "4242 4242 4242 4242");
/// assert_eq!(serde_json::to_string(&card).unwrap(), r#""4242 4242 4242 4242""#);
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Secret<T>(T);

impl<T> Secret<T> {
    /// Wraps `value`.
    ///
    /// ```
    /// assert_eq!(kuralle::Secret::new(7).into_inner(), 7);
    /// ```
    pub const fn new(value: T) -> Self {
        Self(value)
    }

    /// The value, for the code that needs it.
    ///
    /// ```
    /// assert_eq!(*kuralle::Secret::new(7).expose(), 7);
    /// ```
    pub const fn expose(&self) -> &T {
        &self.0
    }

    /// The value, unwrapped.
    ///
    /// ```
    /// assert_eq!(kuralle::Secret::new("tok").into_inner(), "tok");
    /// ```
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Secret<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T> fmt::Display for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<T: Serialize> Serialize for Secret<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Secret<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Self)
    }
}

/// The schema of `T`: the model is asked for the value itself.
impl<T: JsonSchema> JsonSchema for Secret<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }

    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }

    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}
