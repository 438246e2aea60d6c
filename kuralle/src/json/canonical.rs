//! Canonical JSON: the JSON Canonicalization Scheme (RFC 8785, JCS) that journal keys hash,
//! written from a `Value` or straight from raw JSON text, into a buffer or a hasher ([`Sink`]).

use std::{borrow::Cow, fmt};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Where canonical JSON is written: a hasher (keys) or a buffer ([`canonical_json`]).
pub(crate) trait Sink: std::io::Write + Sized {
    fn raw(&mut self, bytes: &[u8]) {
        // Both sinks are infallible in-memory writers.
        let _ = self.write_all(bytes);
    }

    /// A JSON string literal, escaped as `JSON.stringify` (and RFC 8785) escape it: `"` and
    /// `\\`, the short forms `\\b \\t \\n \\f \\r`, other controls as lowercase `\\u00xx`,
    /// everything else (including U+2028, U+2029 and DEL) as itself.
    fn string(&mut self, s: &str) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        self.raw(b"\"");
        let bytes = s.as_bytes();
        let mut start = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let short: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                0x08 => b"\\b",
                b'\t' => b"\\t",
                b'\n' => b"\\n",
                0x0c => b"\\f",
                b'\r' => b"\\r",
                0x00..=0x1f => b"",
                _ => continue,
            };
            self.raw(&bytes[start..i]);
            if short.is_empty() {
                self.raw(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
            } else {
                self.raw(short);
            }
            start = i + 1;
        }
        self.raw(&bytes[start..]);
        self.raw(b"\"");
    }
}

impl Sink for Vec<u8> {}

/// The canonical JSON of raw JSON text (blank text is `{}`), written as [`write_canonical`]
/// writes the `Value` `serde_json` parses from it, but straight from the parser's events.
pub(crate) fn write_canonical_raw(raw: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    if raw.trim().is_empty() {
        out.extend_from_slice(b"{}");
        return Ok(());
    }
    let mut de = serde_json::Deserializer::from_str(raw);
    Canon(out).deserialize(&mut de)?;
    de.end()
}

