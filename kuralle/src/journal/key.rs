//! Effect keys: SHA-256 over canonical JSON (RFC 8785, JCS), identical to the TypeScript
//! original's.

use std::{borrow::Cow, fmt};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The journal key of a model-issued or nested tool call.
///
/// Lowercase hex SHA-256 of the canonical JSON (RFC 8785 / JCS, see [`canonical_json`]) of
/// `{"callsite":"<callsite>","payload":{"args":…,"name":…},"runId":"<run>#<epoch>"}`.
///
/// ```
/// let key = kuralle::journal::tool_key("run-1", 0, 0, "charge", &serde_json::json!({"amount": 100}));
/// assert_eq!(key, "7ad746a1841bb374d6535a0049d01d8861d11c1f1b37ca7c6a333a12f2725fa9");
/// ```
pub fn tool_key(run_id: &str, epoch: u64, callsite: u64, name: &str, args: &Value) -> String {
    tool_key_at(&namespace(run_id, epoch), &callsite.to_string(), name, args)
}

/// [`tool_key`] from the model's raw argument text, without parsing it into a `Value`: for
/// every text [`parse_args`](crate::parse_args) accepts, the same key as `tool_key` of the
/// parsed arguments (blank text is `{}`; of a key given twice, the last value counts, as in
/// the parsed `Value`).
///
/// # Errors
/// The text is not valid JSON, or nests deeper than `serde_json` parses (128).
///
/// ```
/// let raw = r#"{ "amount" : 100 }"#;
/// let key = kuralle::journal::tool_key_raw("run-1", 0, 0, "charge", raw).unwrap();
/// assert_eq!(key, "7ad746a1841bb374d6535a0049d01d8861d11c1f1b37ca7c6a333a12f2725fa9");
/// ```
pub fn tool_key_raw(
    run_id: &str,
    epoch: u64,
    callsite: u64,
    name: &str,
    raw: &str,
) -> Result<String, serde_json::Error> {
    tool_key_raw_at(&namespace(run_id, epoch), &callsite.to_string(), name, raw)
}

/// [`tool_key`] with the namespace and callsite given as text (nested callsites are
/// `"<parent>.<n>"`). Writes the canonical material straight into the hasher.
pub(crate) fn tool_key_at(namespace: &str, callsite: &str, name: &str, args: &Value) -> String {
    // The payload `{"args","name"}` is written in place, already in canonical key order.
    hash_material(namespace, callsite, |h| {
        h.raw(b"{\"args\":");
        write_canonical(args, h);
        h.raw(b",\"name\":");
        h.string(name);
        h.raw(b"}");
    })
}

/// [`tool_key_at`] from the model's raw argument text, without building a `Value`: the same
/// key as `tool_key_at(.., &parse_args(raw)?)` for every text [`parse_args`] accepts (blank
/// text is `{}`; of a key given twice the last value counts, as in the parsed `Value`).
///
/// # Errors
/// The text is not valid JSON (or nests deeper than `serde_json` parses).
///
/// [`parse_args`]: crate::parse_args
pub(crate) fn tool_key_raw_at(
    namespace: &str,
    callsite: &str,
    name: &str,
    raw: &str,
) -> Result<String, serde_json::Error> {
    // The whole material in one buffer, hashed in one call: the canonical arguments are
    // written in place between the material's head and tail, and the hasher is not fed the
    // material piece by piece.
    let mut material = Vec::with_capacity(raw.len() + callsite.len() + name.len() + namespace.len() + 64);
    material.raw(b"{\"callsite\":");
    material.string(callsite);
    material.raw(b",\"payload\":{\"args\":");
    write_canonical_raw(raw, &mut material)?;
    material.raw(b",\"name\":");
    material.string(name);
    material.raw(b"},\"runId\":");
    material.string(namespace);
    material.raw(b"}");
    Ok(hex(&Sha256::digest(&material)))
}

