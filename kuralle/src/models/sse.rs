//! A provider-neutral, incremental parser for server-sent events (the WHATWG `text/event-stream`
//! format): bytes in, split anywhere (even inside a UTF-8 character or between a CR and its LF),
//! events out at each blank line.
//!
//! Only `data:` and `event:` are kept; comments (`:`), `id:` and `retry:` are ignored. Lines end
//! with CRLF, LF or a lone CR, as the format allows. One event is bounded
//! ([`SseParser::with_max_event_bytes`]), so a server cannot grow the buffer without limit by
//! never ending a line or an event.
//!
//! ```
//! use kuralle::models::sse::{SseEvent, SseParser};
//!
//! let mut parser = SseParser::default();
//! let mut events = parser.push(b"event: ping\rdata: {\"a\":").unwrap();
//! events.extend(parser.push(b"1}\r\n\r\ndata: [DONE]").unwrap());
//! events.extend(parser.finish().unwrap());
//! assert_eq!(events, vec![
//!     SseEvent { event: Some("ping".into()), data: "{\"a\":1}".into() },
//!     SseEvent { event: None, data: "[DONE]".into() },
//! ]);
//! ```

use crate::ModelError;

/// The default bound on one event (its pending line plus its `data`): 16 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 << 20;

/// One dispatched server-sent event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// An incremental SSE parser; see the [module docs](self).
#[derive(Debug)]
pub struct SseParser {
    buf: Vec<u8>,
    /// How far `buf` is known to hold no line break.
    scanned: usize,
    /// The last line ended in a CR: a LF that follows belongs to it (CRLF), not to a new line.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    max_event_bytes: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    /// A parser that rejects an event larger than `max` bytes (pending line plus data).
    pub fn with_max_event_bytes(max: usize) -> Self {
        Self {
            buf: Vec::new(),
            scanned: 0,
            after_cr: false,
            event: None,
            data: String::new(),
            has_data: false,
            max_event_bytes: max,
        }
    }

