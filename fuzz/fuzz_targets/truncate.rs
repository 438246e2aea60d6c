//! Middle-out truncation of any text at any budget: within the budget, whole characters, the
//! head and the tail kept.
#![no_main]

use kuralle::truncate::{MARKER, estimate_tokens, truncate_middle_out};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((&budget, rest)) = data.split_first() else { return };
    let max_tokens = usize::from(budget);
    let text = String::from_utf8_lossy(rest).into_owned();
    let out = truncate_middle_out(&Value::String(text.clone()), max_tokens);
    if estimate_tokens(&text) <= max_tokens {
        assert_eq!(out, Value::String(text));
        return;
    }
    let shown = out["value"].as_str().expect("a truncated value");
    assert!(estimate_tokens(shown) <= max_tokens.max(1));
    let head_chars = (max_tokens * 4).saturating_sub(MARKER.chars().count()) / 2;
    let head_end = shown.char_indices().nth(head_chars).map_or(shown.len(), |(i, _)| i);
    let (head, rest) = shown.split_at(head_end);
    let tail = rest.strip_prefix(MARKER).expect("the marker follows the head");
    assert!(text.starts_with(head) && text.ends_with(tail));
});
