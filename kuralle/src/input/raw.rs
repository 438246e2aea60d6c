//! Raw argument text → a tool's fields, without building a `Value`.
//!
//! The text is read in two steps: [`match_raw_args`] finds where each member's value starts
//! and ends, then [`raw_arg`] deserializes each value from its own text. The first step does
//! not need a JSON parser: a byte scan ([`scan`]) finds the members of the texts models write
//! (one key per name, no escapes in keys) at a fraction of what a `serde_json` pass with
//! `RawValue`s costs (the pass was 1,500 of a call's 4,300 instructions). It checks the
//! object's own punctuation only; every value it delimits is checked by its field's parse, and
//! whatever it is unsure of (an escaped or repeated key, anything malformed) goes to the
//! `serde_json` pass, which says exactly what `serde_json` says.

use serde::de::{self, DeserializeOwned, DeserializeSeed, Error as _, Visitor};

use super::{ArgTable, Missing, scalar::Scalar};

/// The text of one member's value in the raw arguments, as [`match_raw_args`] found it. Only
/// the value's own parse ([`raw_arg`]) says whether it is JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawArg<'a>(&'a str);

impl<'a> RawArg<'a> {
    /// The value's text.
    pub fn get(self) -> &'a str {
        self.0
    }
}

/// Pairs the members of a model's raw argument text with `table`'s names without building a
/// `Value`: `slots[i]` receives the text of `table.names[i]`'s value, if present. `false` when
/// the text is not a JSON object of known names, is larger than
/// [`MAX_TOOL_ARGS_BYTES`](crate::MAX_TOOL_ARGS_BYTES), or may nest deeper than its fields can
/// be read alone exactly as within the object: then the caller takes the `Value` path, which
/// says what is wrong.
///
/// `true` does not mean every value is JSON: each one is checked when its field is read
/// ([`raw_arg`]), and every slot is read (a name given twice goes through the `serde_json`
/// pass, which checks the value it drops, and keeps the last one).
pub fn match_raw_args<'a>(raw: &'a str, table: &ArgTable, slots: &mut [Option<RawArg<'a>>]) -> bool {
    if raw.len() > crate::input::text::MAX_TOOL_ARGS_BYTES {
        return false;
    }
    // `serde_json` refuses nesting deeper than 128 counting the arguments object; a field read
    // alone starts one level lower. Texts with that many brackets anywhere take the `Value` path
    // (a shorter text cannot hold that many).
    if raw.len() >= 128 && raw.bytes().filter(|b| matches!(b, b'[' | b'{')).count() >= 128 {
        return false;
    }
    if scan(raw, table.names, slots).is_some() {
        return true;
    }
    slots.fill(None);
    if raw.trim().is_empty() {
        return true;
    }
    let mut de = serde_json::Deserializer::from_str(raw);
    de::Deserializer::deserialize_map(&mut de, RawMembers { names: table.names, slots }).is_ok() && de.end().is_ok()
}

/// JSON's four whitespace bytes.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The object's members by a byte scan, or `None` when the scan cannot vouch for the answer:
/// the text is not an object of distinct, unescaped, known names whose values are delimited
/// as JSON delimits them. `Some` fills `slots`; a value's text may still be invalid (its
/// field's parse refuses it then).
fn scan<'a>(raw: &'a str, names: &[&str], slots: &mut [Option<RawArg<'a>>]) -> Option<()> {
    let bytes = raw.as_bytes();
    let mut at = skip_space(bytes, 0);
    if at == bytes.len() {
        // No text at all: no arguments (what a model sends for a tool without params).
        return Some(());
    }
    if bytes[at] != b'{' {
        return None;
    }
    at = skip_space(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return (skip_space(bytes, at + 1) == bytes.len()).then_some(());
    }
    loop {
        // A key: one of the names, quoted. The names are Rust identifiers (no quote, no
        // backslash), so a name and a closing quote is that key and nothing else; an escaped
        // key never matches, and goes to `serde_json`.
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let key = &bytes[at + 1..];
        let slot = names.iter().position(|name| {
            let name = name.as_bytes();
            key.len() > name.len() && key[name.len()] == b'"' && name.iter().zip(key).all(|(a, b)| a == b)
        })?;
        if slots[slot].is_some() {
            return None;
        }
        at = skip_space(bytes, at + 1 + names[slot].len() + 1);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_space(bytes, at + 1);
        let value_end = value_end(bytes, at)?;
        // Both ends fall on ASCII bytes (a quote, a bracket, or a byte before one), so the slice
        // is on character boundaries.
        slots[slot] = Some(RawArg(raw.get(at..value_end)?));
        at = skip_space(bytes, value_end);
        match bytes.get(at) {
            Some(b',') => at = skip_space(bytes, at + 1),
            Some(b'}') => return (skip_space(bytes, at + 1) == bytes.len()).then_some(()),
            _ => return None,
        }
    }
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while at < bytes.len() && is_space(bytes[at]) {
        at += 1;
    }
    at
}

/// Where the value starting at `at` ends (exclusive), by JSON's delimiters: a string at its
/// closing quote, an array or object at its matching bracket (counting brackets outside
/// strings), anything else (a number or literal) before the next `,`, `}`, `]` or whitespace.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match *bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let len = bytes[at..].iter().position(|&b| matches!(b, b',' | b'}' | b']') || is_space(b));
            Some(len.map_or(bytes.len(), |len| at + len))
        }
        _ => None,
    }
}

/// The end (exclusive) of the string whose opening quote is at `at`.
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

/// The members of the arguments object, matched with the names as `serde_json` parses them.
struct RawMembers<'s, 'a> {
    names: &'static [&'static str],
    slots: &'s mut [Option<RawArg<'a>>],
}

