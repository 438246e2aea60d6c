//! HTML building blocks: escaping and the page frame. Everything user- or model-supplied goes
//! through [`esc`].

use std::fmt::Write;

/// Escapes untrusted text for display (element content, titles): markup escaped, invisible
/// and bidirectional characters shown as `<U+202E>`.
pub fn esc(s: &str) -> String {
    attr(&crate::clean::visible(s))
}

/// Escapes text for a double-quoted attribute value that is sent back as typed (a form field).
pub fn attr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a path segment or query value.
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A whole page around `body`.
pub fn page(title: &str, body: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · kuralle</title>
<style>{STYLE}</style>
</head>
<body>
<header><a href="/" class="brand">kuralle</a> <span class="sub">runs console</span></header>
<main>
{body}
</main>
</body>
</html>
"#,
        title = esc(title),
    )
}

const STYLE: &str = r#"
:root { font-family: system-ui, sans-serif; color: #1d232b; background: #f6f7f9; }
body { margin: 0; }
header { background: #1d232b; color: #fff; padding: .7rem 1.5rem; }
header a.brand { color: #fff; font-weight: 700; text-decoration: none; }
header .sub { color: #9aa4b2; margin-left: .5rem; }
main { padding: 1rem 1.5rem 3rem; max-width: 1200px; }
h1 { font-size: 1.3rem; margin: .6rem 0; }
h2 { font-size: 1.05rem; margin: 1.5rem 0 .5rem; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #e3e6ea; vertical-align: top; font-size: .9rem; }
th { background: #eef0f3; font-weight: 600; }
code, pre { font-family: ui-monospace, monospace; font-size: .82rem; }
pre { margin: .3rem 0; white-space: pre-wrap; word-break: break-all; background: #f3f4f6; padding: .4rem; max-height: 24rem; overflow: auto; }
details summary { cursor: pointer; color: #364152; }
.badge { display: inline-block; padding: .05rem .5rem; border-radius: .7rem; font-size: .8rem; background: #e3e6ea; }
.paused { background: #fde8b0; } .failed, .limit_exceeded { background: #f8c9c4; } .finished { background: #c9ecd2; } .running { background: #cfe2fb; } .cancelled { background: #e5d4f5; }
.filters a { margin-right: .6rem; } .filters a.on { font-weight: 700; } form.filters { margin-bottom: .8rem; }
.notice { padding: .6rem .8rem; background: #e6f4ea; border: 1px solid #9fd3ad; margin: .8rem 0; }
.error { padding: .6rem .8rem; background: #fdecea; border: 1px solid #f1a9a0; margin: .8rem 0; }
.approval { background: #fff; border: 1px solid #f0c36d; padding: .7rem .9rem; margin: .6rem 0; }
.approval form { display: inline-block; margin: .4rem 1rem .2rem 0; }
.approval input[type=text] { padding: .25rem .4rem; }
.who { float: right; color: #9aa4b2; } .who form { display: inline; } .who button { background: none; color: #9aa4b2; padding: 0 .3rem; }
pre.args { max-height: none; }
button { padding: .3rem .9rem; border: 0; border-radius: .3rem; cursor: pointer; font-weight: 600; }
button.approve { background: #1f8a4c; color: #fff; } button.deny { background: #c0392b; color: #fff; }
.bar { position: relative; height: .7rem; background: #f0f1f4; min-width: 8rem; }
.bar span { position: absolute; top: 0; bottom: 0; background: #5b8def; min-width: 2px; }
.muted { color: #6b7683; }
.columns { display: flex; gap: 1.2rem; align-items: flex-start; } .columns .conversation { flex: 0 0 28%; min-width: 16rem; } .columns .timeline { flex: 1; overflow-x: auto; }
.say { margin: .4rem 0; padding: .4rem .6rem; border-radius: .4rem; background: #f3f4f6; } .say.user { background: #e8f0fe; } .say.reasoning { background: #fff8e1; font-style: italic; }
.say .who { font-size: .75rem; text-transform: uppercase; color: #6b7683; } .say .text { white-space: pre-wrap; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .2rem 1rem; }
dl.meta dt { color: #6b7683; } dl.meta dd { margin: 0; }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(esc(r#"<b a="1">&'"#), "&lt;b a=&quot;1&quot;&gt;&amp;&#39;");
        assert_eq!(url("a b/é"), "a%20b%2F%C3%A9");
        assert_eq!(esc("9\u{202E}00"), "9&lt;U+202E&gt;00");
        assert_eq!(attr("9\u{202E}00"), "9\u{202E}00");
    }
}
