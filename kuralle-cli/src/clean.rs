//! Untrusted text made safe to look at. Tool arguments, results, run ids and agent names come
//! from models and callers; shown raw, a right-to-left override can make `900` read as `009`,
//! a zero-width space can hide inside a name, and a terminal escape can rewrite what is on the
//! screen (or the window title, or the clipboard).

use std::fmt::Write;

/// Whether `c` changes how neighbouring text is ordered or is not drawn at all.
fn is_hidden(c: char) -> bool {
    matches!(c,
        '\u{00AD}'                   // soft hyphen
        | '\u{034F}'                 // combining grapheme joiner
        | '\u{061C}'                 // Arabic letter mark
        | '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' // Hangul fillers
        | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}'    // Mongolian selectors and vowel separator
        | '\u{200B}'..='\u{200F}'    // zero-width space/joiners, LRM, RLM
        | '\u{202A}'..='\u{202E}'    // bidi embeddings and overrides
        | '\u{2060}'..='\u{206F}'    // word joiner, invisible operators, bidi isolates
        | '\u{FE00}'..='\u{FE0F}'    // variation selectors
        | '\u{FEFF}'                 // zero-width no-break space
        | '\u{FFF9}'..='\u{FFFB}'    // interlinear annotations
        | '\u{E0000}'..='\u{E007F}'  // tag characters
        | '\u{E0100}'..='\u{E01EF}') // variation selectors supplement
}

/// `s` with every invisible or bidirectional character shown as `<U+202E>`.
pub fn visible(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_hidden(c) {
            let _ = write!(out, "<U+{:04X}>", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` for a terminal: escape sequences (CSI, OSC and the like) removed, other control
/// characters removed (newlines and tabs kept when `multiline`, else made spaces), and hidden
/// characters made [`visible`].
pub fn terminal(s: &str, multiline: bool) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' | '\u{9b}' | '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => {
                skip_sequence(c, &mut chars);
            }
            '\n' | '\t' if multiline => out.push(c),
            '\n' | '\t' | '\r' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    visible(&out)
}

/// Consumes the rest of an escape sequence that began with `first`.
fn skip_sequence(first: char, chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    let kind = if first == '\x1b' {
        match chars.next() {
            Some('[') => '\u{9b}',
            Some(']') => '\u{9d}',
            Some(c @ ('P' | 'X' | '^' | '_')) => char::from_u32(u32::from(c) + 0x40).unwrap_or('\u{90}'),
            // A two-character sequence (ESC c, ESC 7, ...): already consumed.
            _ => return,
        }
    } else {
        first
    };
    if kind == '\u{9b}' {
        // CSI: parameters and intermediates, then one final byte in @..~.
        for c in chars.by_ref() {
            if ('\u{40}'..='\u{7e}').contains(&c) {
                return;
            }
        }
        return;
    }
    // OSC, DCS, SOS, PM, APC: a string up to BEL or ST (ESC \ or U+009C).
    while let Some(c) = chars.next() {
        match c {
            '\x07' | '\u{9c}' => return,
            '\x1b' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_shown() {
        assert_eq!(visible("pay \u{202E}009\u{202C} now"), "pay <U+202E>009<U+202C> now");
        assert_eq!(visible("ali\u{200B}ce"), "ali<U+200B>ce");
        assert_eq!(visible("plain é 漢"), "plain é 漢");
    }

    #[test]
    fn terminal_escapes_are_removed() {
        assert_eq!(terminal("\x1b[31mred\x1b[0m", false), "red");
        assert_eq!(terminal("a\x1b]0;owned title\x07b", false), "ab");
        assert_eq!(terminal("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", false), "alinkb");
        assert_eq!(terminal("x\u{9b}2Jy", false), "xy");
        assert_eq!(terminal("bell\x07 back\x08", false), "bell back");
        assert_eq!(terminal("two\nlines\r", false), "two lines ");
        assert_eq!(terminal("two\nlines", true), "two\nlines");
        assert_eq!(terminal("\u{202E}x", true), "<U+202E>x");
    }
}
