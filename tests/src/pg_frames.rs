//! Counts a PostgreSQL client's messages in the bytes it sends, so that a test can tell how
//! many statements and requests a store's call made ([`FaultProxy`](crate::fault_proxy::FaultProxy)
//! feeds it what it forwards to the server).
//!
//! The frontend protocol: untyped startup messages (`int32` length, then a code: a protocol
//! version, or an SSL, GSS or cancel request), then typed messages (one type byte, an `int32`
//! length that counts itself, the body). Bytes that do not parse as that (another protocol,
//! a TLS session) end the counting for the connection; they are still forwarded.
//!
//! ```
//! use kuralle_tests::pg_frames::{Counts, Frames};
//!
//! let counts = Counts::default();
//! let mut frames = Frames::default();
//! let mut bytes = vec![0, 0, 0, 8, 0, 3, 0, 0]; // startup, protocol 3.0, no parameters
//! bytes.extend([b'B', 0, 0, 0, 4, b'E', 0, 0, 0, 9, 0, 0, 0, 0, 0, b'S', 0, 0, 0, 4]);
//! frames.feed(&bytes[..11], &counts); // split anywhere
//! frames.feed(&bytes[11..], &counts);
//! assert_eq!((counts.statements(), counts.requests()), (1, 1));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// What the clients asked of the server so far.
#[derive(Debug, Default)]
pub struct Counts {
    statements: AtomicU64,
    requests: AtomicU64,
}

impl Counts {
    /// Statements executed: extended-protocol `Execute` messages and simple `Query` messages
    /// (a prepare, `Parse`/`Describe`/`Sync`, executes none).
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// Requests the server answers as one: `Sync` messages and simple `Query` messages. One
    /// request is one round trip unless the client pipelines them.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// A connection's parse state, fed its client's bytes in order.
#[derive(Debug, Default)]
pub struct Frames {
    state: State,
}

#[derive(Debug, Default)]
enum State {
    /// Before the startup message: collecting an untyped header (length, code).
    #[default]
    Startup,
    /// Collecting a header: the untyped startup one (8 bytes) or a typed one (5 bytes).
    Header { typed: bool, got: Vec<u8> },
    /// Skipping `left` bytes of a body; `then_typed` says what follows.
    Body { left: u64, then_typed: bool },
    /// Not PostgreSQL's plain frontend protocol: nothing more is counted.
    Lost,
}

/// The startup codes after which the client starts over with another startup message.
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
/// The protocol version 3.0 (a startup message proper).
const PROTOCOL_3: u32 = 196_608;
/// A message longer than this is taken for bytes of something else.
const MAX_MESSAGE: u32 = 1 << 30;

impl Frames {
    /// Counts the whole messages `bytes` completes, keeping a partial one for the next call.
    pub fn feed(&mut self, mut bytes: &[u8], counts: &Counts) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Lost => return,
                State::Startup => self.state = State::Header { typed: false, got: Vec::with_capacity(8) },
                State::Header { typed, got } => {
                    let need = if *typed { 5 } else { 8 };
                    let take = (need - got.len()).min(bytes.len());
                    got.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if got.len() == need {
                        self.state = next(*typed, got, counts);
                    }
                }
                State::Body { left, then_typed } => {
                    let take = (*left).min(bytes.len() as u64);
                    bytes = &bytes[take as usize..];
                    *left -= take;
                    if *left == 0 {
                        self.state = header(*then_typed);
                    }
                }
            }
        }
    }
}

fn header(typed: bool) -> State {
    State::Header { typed, got: Vec::with_capacity(8) }
}

/// The state after a complete header `got`.
fn next(typed: bool, got: &[u8], counts: &Counts) -> State {
    let word = |at: usize| u32::from_be_bytes([got[at], got[at + 1], got[at + 2], got[at + 3]]);
    if typed {
        let (kind, len) = (got[0], word(1));
        if !(4..MAX_MESSAGE).contains(&len) {
            return State::Lost;
        }
        match kind {
            b'E' => {
                counts.statements.fetch_add(1, Ordering::Relaxed);
            }
            b'S' => {
                counts.requests.fetch_add(1, Ordering::Relaxed);
            }
            b'Q' => {
                counts.statements.fetch_add(1, Ordering::Relaxed);
                counts.requests.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        return body(u64::from(len - 4), true);
    }
    let (len, code) = (word(0), word(4));
    if !(8..MAX_MESSAGE).contains(&len) {
        return State::Lost;
    }
    match code {
        // The server answers with one byte; on `S` a TLS session follows, which is lost here.
        SSL_REQUEST | GSS_REQUEST => body(u64::from(len - 8), false),
        PROTOCOL_3 => body(u64::from(len - 8), true),
        // A cancel request, or a protocol this does not know.
        _ => State::Lost,
    }
}

fn body(left: u64, then_typed: bool) -> State {
    if left == 0 { header(then_typed) } else { State::Body { left, then_typed } }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend(u32::try_from(body.len() + 4).unwrap().to_be_bytes());
        m.extend(body);
        m
    }

    fn startup() -> Vec<u8> {
        let params = b"user\0postgres\0\0";
        let mut m = u32::try_from(8 + params.len()).unwrap().to_be_bytes().to_vec();
        m.extend(PROTOCOL_3.to_be_bytes());
        m.extend(params);
        m
    }

    fn counted(chunks: &[&[u8]]) -> (u64, u64) {
        let (counts, mut frames) = (Counts::default(), Frames::default());
        for chunk in chunks {
            frames.feed(chunk, &counts);
        }
        (counts.statements(), counts.requests())
    }

    #[test]
    fn counts_executes_syncs_and_queries_however_the_bytes_are_split() {
        let mut ssl = 8u32.to_be_bytes().to_vec();
        ssl.extend(SSL_REQUEST.to_be_bytes());
        let mut all = ssl;
        all.extend(startup());
        for m in [
            // A prepare: no statement, one request.
            typed(b'P', b"\0SELECT 1\0\0\0"),
            typed(b'D', b"S\0"),
            typed(b'S', b""),
            // Two statements pipelined, each with its own sync.
            typed(b'B', &[0; 10]),
            typed(b'E', &[0; 5]),
            typed(b'S', b""),
            typed(b'B', &[0; 10]),
            typed(b'E', &[0; 5]),
            typed(b'S', b""),
            typed(b'Q', b"BEGIN\0"),
        ] {
            all.extend(m);
        }
        assert_eq!(counted(&[&all]), (3, 4));
        let bytes: Vec<&[u8]> = all.chunks(1).collect();
        assert_eq!(counted(&bytes), (3, 4), "a byte at a time");
        let bytes: Vec<&[u8]> = all.chunks(7).collect();
        assert_eq!(counted(&bytes), (3, 4));
    }

    #[test]
    fn other_bytes_count_nothing() {
        assert_eq!(counted(&[b"hello, this is not postgres"]), (0, 0));
        // A TLS ClientHello after an SSL request the server accepted.
        let mut bytes = 8u32.to_be_bytes().to_vec();
        bytes.extend(SSL_REQUEST.to_be_bytes());
        bytes.extend([0x16, 0x03, 0x01, 0x02, 0x00, b'E', b'S']);
        assert_eq!(counted(&[&bytes]), (0, 0));
    }
}
