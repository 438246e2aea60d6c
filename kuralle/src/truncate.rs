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

/// Whether `shown` is what [`truncate_middle_out`] makes of `original` at some budget: a
/// truncation marker whose kept head and tail are `original`'s own. Lets a replayed run be
/// compared with its recording when the two truncate at different budgets.
///
/// ```
/// use kuralle::truncate::{is_truncation_of, truncate_middle_out};
/// let big = serde_json::Value::String("ab".repeat(500));
/// assert!(is_truncation_of(&truncate_middle_out(&big, 50), &big));
/// assert!(!is_truncation_of(&truncate_middle_out(&big, 50), &serde_json::json!("other")));
/// ```
pub fn is_truncation_of(shown: &Value, original: &Value) -> bool {
    let (Some(meta), Some(Value::String(kept))) = (shown.get("__truncated"), shown.get("value")) else {
        return false;
    };
    let text = as_text(original);
    let Some((head, tail)) = kept.split_once(MARKER) else { return false };
    meta.get("originalTokens").and_then(Value::as_u64) == Some(estimate_tokens(&text) as u64)
        && text.starts_with(head)
        && text.ends_with(tail)
        && head.len() + tail.len() <= text.len()
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

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// `shown` split at the marker that follows the head of a `max_tokens` cut (the text itself
    /// may contain the marker's characters).
    fn head_and_tail(shown: &str, max_tokens: usize) -> (&str, &str) {
        let budget = (max_tokens * 4).saturating_sub(MARKER.chars().count());
        let head_end = shown.char_indices().nth(budget / 2).map_or(shown.len(), |(i, _)| i);
        let (head, rest) = shown.split_at(head_end);
        (head, rest.strip_prefix(MARKER).expect("the marker follows the head"))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Within budget a value is unchanged; over it, what is shown is a character-exact head
        /// and tail of the text around the marker, within the budget, and its token count is
        /// reported truthfully.
        #[test]
        fn middle_out_keeps_head_and_tail_within_the_limit(
            // One to four UTF-8 bytes per character, newlines, and the marker's own ellipsis.
            text in proptest::collection::vec(proptest::sample::select(&['a', 'é', '日', '🎉', '\n', '\u{2026}', '\u{0}'][..]), 0..400)
                .prop_map(String::from_iter),
            max_tokens in 0usize..120,
        ) {
            let value = Value::String(text.clone());
            let out = truncate_middle_out(&value, max_tokens);
            if estimate_tokens(&text) <= max_tokens {
                prop_assert_eq!(out, value);
                return Ok(());
            }
            let shown = out["value"].as_str().unwrap();
            let shown_tokens = out["__truncated"]["shownTokens"].as_u64().unwrap() as usize;
            prop_assert_eq!(shown_tokens, estimate_tokens(shown));
            // The marker alone is one token: the smallest possible answer.
            prop_assert!(shown_tokens <= max_tokens.max(1), "{} > {}", shown_tokens, max_tokens);
            prop_assert_eq!(out["__truncated"]["originalTokens"].as_u64().unwrap() as usize, estimate_tokens(&text));
            let (head, tail) = head_and_tail(shown, max_tokens);
            // Head and tail are whole characters of the original: a prefix and a suffix.
            prop_assert!(text.starts_with(head));
            prop_assert!(text.ends_with(tail));
            let budget = (max_tokens * 4).saturating_sub(MARKER.chars().count());
            prop_assert_eq!(head.chars().count(), budget / 2);
            prop_assert_eq!(tail.chars().count(), budget - budget / 2);
        }

        /// Strings are cut as themselves, other values as their compact JSON.
        #[test]
        fn json_values_are_cut_as_their_text(v in crate::strategies::json_value(), max_tokens in 1usize..40) {
            let text = match &v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let out = truncate_middle_out(&v, max_tokens);
            if estimate_tokens(&text) > max_tokens {
                let shown = out["value"].as_str().unwrap();
                let (head, tail) = head_and_tail(shown, max_tokens);
                prop_assert!(text.starts_with(head) && text.ends_with(tail));
            } else {
                prop_assert_eq!(out, v);
            }
        }
    }
}