    /// Feeds the next bytes of the body; returns the events they complete.
    ///
    /// # Errors
    /// [`ModelError::Protocol`] for a line that is not UTF-8 or an event over the size bound.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<Vec<SseEvent>, ModelError> {
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        self.buf.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.buf);
        let mut events = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        let mut result = Ok(());
        while let Some(offset) = buf[from..].iter().position(|b| *b == b'\n' || *b == b'\r') {
            let end = from + offset;
            if let Err(e) = self.line(&buf[start..end], &mut events) {
                result = Err(e);
                break;
            }
            start = end + 1;
            if buf[end] == b'\r' {
                match buf.get(start) {
                    Some(b'\n') => start += 1,
                    Some(_) => {}
                    // The LF of a CRLF may come with the next chunk.
                    None => self.after_cr = true,
                }
            }
            from = start;
        }
        self.buf = buf;
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        result?;
        if self.buf.len() + self.data.len() > self.max_event_bytes {
            return Err(ModelError::Protocol(format!("a server-sent event exceeds {} bytes", self.max_event_bytes)));
        }
        Ok(events)
    }

    /// The end of the body: a last line without a line break, and an event without its blank
    /// line, are dispatched.
    ///
    /// # Errors
    /// As [`SseParser::push`].
    pub fn finish(&mut self) -> Result<Vec<SseEvent>, ModelError> {
        let mut events = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        self.scanned = 0;
        self.after_cr = false;
        if !rest.is_empty() {
            self.line(&rest, &mut events)?;
        }
        self.line(b"", &mut events)?;
        Ok(events)
    }

    fn line(&mut self, line: &[u8], events: &mut Vec<SseEvent>) -> Result<(), ModelError> {
        if line.is_empty() {
            if self.has_data {
                events.push(SseEvent { event: self.event.take(), data: std::mem::take(&mut self.data) });
                self.has_data = false;
            }
            self.event = None;
            return Ok(());
        }
        let line = std::str::from_utf8(line)
            .map_err(|e| ModelError::Protocol(format!("a server-sent event line is not UTF-8: {e}")))?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parse_all(pieces: &[&[u8]]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(parser.push(piece).unwrap());
        }
        events.extend(parser.finish().unwrap());
        events
    }

    #[test]
    fn sse_events_survive_every_split_point() {
        let body =
            "data: {\"a\":\"é\"}\r\n\r\n: keep-alive\n\nevent: error\rdata: x\ndata: y\r\rdata: [DONE]\n\n".as_bytes();
        let expected = vec![
            SseEvent { event: None, data: "{\"a\":\"é\"}".into() },
            SseEvent { event: Some("error".into()), data: "x\ny".into() },
            SseEvent { event: None, data: "[DONE]".into() },
        ];
        assert_eq!(parse_all(&[body]), expected);
        for split in 0..body.len() {
            assert_eq!(parse_all(&[&body[..split], &body[split..]]), expected, "split at {split}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(parse_all(&bytes), expected);
    }

    #[test]
    fn a_lone_cr_ends_a_line_and_a_crlf_split_across_reads_is_one_break() {
        assert_eq!(
            parse_all(&[b"data: a\r\rdata: b\r"]),
            vec![SseEvent { event: None, data: "a".into() }, SseEvent { event: None, data: "b".into() },]
        );
        // CR at the end of one read, LF at the start of the next: one line break, no blank line.
        assert_eq!(
            parse_all(&[b"data: a\r", b"\ndata: b\r\n\r\n"]),
            vec![SseEvent { event: None, data: "a\nb".into() }]
        );
    }

    #[test]
    fn sse_last_event_without_blank_line_is_dispatched_at_the_end() {
        assert_eq!(parse_all(&[b"data: [DONE]"]), vec![SseEvent { event: None, data: "[DONE]".into() }]);
    }

    #[test]
    fn an_endless_line_or_event_is_refused_at_the_bound() {
        let mut parser = SseParser::with_max_event_bytes(1024);
        assert!(parser.push(&[b'x'; 1000]).is_ok());
        assert!(matches!(parser.push(&[b'x'; 100]), Err(ModelError::Protocol(_))));
        let mut parser = SseParser::with_max_event_bytes(1024);
        let line = format!("data: {}\n", "y".repeat(100));
        let mut failed = false;
        for _ in 0..20 {
            failed |= parser.push(line.as_bytes()).is_err();
        }
        assert!(failed, "data lines without a blank line accumulate up to the bound");
    }

    /// A body made of events (with comments, `id:`, CR/LF/CRLF line ends), and what it yields.
    fn body_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<SseEvent>)> {
        let line_end = prop_oneof![Just("\n"), Just("\r"), Just("\r\n")];
        let data_line = "[^\r\n]{0,12}";
        let event = (
            proptest::option::of("[a-z]{1,6}"),
            proptest::collection::vec(data_line, 1..4),
            any::<bool>(),
            proptest::collection::vec(line_end.clone(), 6),
        );
        proptest::collection::vec(event, 0..6).prop_map(|events| {
            let mut body = String::new();
            let mut expected = Vec::new();
            for (name, lines, comment, ends) in events {
                if comment {
                    body.push_str(": keep-alive");
                    body.push_str(ends[0]);
                    body.push_str("id: 7");
                    body.push_str(ends[1]);
                }
                if let Some(name) = &name {
                    body.push_str("event: ");
                    body.push_str(name);
                    body.push_str(ends[2]);
                }
                for line in &lines {
                    body.push_str("data: ");
                    body.push_str(line);
                    body.push_str(ends[3]);
                }
                // The blank line repeats the last line end: a CR then a LF would be one CRLF.
                body.push_str(ends[3]);
                // `data: ` loses exactly one space, so a line's own leading space is kept.
                let data = lines.join("\n");
                expected.push(SseEvent { event: name, data });
            }
            (body.into_bytes(), expected)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any split of a well-formed body yields the same events as the whole body.
        #[test]
        fn any_split_yields_the_same_events((body, expected) in body_strategy(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6)) {
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
            points.sort_unstable();
            let mut pieces = Vec::new();
            let mut last = 0;
            for p in points {
                pieces.push(&body[last..p]);
                last = p;
            }
            pieces.push(&body[last..]);
            prop_assert_eq!(parse_all(&pieces), expected);
        }

        /// Arbitrary bytes in arbitrary pieces: an error or events, never a panic, and the
        /// buffer stays within the bound.
        #[test]
        fn arbitrary_bytes_never_panic(pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8)) {
            let mut parser = SseParser::with_max_event_bytes(128);
            for piece in &pieces {
                if parser.push(piece).is_err() {
                    return Ok(());
                }
                prop_assert!(parser.buf.len() + parser.data.len() <= 128);
            }
            let _ = parser.finish();
        }
    }
}
