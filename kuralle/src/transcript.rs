//! [`Transcript`]: the conversation a [`ModelRequest`](crate::ModelRequest) carries, shared
//! between requests instead of copied into each.
//!
//! A run sends the model the whole conversation on every step. Copying it each time makes a
//! run of n steps cost O(n²) (the TypeScript original's 17 ms per call at a thousand calls);
//! a `Transcript` is an append-only log with cheap snapshots, so a request costs the same at
//! step 5,000 as at step 1, and a recorder that keeps every request keeps one log.

use std::{
    fmt,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::model::Message;

/// Messages of a log's first chunk: a question and its answer. A run holds its log from its
/// start, and 10,000 runs started at once each wrote a chunk of eight (a kilobyte) before
/// their first model call; a plain question and answer needs no more than this one.
const FIRST_CHUNK: usize = 2;
/// Messages of the first two chunks together: a user message and three tool-call turns with
/// their results and the answer. After them, chunk `k` holds `SHORT << (k - 1)` messages (16,
/// 32, ...), so chunks never move once written and the log grows without copying.
const SHORT: usize = 8;
/// Enough chunks for more messages than memory can hold (8 × (2³² − 1) messages of over
/// 100 bytes each).
const CHUNKS: usize = 33;

/// Messages of chunk `k`.
fn chunk_len(k: usize) -> usize {
    match k {
        0 => FIRST_CHUNK,
        1 => SHORT - FIRST_CHUNK,
        k => SHORT << (k - 1),
    }
}

/// Message slots of one chunk.
type Chunk = Box<[OnceLock<Message>]>;

/// The shared, append-only storage behind snapshots.
///
/// Every in-flight run holds one, so its own size counts: the first two chunks' pointers are
/// inline and the table of the others is allocated only when a conversation outgrows them
/// (88 bytes for a short run instead of a 744-byte table).
struct Log {
    first: OnceLock<Chunk>,
    second: OnceLock<Chunk>,
    rest: OnceLock<Box<[OnceLock<Chunk>; CHUNKS - 2]>>,
    /// Slots claimed so far; a slot below it is written before any snapshot covering it
    /// exists.
    claimed: AtomicUsize,
}

impl Log {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            first: OnceLock::new(),
            second: OnceLock::new(),
            rest: OnceLock::new(),
            claimed: AtomicUsize::new(0),
        })
    }

    /// Chunk `k`, if written.
    fn chunk(&self, k: usize) -> Option<&[OnceLock<Message>]> {
        let chunk = match k {
            0 => self.first.get(),
            1 => self.second.get(),
            k => self.rest.get()?[k - 2].get(),
        };
        chunk.map(|c| &c[..])
    }

    /// Chunk `k`, allocated on first use.
    fn chunk_or_init(&self, k: usize) -> &[OnceLock<Message>] {
        let slots = || (0..chunk_len(k)).map(|_| OnceLock::new()).collect();
        match k {
            0 => self.first.get_or_init(slots),
            1 => self.second.get_or_init(slots),
            k => self.rest.get_or_init(|| Box::new(std::array::from_fn(|_| OnceLock::new())))[k - 2].get_or_init(slots),
        }
    }
}

/// `(chunk, offset)` of message `i`.
fn place(i: usize) -> (usize, usize) {
    if i < FIRST_CHUNK {
        return (0, i);
    }
    if i < SHORT {
        return (1, i - FIRST_CHUNK);
    }
    // Past the first two, chunks double from `SHORT` as if those two were one of `SHORT`.
    let q = i / SHORT + 1;
    let doubled = (usize::BITS - 1 - q.leading_zeros()) as usize;
    (doubled + 1, i - SHORT * ((1 << doubled) - 1))
}