/// The canonical JSON of raw JSON text (blank text is `{}`), written as [`write_canonical`]
/// writes the `Value` `serde_json` parses from it, but straight from the parser's events.
fn write_canonical_raw(raw: &str, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
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

/// Hashes `{"callsite":…,"payload":…,"runId":…}` (keys already in canonical order), with the
/// payload written by `payload`.
fn hash_material(namespace: &str, callsite: &str, payload: impl FnOnce(&mut HashWriter)) -> String {
    let mut h = HashWriter(Sha256::new());
    h.raw(b"{\"callsite\":");
    h.string(callsite);
    h.raw(b",\"payload\":");
    payload(&mut h);
    h.raw(b",\"runId\":");
    h.string(namespace);
    h.raw(b"}");
    h.finish()
}

fn namespace(run_id: &str, epoch: u64) -> String {
    format!("{run_id}#{epoch}")
}

/// The key of the approval step guarding the tool call whose key is `effect_key`.
///
/// ```
/// let key = kuralle::journal::tool_key("run-1", 0, 0, "charge", &serde_json::json!({"amount": 100}));
/// let approval = kuralle::journal::approval_key("run-1", 0, &key, "charge", &serde_json::json!({"amount": 100}));
/// assert_eq!(approval, "0dfce4140293b9306a9876f4d21049027c55c0511e8032e9c8c00c967e0a522a");
/// ```
pub fn approval_key(run_id: &str, epoch: u64, effect_key: &str, name: &str, args: &Value) -> String {
    effect_key_for(&namespace(run_id, epoch), "approval", &json!({"args": args, "effectKey": effect_key, "name": name}))
}

/// The key of a `ctx.now()` / `ctx.uuid()` step: the payload is the string `"now"` / `"uuid"`.
///
/// ```
/// assert_eq!(
///     kuralle::journal::helper_key("run-1", 0, "1", "now"),
///     "27d6ef350a74145ff8cccfb2557c78e29a67075d27309fbd8d08aab9446d9179",
/// );
/// ```
pub fn helper_key(run_id: &str, epoch: u64, callsite: &str, what: &str) -> String {
    effect_key(run_id, epoch, callsite, &Value::String(what.to_owned()))
}

/// The key of any effect: `hash({"callsite","payload","runId":"<run>#<epoch>"})`.
pub fn effect_key(run_id: &str, epoch: u64, callsite: &str, payload: &Value) -> String {
    effect_key_for(&namespace(run_id, epoch), callsite, payload)
}

/// As [`effect_key`], with the namespace (`"<run>#<epoch>"`, or a flow-scoped one) given whole.
pub fn effect_key_for(namespace: &str, callsite: &str, payload: &Value) -> String {
    hash_material(namespace, callsite, |h| write_canonical(payload, h))
}

/// Scopes a tool's own `idempotency_key` to the run and tool, so two tools (or two runs)
/// returning the same string never share a journal entry.
pub fn override_key(run_id: &str, epoch: u64, tool: &str, user_key: &str) -> String {
    let material = json!({"idempotencyKey": user_key, "runId": namespace(run_id, epoch), "tool": tool});
    let mut h = HashWriter(Sha256::new());
    write_canonical(&material, &mut h);
    h.finish()
}

/// Lowercase hex of a SHA-256 digest.
fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Into a fixed buffer, then one string: pushing `char`s re-checked the capacity and
    // encoded each digit as UTF-8, several hundred instructions a key.
    let mut out = [0u8; 64];
    for (pair, b) in out.chunks_exact_mut(2).zip(digest) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    // Hex digits are ASCII.
    std::str::from_utf8(&out[..digest.len().min(32) * 2]).unwrap_or_default().to_owned()
}

/// Where canonical JSON is written: a hasher (keys) or a buffer ([`canonical_json`]).
trait Sink: std::io::Write + Sized {
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

struct HashWriter(Sha256);

impl HashWriter {
    fn finish(self) -> String {
        hex(&self.0.finalize())
    }
}

impl std::io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Sink for HashWriter {}

impl Sink for Vec<u8> {}

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
fn utf16_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    if a.is_ascii() && b.is_ascii() { a.cmp(b) } else { a.encode_utf16().cmp(b.encode_utf16()) }
}

