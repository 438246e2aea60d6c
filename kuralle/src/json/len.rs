//! The length of a value's compact JSON text, without writing the text.

use serde_json::Value;

/// The length in bytes of `value`'s compact JSON text (as `serde_json::to_string` writes it),
/// computed without building the text.
pub(crate) fn json_len(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        // Integers, the common case (counts, ids, token usage), without the formatter.
        Value::Number(number) if number.is_u64() => number.as_u64().map_or(0, decimal_digits),
        Value::Number(number) if number.is_i64() => number.as_i64().map_or(0, |n| 1 + decimal_digits(n.unsigned_abs())),
        Value::Number(number) => {
            struct Count(usize);
            impl std::fmt::Write for Count {
                fn write_str(&mut self, s: &str) -> std::fmt::Result {
                    self.0 += s.len();
                    Ok(())
                }
            }
            let mut count = Count(0);
            // `Display` of a JSON number is its JSON text; writing to a counter cannot fail.
            let _ = std::fmt::Write::write_fmt(&mut count, format_args!("{number}"));
            count.0
        }
        Value::String(text) => json_str_len(text),
        Value::Array(items) => 2 + items.len().saturating_sub(1) + items.iter().map(json_len).sum::<usize>(),
        Value::Object(map) => {
            2 + map.len().saturating_sub(1)
                + map.iter().map(|(key, item)| json_str_len(key) + 1 + json_len(item)).sum::<usize>()
        }
    }
}

/// The number of decimal digits of `n`.
fn decimal_digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

fn json_str_len(text: &str) -> usize {
    // Most text needs no escape: this test vectorizes, the per-byte count below does not.
    if text.bytes().all(|byte| byte >= 0x20 && byte != b'"' && byte != b'\\') {
        return 2 + text.len();
    }
    2 + text
        .bytes()
        .map(|byte| match byte {
            b'"' | b'\\' | 0x08 | b'\t' | b'\n' | 0x0c | b'\r' => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::json_len;

    #[test]
    fn json_len_matches_serde_json() {
        let values = [
            json!(null),
            json!(true),
            json!(false),
            json!(0),
            json!(-12345678901234_i64),
            json!(u64::MAX),
            json!(9),
            json!(10),
            json!(-1),
            json!(-10),
            json!(i64::MIN),
            json!(1.5),
            json!(1e300),
            json!(-0.000123),
            json!(""),
            json!("plain"),
            json!("quote \" backslash \\ controls \u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f} del \u{7f}"),
            json!("naïve café ☕ 日本語 🚀 / </script>"),
            json!([]),
            json!({}),
            json!([1, "two", [3], {"four": 4}]),
            json!({"a": {"b\"c": [null, false, 2.25]}, "é": "ü", "": ""}),
        ];
        for value in values {
            assert_eq!(json_len(&value), serde_json::to_string(&value).unwrap().len(), "{value}");
        }
    }
}
