//! A server-sent-event body cut into reads anywhere: the first byte picks the read size.
#![no_main]

use kuralle::models::sse::{SseEvent, SseParser};
use libfuzzer_sys::fuzz_target;

/// Feeds `pieces` to `parser`, then finishes it.
fn parse<'a>(mut parser: SseParser, pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Vec<SseEvent>> {
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece).ok()?);
    }
    events.extend(parser.finish().ok()?);
    Some(events)
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, body)) = data.split_first() else { return };
    let whole = parse(SseParser::with_max_event_bytes(4096), [body]);
    let split = parse(SseParser::with_max_event_bytes(4096), body.chunks(usize::from(size).max(1)));
    // How the body is cut never changes what it means (when both readings succeed).
    if let (Some(a), Some(b)) = (whole, split) {
        assert_eq!(a, b);
    }
});