fn write_canonical(value: &Value, out: &mut impl Sink) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_vectors_reproduce() {
        let args = json!({"amount": 100});
        let key = tool_key("run-1", 0, 0, "charge", &args);
        assert_eq!(key, "7ad746a1841bb374d6535a0049d01d8861d11c1f1b37ca7c6a333a12f2725fa9");
        let approval = approval_key("run-1", 0, &key, "charge", &args);
        assert_eq!(approval, "0dfce4140293b9306a9876f4d21049027c55c0511e8032e9c8c00c967e0a522a");
        assert_eq!(&approval[..24], "0dfce4140293b9306a9876f4");
        assert_eq!(
            helper_key("run-1", 0, "1", "now"),
            "27d6ef350a74145ff8cccfb2557c78e29a67075d27309fbd8d08aab9446d9179"
        );
        let in_flow =
            effect_key_for("run-1#2#checkout@code:checkout", "0", &json!({"args": {"amount": 10}, "name": "charge"}));
        assert_eq!(in_flow, "ad6fa732e6ed30a116fc675622fe9bf36be4676a35ac3d88a08737725824c3d4");
    }

    #[test]
    fn key_order_is_utf16_code_unit_order() {
        // U+FF5E sorts after U+1F600 in UTF-8 byte order but before it in UTF-16 order.
        let v = json!({"\u{1F600}": 1, "\u{FF5E}": 2});
        assert_eq!(canonical_json(&v), "{\"\u{1F600}\":1,\"\u{FF5E}\":2}");
    }

    /// Vectors computed by the TypeScript original's form (`JSON.stringify` with sorted keys,
    /// then SHA-256) in Node.js, from the same raw argument text.
    #[test]
    fn jcs_key_vectors_for_floats_big_and_negative_zero_numbers_and_escaped_unicode() {
        let cases = [
            (
                r#"{"amount":0.000001}"#,
                r#"{"amount":0.000001}"#,
                "795d6978c5f3e5377bf65c45e561ec7d2088c33e1689a59be59366cacc654c06",
            ),
            (
                r#"{"amount":123456789012345680000}"#,
                r#"{"amount":123456789012345680000}"#,
                "6b0ce55da041e436abbdcc470da3c14f66dbfb23261a8aa66d3f780d06b611e3",
            ),
            (
                r#"{"amount":-0.0}"#,
                r#"{"amount":0}"#,
                "a419bad0baf1b85a3ffdc8fd87f61d6f35ca1ff47fb2d18b7502ed71a0019059",
            ),
            (
                r#"{"x":1e21,"y":1.5e-7,"z":0.30000000000000004,"w":1.0,"v":-1e-7,"u":5e-324,"t":1.7976931348623157e308}"#,
                r#"{"t":1.7976931348623157e+308,"u":5e-324,"v":-1e-7,"w":1,"x":1e+21,"y":1.5e-7,"z":0.30000000000000004}"#,
                "e80fc9786b2c77a13c59d3d8ec33be6583199721b7a44cbac1677d105c1b1b1d",
            ),
            (
                r#"{"text":"é\u0001\u001f\u2028\ud83d\ude00\"\\/\u007f","\uff5a":1,"\ud83d\ude00":2,"a\u0000":3}"#,
                "{\"a\\u0000\":3,\"text\":\"é\\u0001\\u001f\u{2028}😀\\\"\\\\/\u{7f}\",\"😀\":2,\"ｚ\":1}",
                "8c245364c4cccb1f83f9898949d383b0111c1ac144f91281952809f82cfd841c",
            ),
        ];
        for (raw, canonical, key) in cases {
            let args: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(canonical_json(&args), canonical, "{raw}");
            assert_eq!(tool_key("run-1", 0, 0, "charge", &args), key, "{raw}");
            assert_eq!(tool_key_raw_at("run-1#0", "0", "charge", raw).unwrap(), key, "{raw}");
        }
    }

    #[test]
    fn exact_integers_beyond_two_to_the_53_keep_their_digits() {
        let a = json!({"id": 9_007_199_254_740_993_u64});
        let b = json!({"id": 9_007_199_254_740_992_u64});
        assert_eq!(canonical_json(&a), r#"{"id":9007199254740993}"#);
        assert_ne!(tool_key("r", 0, 0, "t", &a), tool_key("r", 0, 0, "t", &b));
        assert_eq!(canonical_json(&json!([i64::MIN, u64::MAX])), "[-9223372036854775808,18446744073709551615]");
    }

    /// The raw-text key is the parsed `Value`'s key on texts the generated values do not
    /// reach: whitespace, escapes, duplicate keys, numbers at the edges; and it refuses what
    /// the parse refuses.
    #[test]
    fn raw_text_keys_match_parsed_keys_on_edge_texts() {
        let texts = [
            "",
            "  \n ",
            "{}",
            " { \"a\" : [ 1 , 2.50 , -0 , -0.0 , 1E3 , 1e-7 , 12345678901234567890 , -9223372036854775808 ] } ",
            r#"{"id":9007199254740993,"big":123456789012345678901234567890,"neg":-9007199254740993}"#,
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"a":{"x":1},"a":{"y":[{"z":1,"z":2}]}}"#,
            r#"{"\u0061":1,"a":2}"#,
            r#"{"s":"\ud83d\ude00\u00e9\n\t\b\f\r\/\\\"\u0000\u001f\u007f\u2028"}"#,
            r#"{"\uff5a":1,"\ud83d\ude00":2,"z":3,"":4}"#,
            r#"{"f":[0.1,1.7976931348623157e308,5e-324,4.35,100,1e21,1e20,123e-20]}"#,
            r#"{"n":null,"t":true,"f":false,"e":[],"o":{}}"#,
        ];
        for raw in texts {
            let args = crate::parse_args("t", raw).unwrap();
            assert_eq!(tool_key_raw_at("r#0", "3", "t", raw).unwrap(), tool_key_at("r#0", "3", "t", &args), "{raw}");
        }
        for bad in ["{", "{\"a\":}", "{} x", "{\"a\":1e400}", "[1", &format!("{}1{}", "[".repeat(200), "]".repeat(200))]
        {
            assert!(serde_json::from_str::<Value>(bad).is_err(), "{bad}");
            assert!(tool_key_raw_at("r#0", "3", "t", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn override_keys_are_scoped_by_run_and_tool() {
        assert_ne!(override_key("r", 0, "a", "k"), override_key("r", 0, "b", "k"));
        assert_ne!(override_key("r", 0, "a", "k"), override_key("s", 0, "a", "k"));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Number, Value};

    use super::*;
    use crate::strategies::json_value;

    /// The value JCS means: doubles compared by value (so -0 equals 0).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), ..) => x == y,
                (.., Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            },
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    /// JSON text with every non-ASCII character written as `\\u` escapes (surrogate pairs
    /// above the BMP); valid because non-ASCII only ever occurs inside strings.
    fn escaped(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_ascii() {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        out
    }

    fn keys_sorted(v: &Value) -> bool {
        match v {
            Value::Array(items) => items.iter().all(keys_sorted),
            Value::Object(map) => map.values().all(keys_sorted),
            _ => true,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Canonical text is valid JSON for the same value, a fixed point, without whitespace
        /// outside strings, and the key hashes exactly that text.
        #[test]
        fn canonical_json_round_trips_and_is_a_fixed_point(v in json_value()) {
            let text = canonical_json(&v);
            let back: Value = serde_json::from_str(&text).expect("canonical JSON parses");
            prop_assert!(same(&v, &back), "{} -> {}", v, text);
            prop_assert_eq!(canonical_json(&back), text.clone());
            prop_assert!(keys_sorted(&back));
            let material = format!("{{\"callsite\":\"0\",\"payload\":{{\"args\":{text},\"name\":\"t\"}},\"runId\":\"r#0\"}}");
            let expected = hex(&Sha256::digest(material.as_bytes()));
            prop_assert_eq!(tool_key("r", 0, 0, "t", &v), expected);
        }

        /// The key computed from a value's text (compact, pretty, or with every non-ASCII
        /// character escaped) is the key of the value.
        #[test]
        fn raw_text_keys_match_value_keys(v in json_value(), escape in any::<bool>()) {
            let expected = tool_key_at("r#0", "1.2", "t", &v);
            let compact = if escape { escaped(&v.to_string()) } else { v.to_string() };
            prop_assert_eq!(tool_key_raw_at("r#0", "1.2", "t", &compact).unwrap(), expected.clone(), "{}", compact);
            let pretty = serde_json::to_string_pretty(&v).unwrap();
            prop_assert_eq!(tool_key_raw_at("r#0", "1.2", "t", &pretty).unwrap(), expected);
        }

        /// Objects with repeated keys: the raw-text key is the key of what `serde_json` parses.
        #[test]
        fn raw_text_keys_match_with_repeated_keys(
            entries in proptest::collection::vec(("[ab\u{e9}]{0,2}", json_value()), 0..8),
        ) {
            let members: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
                .collect();
            let raw = format!("{{{}}}", members.join(","));
            let parsed: Value = serde_json::from_str(&raw).unwrap();
            prop_assert_eq!(tool_key_raw_at("r#0", "0", "t", &raw).unwrap(), tool_key_at("r#0", "0", "t", &parsed));
        }

        /// Members come out in UTF-16 code-unit order of their keys.
        #[test]
        fn members_are_in_utf16_order(keys in proptest::collection::vec("(?s).{0,4}", 0..8)) {
            let map: Map<String, Value> = keys.iter().map(|k| (k.clone(), Value::Null)).collect();
            let text = canonical_json(&Value::Object(map.clone()));
            let mut sorted: Vec<&String> = map.keys().collect();
            sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            let expected: Vec<String> = sorted.iter().map(|k| format!("{}:null", canonical_json(&Value::String((*k).clone())))).collect();
            prop_assert_eq!(text, format!("{{{}}}", expected.join(",")));
        }

        /// Every finite double prints in ECMAScript form and reads back as the same double.
        #[test]
        fn doubles_print_shortest_round_trip(f in any::<f64>().prop_filter("finite", |f| f.is_finite())) {
            let text = canonical_json(&Value::Number(Number::from_f64(f).unwrap()));
            prop_assert_eq!(text.parse::<f64>().unwrap(), if f == 0.0 { 0.0 } else { f });
            prop_assert!(!text.contains('E') && !text.starts_with('+') && text != "-0");
            if (1e-6..1e21).contains(&f.abs()) {
                prop_assert!(!text.contains('e'), "{} printed as {}", f, text);
            }
        }
    }
}