/// A conversation: user input, model responses and tool results, in order.
///
/// Cloning is O(1): a clone is a snapshot of the same log. [`push`](Self::push) appends in
/// place when this snapshot is the log's newest, and otherwise copies its own messages into a
/// new log first (so snapshots never see each other's later messages).
///
/// ```
/// use kuralle::{Message, Transcript};
/// let mut transcript = Transcript::new();
/// transcript.push(Message::User { content: "hi".into() });
/// let before = transcript.clone();
/// transcript.push(Message::assistant_text("hello"));
/// assert_eq!((before.len(), transcript.len()), (1, 2));
/// assert_eq!(transcript[0], Message::User { content: "hi".into() });
/// assert_eq!(serde_json::to_string(&before).unwrap(), r#"[{"role":"user","content":"hi"}]"#);
/// ```
#[derive(Clone)]
pub struct Transcript {
    log: Arc<Log>,
    len: usize,
}

impl Default for Transcript {
    fn default() -> Self {
        Self::new()
    }
}

impl Transcript {
    /// An empty transcript.
    pub fn new() -> Self {
        Self { log: Log::new(), len: 0 }
    }

    /// Messages in this snapshot.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Message `i`, if `i < len()`.
    pub fn get(&self, i: usize) -> Option<&Message> {
        if i >= self.len {
            return None;
        }
        let (chunk, offset) = place(i);
        self.log.chunk(chunk)?.get(offset)?.get()
    }

    /// The first message.
    pub fn first(&self) -> Option<&Message> {
        self.get(0)
    }

    /// The last message.
    pub fn last(&self) -> Option<&Message> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }

    /// The messages in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter { transcript: self, front: 0, back: self.len }
    }

    /// The messages, copied into a `Vec`.
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }

    /// Appends `message`.
    pub fn push(&mut self, message: Message) {
        if self.log.claimed.compare_exchange(self.len, self.len + 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // Another snapshot of this log appended past us: fork, so neither sees the
            // other's messages.
            let mut own = Self::new();
            for m in self.iter() {
                own.push(m.clone());
            }
            *self = own;
            self.log.claimed.store(self.len + 1, Ordering::Release);
        }
        let (chunk, offset) = place(self.len);
        let slots = self.log.chunk_or_init(chunk);
        // The slot was claimed above by this snapshot alone, so it is empty.
        let _ = slots[offset].set(message);
        self.len += 1;
    }

    /// The first `n` messages (all of them when there are fewer), as a new transcript: a
    /// retried or forked turn starts from the transcript before it.
    pub(crate) fn prefix(&self, n: usize) -> Self {
        let mut prefix = Self::new();
        for message in self.iter().take(n) {
            prefix.push(message.clone());
        }
        prefix
    }

    /// Whether `self` is `earlier` with zero or more messages appended (the same log, not a
    /// copy), so a reader that has seen `earlier` only needs the messages after it.
    pub(crate) fn extends(&self, earlier: &Self) -> bool {
        Arc::ptr_eq(&self.log, &earlier.log) && self.len >= earlier.len
    }
}

/// The messages of a [`Transcript`], in order.
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    transcript: &'a Transcript,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        if self.front >= self.back {
            return None;
        }
        self.front += 1;
        self.transcript.get(self.front - 1)
    }

    fn nth(&mut self, n: usize) -> Option<&'a Message> {
        // O(1), so `skip` past what a reader has already seen costs nothing.
        self.front = self.front.saturating_add(n).min(self.back);
        self.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.transcript.get(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Transcript {
    type Item = &'a Message;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl std::ops::Index<usize> for Transcript {
    type Output = Message;

    /// # Panics
    /// When `i >= len()`, like a slice.
    fn index(&self, i: usize) -> &Message {
        match self.get(i) {
            Some(m) => m,
            None => panic!("index {i} out of range for a transcript of {} messages", self.len),
        }
    }
}

impl FromIterator<Message> for Transcript {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        let mut t = Self::new();
        t.extend(iter);
        t
    }
}

