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
    /// (a prepare, `Parse`/`Describe`/`Sync`, executes none; a simple query of several
    /// statements counts as one).
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

#[derive(Debug)]
enum State {
    /// Collecting a header: an untyped startup one (length, code: 8 bytes) or a typed one
    /// (type, length: 5 bytes); `got` of them so far.
    Header { typed: bool, buf: [u8; 8], got: usize },
    /// Skipping `left` bytes of a body; `then_typed` says what follows.
    Body { left: u64, then_typed: bool },
    /// Not PostgreSQL's plain frontend protocol: nothing more is counted.
    Lost,
}

impl Default for State {
    /// A connection starts with a startup message (or an SSL, GSS or cancel request).
    fn default() -> Self {
        header(false)
    }
}

/// The startup codes after which the client starts over with another startup message.
const SSL_REQUEST: u32 = 80_877_103;
const GSS_REQUEST: u32 = 80_877_104;
/// The protocol version 3.0 (a startup message proper).
const PROTOCOL_3: u32 = 196_608;
/// The server refuses a longer startup message (`MAX_STARTUP_PACKET_LENGTH`).
const MAX_STARTUP: u32 = 10_000;
/// A typed message longer than this is taken for bytes of something else.
const MAX_MESSAGE: u32 = 1 << 30;

impl Frames {
    /// Counts the whole messages `bytes` completes, keeping a partial one for the next call.
    pub fn feed(&mut self, mut bytes: &[u8], counts: &Counts) {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Lost => return,
                State::Header { typed, buf, got } => {
                    let need = if *typed { 5 } else { 8 };
                    let take = (need - *got).min(bytes.len());
                    buf[*got..*got + take].copy_from_slice(&bytes[..take]);
                    *got += take;
                    bytes = &bytes[take..];
                    if *got == need {
                        self.state = next(*typed, &buf[..need], counts);
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
    State::Header { typed, buf: [0; 8], got: 0 }
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
    if !(8..=MAX_STARTUP).contains(&len) {
        return State::Lost;
    }
    match code {
        // The server answers with one byte: `N`, and the client sends its startup message;
        // `S` (TLS) or `G` (GSSAPI), and an encrypted session follows, which is lost here.
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

    /// Each case ends with a simple query that would count if the counting went on.
    #[test]
    fn other_bytes_count_nothing() {
        let query = typed(b'Q', b"SELECT 1\0");
        let after = |mut bytes: Vec<u8>| {
            bytes.extend(&query);
            counted(&[&bytes])
        };
        assert_eq!(after(b"hello, this is not postgres".to_vec()), (0, 0));
        // A TLS ClientHello after an SSL request the server accepted.
        let mut tls = 8u32.to_be_bytes().to_vec();
        tls.extend(SSL_REQUEST.to_be_bytes());
        tls.extend([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]);
        assert_eq!(after(tls), (0, 0));
        // A cancel request: the connection carries nothing else.
        let mut cancel = 16u32.to_be_bytes().to_vec();
        cancel.extend(80_877_102u32.to_be_bytes());
        cancel.extend([0; 8]);
        assert_eq!(after(cancel), (0, 0));
        // A startup message shorter than its header, or longer than the server takes.
        let mut short = 7u32.to_be_bytes().to_vec();
        short.extend(PROTOCOL_3.to_be_bytes());
        assert_eq!(after(short), (0, 0));
        let mut long = (MAX_STARTUP + 1).to_be_bytes().to_vec();
        long.extend(PROTOCOL_3.to_be_bytes());
        assert_eq!(after(long), (0, 0));
        // A typed message whose length cannot count itself.
        let mut bad = startup();
        bad.extend([b'E', 0, 0, 0, 3]);
        assert_eq!(after(bad), (0, 0));
        // The same query after a well-formed start does count: the cases above are not vacuous.
        assert_eq!(after(startup()), (1, 1));
    }
}