/// A JSON value as it is parsed, written canonically into the buffer. Objects are written
/// member by member as they come, and reordered ([`Reorder`]) only when their keys were not
/// already in canonical order (or repeated).
struct Canon<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Canon<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canon<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.raw(b"null");
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.raw(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        write_number(&v.into(), self.0);
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        write_number(&v.into(), self.0);
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // As `Value` holds it: `serde_json` never yields a non-finite double from text.
        match serde_json::Number::from_f64(v) {
            Some(n) => write_number(&n, self.0),
            None => self.0.raw(b"null"),
        }
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.0.string(v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        out.raw(b"[");
        let mut first = true;
        loop {
            let mark = out.len();
            if !first {
                out.raw(b",");
            }
            if seq.next_element_seed(Canon(&mut *out))?.is_none() {
                out.truncate(mark);
                break;
            }
            first = false;
        }
        out.raw(b"]");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        let start = out.len();
        out.raw(b"{");
        let mut last: Option<Cow<'de, str>> = None;
        // Whether every key came after the one before (so none is repeated either).
        let mut ordered = true;
        while let Some(Key(key)) = map.next_key()? {
            if let Some(last) = &last {
                out.raw(b",");
                ordered &= utf16_cmp(last, &key).is_lt();
            }
            out.string(&key);
            out.raw(b":");
            map.next_value_seed(Canon(&mut *out))?;
            last = Some(key);
        }
        out.raw(b"}");
        // Models usually write keys in order: then the object is canonical as written, and no
        // member list was kept for it.
        if !ordered {
            // Rare: the object just written is read back (its values are canonical already)
            // and its members reordered.
            let written = out.split_off(start);
            let mut de = serde_json::Deserializer::from_slice(&written);
            Reorder(out).deserialize(&mut de).map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

/// An object whose members are in canonical form but not in canonical order, rewritten with
/// its members sorted; of a key given twice, the last one counts, as in a parsed `Value`.
struct Reorder<'o>(&'o mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Reorder<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Reorder<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        let start = out.len();
        // Each member's key and where its canonical `"key":value` was written.
        let mut members: Vec<(Cow<'de, str>, usize, usize)> = Vec::new();
        while let Some(Key(key)) = map.next_key()? {
            let at = out.len();
            out.string(&key);
            out.raw(b":");
            map.next_value_seed(Canon(&mut *out))?;
            members.push((key, at, out.len()));
        }
        // A stable sort keeps members with one key in text order: the last one counts.
        members.sort_by(|(a, ..), (b, ..)| utf16_cmp(a, b));
        let mut object = Vec::with_capacity(out.len() - start + members.len() + 2);
        object.raw(b"{");
        let mut first = true;
        for (i, (key, from, to)) in members.iter().enumerate() {
            if members.get(i + 1).is_some_and(|(next, ..)| next == key) {
                continue;
            }
            if !first {
                object.raw(b",");
            }
            first = false;
            object.raw(&out[*from..*to]);
        }
        object.raw(b"}");
        out.truncate(start);
        out.extend_from_slice(&object);
        Ok(())
    }
}

/// An object key, borrowed from the text when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> de::Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The canonical JSON that every journal key hashes: the JSON Canonicalization Scheme,
/// [RFC 8785] (JCS), which is what JavaScript's `JSON.stringify` writes after sorting object
/// keys, so keys match the TypeScript original's.
///
/// - Object members sorted by key in UTF-16 code-unit order (not UTF-8 byte order); arrays keep
///   their order; no whitespace.
/// - Strings: `"` and `\` escaped, the controls U+0008, U+0009, U+000A, U+000C, U+000D as
///   `\b \t \n \f \r`, every other control below U+0020 as `\u00xx` (lowercase hex), and every
///   other character as itself (UTF-8), including `/`, U+007F, U+2028 and U+2029.
/// - Numbers in ECMAScript's `Number.prototype.toString` form (RFC 8785 §3.2.2.3): the shortest
///   digits that round-trip; plain notation for magnitudes in [1e-6, 1e21), else `d.ddde±x`;
///   `-0` is `0`; integral floats have no fraction (`1.0` is `1`). Written by [`ryu_js`], an
///   exact implementation of that algorithm, never by `serde_json`'s `Display`, so an upgrade
///   of a dependency cannot change a key.
/// - One deliberate extension: an integer that `serde_json` holds exactly as `i64`/`u64` but a
///   double cannot (beyond ±2^53) keeps all its digits. JCS would round it to the nearest double,
///   so two different ids (say `9007199254740993` and `9007199254740992`) would share a key and
///   the second call would be answered with the first one's result.
///
/// [RFC 8785]: https://www.rfc-editor.org/rfc/rfc8785
///
/// ```
/// let v = serde_json::json!({"b": [1.0, 2.5, -0.0, 0.000001, 1e21], "a": {"y": null, "x": "é\u{1}"}});
/// assert_eq!(
///     kuralle::journal::canonical_json(&v),
///     r#"{"a":{"x":"é\u0001","y":null},"b":[1,2.5,0,0.000001,1e+21]}"#
/// );
/// ```
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // Everything written is UTF-8: JSON punctuation and serde_json's string and number output.
    String::from_utf8(out).unwrap_or_default()
}

/// UTF-16 code-unit order, as JavaScript sorts strings; ASCII keys (the common case) compare
/// by bytes, which is the same order.
pub(crate) fn utf16_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() { a.cmp(b) } else { a.encode_utf16().cmp(b.encode_utf16()) }
}

pub(crate) fn write_canonical(value: &Value, out: &mut impl Sink) {
    match value {
        Value::Null => out.raw(b"null"),
        Value::Bool(true) => out.raw(b"true"),
        Value::Bool(false) => out.raw(b"false"),
        Value::String(s) => out.string(s),
        Value::Number(n) => write_number(n, out),
        Value::Array(items) => {
            out.raw(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.raw(b",");
                }
                write_canonical(item, out);
            }
            out.raw(b"]");
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| utf16_cmp(a, b));
            out.raw(b"{");
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.raw(b",");
                }
                out.string(k);
                out.raw(b":");
                write_canonical(v, out);
            }
            out.raw(b"}");
        }
    }
}

/// A number as RFC 8785 (ECMAScript `Number.prototype.toString`) writes it; exact integers
/// keep all their digits (see [`canonical_json`]).
fn write_number(n: &serde_json::Number, out: &mut impl Sink) {
    // Integers through `itoa`: `write!` went through the formatting machinery, a few hundred
    // instructions for every number of every key.
    if let Some(i) = n.as_i64() {
        out.raw(itoa::Buffer::new().format(i).as_bytes());
    } else if let Some(u) = n.as_u64() {
        out.raw(itoa::Buffer::new().format(u).as_bytes());
    } else if let Some(f) = n.as_f64() {
        if f == 0.0 {
            // Both zeros print as `0`; ryu-js would keep the sign of -0.
            out.raw(b"0");
        } else {
            // A `Value` never holds NaN or an infinity, so the value is finite.
            out.raw(ryu_js::Buffer::new().format_finite(f).as_bytes());
        }
    }
}