impl<'a> Visitor<'a> for RawMembers<'_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an arguments object")
    }

    fn visit_map<A: de::MapAccess<'a>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(i) = map.next_key_seed(NameIndex(self.names))? {
            let Some(i) = i else { return Err(A::Error::custom("unknown argument")) };
            let value: &'a serde_json::value::RawValue = map.next_value()?;
            self.slots[i] = Some(RawArg(value.get()));
        }
        Ok(())
    }
}

/// A key as its position among the names.
struct NameIndex(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for NameIndex {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for NameIndex {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an argument name")
    }

    fn visit_str<E>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|name| *name == key))
    }
}

/// Argument `T` from the text of its value (or its absence, which only an `Option` accepts),
/// or `None` when it is not one: then the caller takes the `Value` path, which names the
/// field and the problem.
pub fn raw_arg<T: DeserializeOwned>(value: Option<RawArg<'_>>) -> Option<T> {
    match value {
        None => T::deserialize(Missing("")).ok(),
        Some(text) => T::deserialize(Scalar(text.get())).ok(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    static TABLE: ArgTable = ArgTable { names: &["a", "b", "label"], docs: &["", "", ""], schemas: &[] };

    /// What the `serde_json` pass alone says of `raw`, with each member's value.
    fn by_serde(raw: &str) -> Option<Vec<Option<String>>> {
        let mut slots = [None; 3];
        if raw.trim().is_empty() {
            return Some(vec![None; 3]);
        }
        let mut de = serde_json::Deserializer::from_str(raw);
        let ok = de::Deserializer::deserialize_map(&mut de, RawMembers { names: TABLE.names, slots: &mut slots })
            .is_ok()
            && de.end().is_ok();
        ok.then(|| slots.iter().map(|s| s.map(|s| s.get().to_owned())).collect())
    }

    /// What the scan says of `raw`, when it answers, and its values all parse as JSON (as the
    /// fields' own parses require before anything is accepted).
    fn by_scan(raw: &str) -> Option<Vec<Option<String>>> {
        let mut slots = [None; 3];
        scan(raw, TABLE.names, &mut slots)?;
        slots
            .iter()
            .all(|s| s.is_none_or(|s| serde_json::from_str::<serde_json::Value>(s.get()).is_ok()))
            .then(|| slots.iter().map(|s| s.map(|s| s.get().to_owned())).collect())
    }

    #[test]
    fn the_scan_reads_what_models_write() {
        for raw in [
            r#"{"a": 1, "b": 2, "label": "sum"}"#,
            r#"{"a":-1.5e3,"b":true,"label":"a \"quoted\" } ] , word"}"#,
            "{\n  \"label\": {\"x\": [1, {\"y\": \"]\"}]},\n  \"a\": null\n}\n",
            "{}",
            " { } ",
            "",
            "  ",
            r#"{"a": [], "b": {}}"#,
        ] {
            let scanned = by_scan(raw);
            assert!(scanned.is_some(), "the scan should answer for {raw:?}");
            assert_eq!(scanned, by_serde(raw), "{raw:?}");
        }
    }

    #[test]
    fn the_scan_leaves_doubts_to_serde() {
        for raw in [
            r#"{"a": 1, "a": 2}"#,
            r#"{"\u0061": 1}"#,
            r#"{"c": 1}"#,
            r#"{"a": 1,}"#,
            r#"{"a" 1}"#,
            r#"{"a": 1} x"#,
            r#"{"a": 'x'}"#,
            r#"{"a": "unterminated}"#,
            r#"{"a": [1, 2}"#,
            r#"[1]"#,
            r#"{"a": 1"#,
            r#"{"a": }"#,
        ] {
            let mut slots = [None; 3];
            assert!(scan(raw, TABLE.names, &mut slots).is_none(), "the scan should not answer for {raw:?}");
        }
    }

    /// Texts near the ones models write: valid objects of the known names, then bytes
    /// inserted, removed or replaced with JSON's punctuation and escapes.
    fn texts() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(serde_json::Value::from),
            "[a-z\"\\\\{}\\[\\],: \u{e9}\u{1F600}]{0,8}".prop_map(serde_json::Value::from),
        ];
        let value = leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("[a-z\"{]{0,3}", inner, 0..3)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        let object = prop::collection::vec((prop::sample::select(vec!["a", "b", "label", "c"]), value), 0..4);
        let edit = (any::<prop::sample::Index>(), 0..3u8, prop::sample::select(b"{}[]\",:\\ ntu0-.".to_vec()));
        (object, any::<bool>(), prop::collection::vec(edit, 0..3)).prop_map(|(members, pretty, edits)| {
            let body: Vec<String> = members
                .iter()
                .map(|(k, v)| {
                    let v = if pretty { serde_json::to_string_pretty(v) } else { serde_json::to_string(v) };
                    format!("{}:{}", serde_json::to_string(k).unwrap(), v.unwrap())
                })
                .collect();
            let sep = if pretty { ",\n  " } else { "," };
            let mut text = format!("{{{}}}", body.join(sep)).into_bytes();
            for (at, op, byte) in edits {
                let i = at.index(text.len() + 1);
                match op {
                    0 => text.insert(i, byte),
                    1 if i < text.len() => drop(text.remove(i)),
                    _ if i < text.len() => text[i] = byte,
                    _ => {}
                }
            }
            String::from_utf8(text).unwrap_or_default()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

        /// Whenever the scan answers (and the values parse, as the fields require), it answers
        /// what `serde_json` does.
        #[test]
        fn the_scan_agrees_with_serde(raw in texts()) {
            if let Some(scanned) = by_scan(&raw) {
                prop_assert_eq!(Some(scanned), by_serde(&raw), "{:?}", raw);
            }
        }
    }
}
