//! Effect keys: SHA-256 over canonical JSON (RFC 8785, JCS, written by
//! [`crate::json::canonical`]), identical to the TypeScript original's.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub use crate::json::canonical::canonical_json;
use crate::json::canonical::{Sink, write_canonical, write_canonical_raw};
use crate::keymap::hex;

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
    // material piece by piece. The buffer is the thread's, kept between calls (one allocation
    // less per call), unless the arguments were large.
    let write = |material: &mut Vec<u8>| -> Result<String, serde_json::Error> {
        material.clear();
        material.reserve(raw.len() + callsite.len() + name.len() + namespace.len() + 64);
        material.raw(b"{\"callsite\":");
        material.string(callsite);
        material.raw(b",\"payload\":{\"args\":");
        write_canonical_raw(raw, material)?;
        material.raw(b",\"name\":");
        material.string(name);
        material.raw(b"},\"runId\":");
        material.string(namespace);
        material.raw(b"}");
        Ok(hex(&Sha256::digest(&material)))
    };
    MATERIAL
        .try_with(|kept| {
            let mut kept = kept.try_borrow_mut().ok()?;
            let key = write(&mut kept);
            if kept.capacity() > KEPT_MATERIAL_BYTES {
                *kept = Vec::new();
            }
            Some(key)
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| write(&mut Vec::new()))
}

/// The largest material buffer a thread keeps between calls of [`tool_key_raw_at`].
const KEPT_MATERIAL_BYTES: usize = 16 * 1024;

thread_local! {
    static MATERIAL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
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
    string_key_at(&namespace(run_id, epoch), callsite, what)
}

/// The key of any effect: `hash({"callsite","payload","runId":"<run>#<epoch>"})`.
pub fn effect_key(run_id: &str, epoch: u64, callsite: &str, payload: &Value) -> String {
    effect_key_for(&namespace(run_id, epoch), callsite, payload)
}

/// As [`effect_key`], with the namespace (`"<run>#<epoch>"`, or a flow-scoped one) given whole.
pub fn effect_key_for(namespace: &str, callsite: &str, payload: &Value) -> String {
    hash_material(namespace, callsite, |h| write_canonical(payload, h))
}

/// As [`effect_key_for`] with the string `payload` (a model step's `"model"`, a helper's
/// `"now"`), written straight into the hash instead of through a `Value` built for it.
pub(crate) fn string_key_at(namespace: &str, callsite: &str, payload: &str) -> String {
    hash_material(namespace, callsite, |h| h.string(payload))
}

/// Scopes a tool's own `idempotency_key` to the run and tool, so two tools (or two runs)
/// returning the same string never share a journal entry.
pub fn override_key(run_id: &str, epoch: u64, tool: &str, user_key: &str) -> String {
    let material = json!({"idempotencyKey": user_key, "runId": namespace(run_id, epoch), "tool": tool});
    let mut h = HashWriter(Sha256::new());
    write_canonical(&material, &mut h);
    h.finish()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_payload_keys_as_its_json_value_does() {
        for what in ["model", "now", "uuid", "", "quote \" and \u{1}"] {
            assert_eq!(
                string_key_at("run-1#0", "3", what),
                effect_key_for("run-1#0", "3", &Value::String(what.into()))
            );
        }
    }

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
            let args = crate::input::text::parse_args("t", raw).unwrap();
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
