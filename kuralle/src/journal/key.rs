//! Effect keys: SHA-256 over canonical JSON, identical to the TypeScript original's.

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
    tool_key_at(&namespace(run_id, epoch), &callsite.to_string(), name, args)
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

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Where canonical JSON is written: a hasher (keys) or a buffer ([`canonical_json`]).
trait Sink: std::io::Write + Sized {
    fn raw(&mut self, bytes: &[u8]) {
        // Both sinks are infallible in-memory writers.
        let _ = self.write_all(bytes);
    }

    /// A JSON string literal, escaped as `JSON.stringify` (and `serde_json`) escape it.
    fn string(&mut self, s: &str) {
        let _ = serde_json::to_writer(&mut *self, s);
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

/// Canonical JSON as JavaScript's `JSON.stringify` writes it after sorting object keys:
/// keys in UTF-16 code-unit order, no whitespace, integral floats without a fraction.
///
/// ```
/// let v = serde_json::json!({"b": [1.0, 2.5], "a": {"y": null, "x": "é"}});
/// assert_eq!(kuralle::journal::canonical_json(&v), r#"{"a":{"x":"é","y":null},"b":[1,2.5]}"#);
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
        Value::Number(n) => match n.as_f64() {
            // JSON.stringify(1.0) is "1": an integral float prints without its fraction.
            Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e21 => {
                let _ = write!(out, "{f:.0}");
            }
            _ => {
                let _ = write!(out, "{n}");
            }
        },
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
