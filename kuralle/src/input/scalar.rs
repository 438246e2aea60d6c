//! One argument's value from its text, with the commonest scalars read directly.
//!
//! `serde_json::from_str` sets up a parser for each field and checks what trails the value;
//! for an integer, a plain string, a boolean or `null` that was most of a field's cost (an
//! `i64` field 139 instructions, of which the number itself is about 40). [`Scalar`] reads
//! those straight from the text when it is exactly one of them in JSON's own grammar, and
//! hands everything else (floats, escapes, arrays, objects, anything it does not vouch for)
//! to `serde_json` with the whole text, so the answer is always `serde_json`'s.

use serde::de::{self, Visitor};

/// The text of one JSON value, as a deserializer.
pub(super) struct Scalar<'a>(pub(super) &'a str);

impl<'a> Scalar<'a> {
    /// `serde_json`'s answer for the whole text: the value, then nothing but whitespace.
    fn json<V, F>(self, read: F) -> Result<V, serde_json::Error>
    where
        F: FnOnce(&mut serde_json::Deserializer<serde_json::de::StrRead<'a>>) -> Result<V, serde_json::Error>,
    {
        let mut de = serde_json::Deserializer::from_str(self.0);
        let value = read(&mut de)?;
        de.end()?;
        Ok(value)
    }

    /// The text as a JSON integer (`0|-?[1-9][0-9]*`), or `None`. (`serde_json` reads `-0` as
    /// a float.)
    fn integer(&self) -> Option<&'a str> {
        let negative = self.0.starts_with('-');
        let digits = self.0.strip_prefix('-').unwrap_or(self.0).as_bytes();
        let well_formed = match digits {
            [] => false,
            [b'0'] => !negative,
            [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
            _ => false,
        };
        well_formed.then_some(self.0)
    }

    /// The text of a JSON string without escapes or control characters, unquoted, or `None`.
    fn plain_string(&self) -> Option<&'a str> {
        let inner = self.0.strip_prefix('"')?.strip_suffix('"')?;
        (!inner.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)).then_some(inner)
    }
}

/// `deserialize_<int>` methods: the integer read directly when the text is one and fits,
/// else `serde_json`'s answer.
macro_rules! integers {
    ($($method:ident $ty:ty => $visit:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            match self.integer().and_then(|text| text.parse::<$ty>().ok()) {
                Some(n) => visitor.$visit(n),
                None => self.json(|de| de::Deserializer::$method(de, visitor)),
            }
        }
    )*};
}

/// Methods with nothing to read directly: `serde_json`'s answer for the whole text.
macro_rules! forwarded {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.json(|de| de::Deserializer::$method(de, visitor))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Scalar<'de> {
    type Error = serde_json::Error;

    integers! {
        deserialize_i8 i8 => visit_i8, deserialize_i16 i16 => visit_i16,
        deserialize_i32 i32 => visit_i32, deserialize_i64 i64 => visit_i64,
        deserialize_u8 u8 => visit_u8, deserialize_u16 u16 => visit_u16,
        deserialize_u32 u32 => visit_u32, deserialize_u64 u64 => visit_u64
    }

    forwarded! {
        deserialize_any, deserialize_i128, deserialize_u128, deserialize_f32, deserialize_f64,
        deserialize_char, deserialize_bytes, deserialize_byte_buf, deserialize_unit,
        deserialize_seq, deserialize_map, deserialize_identifier, deserialize_ignored_any
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            "true" => visitor.visit_bool(true),
            "false" => visitor.visit_bool(false),
            _ => self.json(|de| de::Deserializer::deserialize_bool(de, visitor)),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.plain_string() {
            Some(text) => visitor.visit_borrowed_str(text),
            None => self.json(|de| de::Deserializer::deserialize_str(de, visitor)),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        // `serde_json` reads a `String` as it reads a `str`.
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            "null" => visitor.visit_none(),
            // What `serde_json` does for anything but `null`: the same text, as the inner type.
            text if !text.starts_with(['n', ' ', '\t', '\n', '\r']) => visitor.visit_some(self),
            _ => self.json(|de| de::Deserializer::deserialize_option(de, visitor)),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        self.json(|de| de::Deserializer::deserialize_unit_struct(de, name, visitor))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.json(|de| de::Deserializer::deserialize_newtype_struct(de, name, visitor))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Self::Error> {
        self.json(|de| de::Deserializer::deserialize_tuple(de, len, visitor))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.json(|de| de::Deserializer::deserialize_tuple_struct(de, name, len, visitor))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.json(|de| de::Deserializer::deserialize_struct(de, name, fields, visitor))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.json(|de| de::Deserializer::deserialize_enum(de, name, variants, visitor))
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use proptest::prelude::*;
    use serde::de::DeserializeOwned;

    use super::*;

    /// `Scalar` and `serde_json::from_str` give the same value, or both refuse.
    fn agree<T: DeserializeOwned + PartialEq + Debug>(text: &str) -> Result<(), TestCaseError> {
        let ours = T::deserialize(Scalar(text)).ok();
        let theirs = serde_json::from_str::<T>(text).ok();
        prop_assert_eq!(ours, theirs, "{:?} as {}", text, std::any::type_name::<T>());
        Ok(())
    }

    fn all(text: &str) -> Result<(), TestCaseError> {
        agree::<i64>(text)?;
        agree::<i8>(text)?;
        agree::<u8>(text)?;
        agree::<u32>(text)?;
        agree::<u64>(text)?;
        agree::<i128>(text)?;
        agree::<f64>(text)?;
        agree::<bool>(text)?;
        agree::<String>(text)?;
        agree::<char>(text)?;
        agree::<Option<String>>(text)?;
        agree::<Option<i64>>(text)?;
        agree::<Option<Option<u8>>>(text)?;
        agree::<Vec<i64>>(text)?;
        agree::<serde_json::Value>(text)?;
        agree::<()>(text)?;
        Ok(())
    }

    #[test]
    fn edge_cases_agree_with_serde_json() {
        for text in [
            "0",
            "-0",
            "00",
            "01",
            "-",
            "+1",
            "1",
            "-1",
            "255",
            "256",
            "-129",
            "127",
            "1.0",
            "1e2",
            " 1",
            "1 ",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "18446744073709551616",
            "true",
            "false",
            "True",
            "null",
            "nul",
            "nullx",
            "\"\"",
            "\"a\"",
            "\"a\\\"b\"",
            "\"\\u00e9\"",
            "\"\u{e9}\"",
            "\"\t\"",
            "\"a\" ",
            "\"a",
            "a\"",
            "\"",
            "[1,2]",
            "{}",
            "\"x\"\"",
        ] {
            all(text).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        #[test]
        fn generated_texts_agree_with_serde_json(text in "[-+0-9.eE\"\\\\a-z \t\u{e9}\\[\\],]{0,12}") {
            all(&text)?;
        }

        #[test]
        fn integers_agree_with_serde_json(n in any::<i64>(), wide in any::<u64>()) {
            all(&n.to_string())?;
            all(&wide.to_string())?;
        }
    }
}
