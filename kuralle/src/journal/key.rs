//! Effect keys: SHA-256 over canonical JSON, identical to the TypeScript original's.

use std::fmt::Write as _;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The journal key of a model-issued or nested tool call.
///
/// Lowercase hex SHA-256 of the canonical JSON (keys sorted, no whitespace) of
/// `{"callsite":"<callsite>","payload":{"args":…,"name":…},"runId":"<run>#<epoch>"}`.
///
/// ```
/// let key = kuralle::journal::tool_key("run-1", 0, 0, "charge", &serde_json::json!({"amount": 100}));
/// assert_eq!(key, "7ad746a1841bb374d6535a0049d01d8861d11c1f1b37ca7c6a333a12f2725fa9");
/// ```
pub fn tool_key(run_id: &str, epoch: u64, callsite: u64, name: &str, args: &Value) -> String {
    effect_key(run_id, epoch, &callsite.to_string(), &json!({"args": args, "name": name}))
}

/// The key of the approval step guarding the tool call whose key is `effect_key`.
///
/// ```
/// let key = kuralle::journal::tool_key("run-1", 0, 0, "charge", &serde_json::json!({"amount": 100}));
/// let approval = kuralle::journal::approval_key("run-1", 0, &key, "charge", &serde_json::json!({"amount": 100}));
/// assert_eq!(approval, "0dfce4140293b9306a9876f4d21049027c55c0511e8032e9c8c00c967e0a522a");
/// ```
pub fn approval_key(run_id: &str, epoch: u64, effect_key: &str, name: &str, args: &Value) -> String {
    effect_key_for(
        &format!("{run_id}#{epoch}"),
        "approval",
        &json!({"args": args, "effectKey": effect_key, "name": name}),
    )
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
    effect_key_for(&format!("{run_id}#{epoch}"), callsite, payload)
}

/// As [`effect_key`], with the namespace (`"<run>#<epoch>"`, or a flow-scoped one) given whole.
pub fn effect_key_for(namespace: &str, callsite: &str, payload: &Value) -> String {
    let material = json!({"callsite": callsite, "payload": payload, "runId": namespace});
    sha256_hex(canonical_json(&material).as_bytes())
}

/// Scopes a tool's own `idempotency_key` to the run and tool, so two tools (or two runs)
/// returning the same string never share a journal entry.
pub fn override_key(run_id: &str, epoch: u64, tool: &str, user_key: &str) -> String {
    let material = json!({"idempotencyKey": user_key, "runId": format!("{run_id}#{epoch}"), "tool": tool});
    sha256_hex(canonical_json(&material).as_bytes())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Canonical JSON as JavaScript's `JSON.stringify` writes it after sorting object keys:
/// keys in UTF-16 code-unit order, no whitespace, integral floats without a fraction.
///
/// ```
/// let v = serde_json::json!({"b": [1.0, 2.5], "a": {"y": null, "x": "é"}});
/// assert_eq!(kuralle::journal::canonical_json(&v), r#"{"a":{"x":"é","y":null},"b":[1,2.5]}"#);
/// ```
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => out.push_str(&value.to_string()),
        Value::Number(n) => match n.as_f64() {
            // JSON.stringify(1.0) is "1": an integral float prints without its fraction.
            Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e21 => {
                let _ = write!(out, "{f:.0}");
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
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

    #[test]
    fn override_keys_are_scoped_by_run_and_tool() {
        assert_ne!(override_key("r", 0, "a", "k"), override_key("r", 0, "b", "k"));
        assert_ne!(override_key("r", 0, "a", "k"), override_key("s", 0, "a", "k"));
    }
}
