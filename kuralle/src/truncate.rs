//! Middle-out truncation of tool results where they enter the transcript.
//!
//! One unit throughout: a token is estimated as a quarter of a character (Unicode scalar
//! value), rounded up, and cuts are made in characters, so the estimate of what is shown never
//! exceeds the budget and no character is ever split.

use serde_json::{Value, json};

/// The marker between the kept head and tail: newline, U+2026 HORIZONTAL ELLIPSIS, newline.
pub const MARKER: &str = "\n\u{2026}\n";

/// Estimated tokens of `text`: `ceil(chars / 4)`.
///
/// ```
/// assert_eq!(kuralle::truncate::estimate_tokens(""), 0);
/// assert_eq!(kuralle::truncate::estimate_tokens("héllo"), 2);
/// ```
pub fn estimate_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// Counts the characters of what is written to it, without keeping it.
struct CharCounter(usize);

impl std::io::Write for CharCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Every character has exactly one byte that is not a UTF-8 continuation byte.
        self.0 += buf.iter().filter(|&&b| (b & 0xC0) != 0x80).count();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Characters of `value`'s compact JSON text, counted without building it.
pub(crate) fn json_chars(value: &impl serde::Serialize) -> usize {
    let mut counter = CharCounter(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Characters of the text a value is measured as, computed without building the text.
fn text_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        other => json_chars(other),
    }
}

/// The text a value is measured and cut as: a string as itself, anything else as compact JSON.
fn as_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Caps `value` at `max_tokens` for the transcript. A value within budget is returned as is;
/// a larger one becomes
/// `{"__truncated":{"originalTokens","shownTokens","note"},"value":"<head>\n…\n<tail>"}`
/// keeping the head and the tail (the end usually holds the error, the total, the last record).
///
/// ```
/// use kuralle::truncate::truncate_middle_out;
/// let big = serde_json::Value::String("x".repeat(1000));
/// let out = truncate_middle_out(&big, 100);
/// assert_eq!(out["__truncated"]["originalTokens"], 250);
/// assert_eq!(out["__truncated"]["shownTokens"], 100);
/// let small = serde_json::json!({"ok": true});
/// assert_eq!(truncate_middle_out(&small, 100), small);
/// ```
pub fn truncate_middle_out(value: &Value, max_tokens: usize) -> Value {
    if text_chars(value).div_ceil(4) <= max_tokens { value.clone() } else { truncated(value, max_tokens) }
}

/// As [`truncate_middle_out`], taking the value by value so one within budget is moved, not
/// copied.
pub fn truncate_owned(value: Value, max_tokens: usize) -> Value {
    if text_chars(&value).div_ceil(4) <= max_tokens { value } else { truncated(&value, max_tokens) }
}

fn truncated(value: &Value, max_tokens: usize) -> Value {
    let text = as_text(value);
    let original_tokens = estimate_tokens(&text);
    let marker_chars = MARKER.chars().count();
    let budget = (max_tokens * 4).saturating_sub(marker_chars);
    let head_chars = budget / 2;
    let tail_chars = budget - head_chars;
    let total_chars = text.chars().count();

    let head_end = text.char_indices().nth(head_chars).map_or(text.len(), |(i, _)| i);
    let tail_start = text.char_indices().nth(total_chars - tail_chars).map_or(text.len(), |(i, _)| i).max(head_end);
    let joined = format!("{}{MARKER}{}", &text[..head_end], &text[tail_start..]);
    let shown_tokens = estimate_tokens(&joined);
    let removed = original_tokens.saturating_sub(shown_tokens);
    json!({
        "__truncated": {
            "originalTokens": original_tokens,
            "shownTokens": shown_tokens,
            "note": format!(
                "tool output truncated: ~{removed} tokens removed from the middle. Re-run the tool with narrower output to see the rest."
            ),
        },
        "value": joined,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_head_and_tail_within_budget() {
        let lines: String = (0..2000).map(|i| format!("line-{i}: record\n")).collect::<String>() + "FINAL-RECORD-END";
        let out = truncate_middle_out(&Value::String(lines), 100);
        let shown = out["value"].as_str().unwrap();
        assert!(shown.starts_with("line-0:"));
        assert!(shown.ends_with("FINAL-RECORD-END"));
        assert!(out["__truncated"]["shownTokens"].as_u64().unwrap() <= 100);
        assert_eq!(out["__truncated"]["shownTokens"].as_u64().unwrap() as usize, estimate_tokens(shown));
    }

    #[test]
    fn never_splits_a_character() {
        let text: String = "日本語🎉é".repeat(500);
        for max in [1, 2, 3, 7, 50, 333] {
            let out = truncate_middle_out(&Value::String(text.clone()), max);
            let shown = out["value"].as_str().unwrap();
            assert!(!shown.contains('\u{FFFD}'));
            assert!(out["__truncated"]["shownTokens"].as_u64().unwrap() as usize <= max.max(1));
        }
    }

    #[test]
    fn tiny_budget_still_terminates() {
        let out = truncate_middle_out(&Value::String("abcdefghij".into()), 0);
        assert_eq!(out["value"], MARKER);
    }
}