impl Extend<Message> for Transcript {
    fn extend<I: IntoIterator<Item = Message>>(&mut self, iter: I) {
        for m in iter {
            self.push(m);
        }
    }
}

impl From<Vec<Message>> for Transcript {
    fn from(messages: Vec<Message>) -> Self {
        messages.into_iter().collect()
    }
}

impl<const N: usize> From<[Message; N]> for Transcript {
    fn from(messages: [Message; N]) -> Self {
        messages.into_iter().collect()
    }
}

impl From<&[Message]> for Transcript {
    fn from(messages: &[Message]) -> Self {
        messages.iter().cloned().collect()
    }
}

impl fmt::Debug for Transcript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Transcript {
    fn eq(&self, other: &Self) -> bool {
        (Arc::ptr_eq(&self.log, &other.log) && self.len == other.len) || self.iter().eq(other.iter())
    }
}

impl PartialEq<[Message]> for Transcript {
    fn eq(&self, other: &[Message]) -> bool {
        self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<Message>> for Transcript {
    fn eq(&self, other: &Vec<Message>) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Serialize for Transcript {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Transcript {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(i: usize) -> Message {
        Message::User { content: i.to_string() }
    }

    #[test]
    fn places_are_contiguous_across_chunks() {
        let mut expected = (0, 0);
        for i in 0..10_000 {
            assert_eq!(place(i), expected, "message {i}");
            expected.1 += 1;
            if expected.1 == chunk_len(expected.0) {
                expected = (expected.0 + 1, 0);
            }
        }
    }

    #[test]
    fn snapshots_keep_their_length_and_forks_do_not_leak() {
        let mut a: Transcript = (0..100).map(user).collect();
        let snapshot = a.clone();
        a.push(user(100));
        let mut b = snapshot.clone();
        b.push(user(999));
        assert_eq!(snapshot.len(), 100);
        assert_eq!(a.len(), 101);
        assert_eq!(a[100], user(100));
        assert_eq!(b[100], user(999));
        assert!(a.extends(&snapshot));
        assert!(!b.extends(&snapshot), "b forked into a log of its own");
        assert_eq!(a.iter().next_back(), Some(&user(100)));
        assert_eq!(a.iter().len(), 101);
        assert_eq!(b.to_vec()[..100], snapshot.to_vec()[..]);
    }

    #[test]
    fn a_short_conversation_allocates_only_its_first_chunks() {
        // 10,000 runs in flight hold 10,000 logs: a question and its answer stay one small
        // allocation and a chunk of two; a short run with tool calls, two chunks (eight
        // messages, as one chunk of eight did) and no table.
        assert!(std::mem::size_of::<Log>() <= 72, "{}", std::mem::size_of::<Log>());
        let mut t: Transcript = (0..FIRST_CHUNK).map(user).collect();
        assert!(t.log.first.get().is_some_and(|c| c.len() == 2) && t.log.second.get().is_none());
        t.extend((FIRST_CHUNK..SHORT).map(user));
        assert!(t.log.second.get().is_some_and(|c| c.len() == 6) && t.log.rest.get().is_none());
        t.push(user(SHORT));
        assert!(t.log.rest.get().is_some());
        assert_eq!(t[SHORT], user(SHORT));
        assert_eq!(t.to_vec(), (0..=SHORT).map(user).collect::<Vec<_>>());
        // The table's chunks continue the doubling: 16, 32, ...
        assert_eq!((2..5).map(chunk_len).collect::<Vec<_>>(), [16, 32, 64]);
    }

    #[test]
    fn round_trips_as_a_json_array() {
        let t: Transcript = (0..40).map(user).collect();
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, serde_json::to_string(&t.to_vec()).unwrap());
        let back: Transcript = serde_json::from_str(&text).unwrap();
        assert_eq!(back, t);
        assert!(t.get(40).is_none());
        assert_eq!(t.last(), Some(&user(39)));
    }
}
