//! Outcomes on their way to the store. A call's outcome is sent to the store as the call ends,
//! and the run goes on (builds the next request, asks the model) while it commits; the run's
//! next write waits for it first.
//!
//! Why: a run used to wait for that commit before it asked the model, so each turn of a run
//! paid two commits in a row (the response with the calls' intents, then their outcomes), and
//! every run in flight was parked and woken twice a turn. Now a turn pays one, and the
//! outcome's commit runs under the model's latency.
//!
//! How a write goes on once sent depends on the store. One whose outcome writes go on without
//! being polled again ([`RunStore::finishes_without_polling`](crate::RunStore::finishes_without_polling):
//! SQLite's writer thread holds the job and keeps its answer) is *parked*: nobody is woken when
//! it commits, and the next writer reads its answer (and, if the store refused it with an
//! outage, tries it again while the lease is proven held). Any other is driven by a task of its
//! own, retries included.
//!
//! What it does not change: the write is sent when the call ends, as before, so a crash loses
//! an outcome in the same moments it did (the call re-runs with its key, or is
//! `Indeterminate` for an `at_most_once` tool). The model may have seen that outcome; its
//! response is journaled only after the outcome committed, so the journal never holds an
//! answer to an outcome it lost. A failed outcome write fails every later write of the turn
//! (each would build on it; none tries it again as an outage of its own), and the turn's error
//! is that failure. Only marking the run failed and giving the lease up go on without it.

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
};

use futures::FutureExt;
use tokio::sync::Notify;

use super::Fence;
use crate::store::StoreError;

/// A write sent, as its future.
type Write = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// The writes a turn sent and has not had answered, and the first that failed.
#[derive(Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
    /// Notified when the last write in flight is answered.
    ended: Notify,
}

/// What the turn's writes in flight are, under one lock.
#[derive(Default)]
struct State {
    /// Writes sent and not answered: parked ones and those driven by a task of their own.
    writes: usize,
    /// Writes polled once that go on without being polled: whoever settles next reads them.
    parked: VecDeque<Write>,
    /// The first write that failed. It stays: every later write of the turn would build on the
    /// outcome it lost, so each of them fails with it. Boxed: a turn holds this for its whole
    /// life, and a store error is rare and large.
    failed: Option<Box<StoreError>>,
}

impl InFlight {
    /// The state; each critical section is a counter, a queue's end and an option, so a
    /// poisoned lock is still consistent.
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a write's answer, and keeps it if it is the first failure; the last answer
    /// wakes the writers waiting.
    fn ended(&self, answer: Result<(), StoreError>) {
        let mut st = self.state();
        st.writes -= 1;
        if let Err(e) = answer {
            st.failed.get_or_insert_with(|| Box::new(e));
        }
        let last = st.writes == 0;
        drop(st);
        if last {
            self.ended.notify_waiters();
        }
    }

    /// Waits until every write sent is answered, reading the parked ones' answers; then the
    /// first that failed, if any, is the error (of this caller and of every later one).
    pub(crate) async fn settled(&self) -> Result<(), StoreError> {
        self.drained().await;
        self.state().failed.as_deref().map_or(Ok(()), |e| Err(e.clone()))
    }

    /// Waits until every write sent is answered, reading the parked ones' answers, whether
    /// they failed or not: for what the turn does whatever became of its outcomes (giving the
    /// lease up, marking the run failed).
    pub(crate) async fn drained(&self) {
        loop {
            let parked = {
                let mut st = self.state();
                if st.writes == 0 {
                    return;
                }
                std::mem::take(&mut st.parked)
            };
            if parked.is_empty() {
                // Driven by their tasks, or read by another writer: wait for their answers. The
                // wait is made before the second look, so an answer between the two wakes it.
                let ended = self.ended.notified();
                if self.state().writes > 0 {
                    ended.await;
                }
                continue;
            }
            let mut reading = Reading { in_flight: self, parked };
            while let Some(write) = reading.parked.front_mut() {
                let answer = write.as_mut().await;
                reading.parked.pop_front();
                self.ended(answer);
            }
        }
    }

    /// Whether a write of the turn failed: its later writes fail with that error, and an
    /// outage they meet is that failure, not one of their own to try again.
    pub(crate) fn failed(&self) -> bool {
        self.state().failed.is_some()
    }

    /// Whether nothing is in flight and nothing failed.
    pub(crate) fn is_idle(&self) -> bool {
        let st = self.state();
        st.writes == 0 && st.failed.is_none()
    }

    /// Drops the parked writes unread: for a turn dropped before its end (its task aborted),
    /// whose parked writes, each holding the fence, would otherwise keep it and themselves
    /// alive. Their jobs are queued already; only their answers are lost.
    pub(crate) fn abandon(&self) {
        let parked = {
            let mut st = self.state();
            st.writes -= st.parked.len();
            std::mem::take(&mut st.parked)
        };
        drop(parked);
        self.ended.notify_waiters();
    }
}

/// Parked writes a writer took to read: put back if it is dropped before it read them all,
/// so that no write is forgotten while the run still counts it.
struct Reading<'a> {
    in_flight: &'a InFlight,
    parked: VecDeque<Write>,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if !self.parked.is_empty() {
            {
                let mut st = self.in_flight.state();
                let mut back = std::mem::take(&mut self.parked);
                back.append(&mut st.parked);
                st.parked = back;
            }
            // A writer that found nothing parked waits for the last answer, which nobody would
            // now read: it looks again, and reads them itself.
            self.in_flight.ended.notify_waiters();
        }
    }
}

/// Sends `write` under `fence`'s turn and returns without waiting for its commit where it can.
/// The write is polled once here: a store that answers at once (`MemoryStore`) answers here, an
/// error included; one that queues its write (SQLite's writer thread; a PostgreSQL connection,
/// when the pool has one free) has it queued before the caller goes on. `unpolled` says the
/// store's writes then go on without being polled again: the write is parked for the next
/// writer to read. Otherwise it runs on as a task of its own (its answer, or its retries
/// through an outage), counted in the fence's [`InFlight`] until it ends. Outside a Tokio
/// runtime the write is awaited here.
///
/// Not an `async fn`: the write is boxed before the returned future exists, which then keeps a
/// pointer to it, where an `async fn` would keep the write itself (over half a kilobyte) in its
/// own state, and so in every future that awaits a call's outcome.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(crate) fn send<F>(
    fence: &Arc<Fence>,
    unpolled: bool,
    write: F,
) -> impl Future<Output = Result<(), StoreError>> + Send + '_
where
    F: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let mut write: Write = Box::pin(write);
    async move {
        if let Some(answer) = (&mut write).now_or_never() {
            return answer;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return write.await;
        };
        let mut st = fence.in_flight().state();
        st.writes += 1;
        if unpolled {
            st.parked.push_back(write);
            return Ok(());
        }
        drop(st);
        let sent = Sent { fence: Arc::clone(fence), answered: false };
        runtime.spawn(async move {
            let mut sent = sent;
            let answer = write.await;
            sent.answered = true;
            sent.fence.in_flight().ended(answer);
        });
        Ok(())
    }
}

/// A driven write's place in its [`InFlight`]: given back when it is answered, or when its
/// task is dropped unanswered (a runtime shutting down), so that no writer waits forever.
struct Sent {
    fence: Arc<Fence>,
    answered: bool,
}

impl Drop for Sent {
    fn drop(&mut self) {
        if !self.answered {
            let lost = StoreError::Unavailable("an outcome's write was dropped before its answer".into());
            self.fence.in_flight().ended(Err(lost));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::store::Lease;

    fn fence() -> Arc<Fence> {
        let lease = Lease { run_id: "r".into(), owner: "me".into(), token: 1, expires_at_ms: i64::MAX };
        Fence::new(&lease, CancellationToken::new())
    }

    /// Sends, under `fence`, a write that is in flight until the test answers it.
    async fn sent(fence: &Arc<Fence>, unpolled: bool) -> tokio::sync::oneshot::Sender<Result<(), StoreError>> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        send(fence, unpolled, async move { answered.await.unwrap() }).await.unwrap();
        answer
    }

    /// A store that answers at once answers the sender: nothing is left in flight.
    #[tokio::test]
    async fn a_write_answered_at_once_is_not_in_flight() {
        let fence = fence();
        send(&fence, false, async { Ok(()) }).await.unwrap();
        let refused = send(&fence, false, async { Err(StoreError::LimitExceeded("too big".into())) }).await;
        assert!(matches!(refused, Err(StoreError::LimitExceeded(_))));
        assert!(fence.in_flight().is_idle());
    }

    /// A queued write is in flight until answered, driven or parked; the next writer waits for
    /// it and gets its failure, as every later writer does.
    #[tokio::test(start_paused = true)]
    async fn the_next_writer_waits_for_a_write_in_flight_and_gets_its_failure() {
        for unpolled in [false, true] {
            let fence = fence();
            let answer = sent(&fence, unpolled).await;
            let mut settled = Box::pin(fence.in_flight().settled());
            assert!(settled.as_mut().now_or_never().is_none(), "the write is in flight");
            answer.send(Err(StoreError::Unavailable("disk".into()))).unwrap();
            let got = tokio::time::timeout(Duration::from_secs(1), settled).await.expect("woken when answered");
            assert!(matches!(got, Err(StoreError::Unavailable(_))), "unpolled: {unpolled}");
            let again = fence.in_flight().settled().await;
            assert!(matches!(again, Err(StoreError::Unavailable(_))), "every later writer's: {again:?}");
            assert!(fence.in_flight().failed() && !fence.in_flight().is_idle());
        }
    }

    /// Two writers waiting at once are both woken, whichever reads the parked write.
    #[tokio::test(start_paused = true)]
    async fn every_waiting_writer_is_woken() {
        for unpolled in [false, true] {
            let fence = fence();
            let answer = sent(&fence, unpolled).await;
            let (a, b) = (fence.in_flight().settled(), fence.in_flight().settled());
            let both = async { tokio::join!(a, b) };
            let answering = async {
                tokio::task::yield_now().await;
                answer.send(Ok(())).unwrap();
            };
            let ((a, b), ()) = tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(both, answering) })
                .await
                .expect("both woken");
            assert!(a.is_ok() && b.is_ok(), "unpolled: {unpolled}");
        }
    }

    /// A writer dropped while it reads parked writes (its turn was dropped) puts back those it
    /// did not read: the next writer still waits for them.
    #[tokio::test(start_paused = true)]
    async fn parked_writes_a_dropped_writer_took_are_put_back() {
        let fence = fence();
        let first = sent(&fence, true).await;
        let second = sent(&fence, true).await;
        assert!(fence.in_flight().settled().now_or_never().is_none(), "dropped while reading the first");
        first.send(Ok(())).unwrap();
        let mut settled = Box::pin(fence.in_flight().settled());
        assert!(settled.as_mut().now_or_never().is_none(), "the second is still waited for");
        second.send(Err(StoreError::Unavailable("disk".into()))).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(1), settled).await.expect("woken when answered");
        assert!(matches!(got, Err(StoreError::Unavailable(_))));
    }

    /// A writer waiting for parked writes another writer took wakes when that one is dropped,
    /// and reads them itself: nobody else would.
    #[tokio::test(start_paused = true)]
    async fn a_writer_waiting_on_a_dropped_reader_reads_the_parked_writes_itself() {
        let fence = fence();
        let answer = sent(&fence, true).await;
        let mut reader = Box::pin(fence.in_flight().settled());
        assert!(reader.as_mut().now_or_never().is_none(), "the reader took the parked write");
        let waiter = fence.in_flight().settled();
        let dropping = async {
            tokio::task::yield_now().await;
            drop(reader);
            answer.send(Ok(())).unwrap();
        };
        let (got, ()) = tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(waiter, dropping) })
            .await
            .expect("the waiter reads the write put back");
        assert!(got.is_ok());
        assert!(fence.in_flight().is_idle());
    }

    /// A turn dropped before its end lets its parked writes go (each holds the fence), and a
    /// later look finds nothing in flight.
    #[tokio::test]
    async fn abandoned_parked_writes_are_let_go() {
        let fence = fence();
        let held = Arc::clone(&fence);
        send(&fence, true, async move {
            let _fence = held;
            std::future::pending().await
        })
        .await
        .unwrap();
        assert_eq!(Arc::strong_count(&fence), 2, "the parked write holds the fence, as an outcome's does");
        fence.in_flight().abandon();
        assert_eq!(Arc::strong_count(&fence), 1, "let go");
        assert!(fence.in_flight().is_idle());
        assert!(fence.in_flight().settled().now_or_never().is_some());
    }

    /// A write whose task is dropped unanswered (its runtime shut down) fails the next writer
    /// instead of leaving it waiting.
    #[test]
    fn a_write_dropped_unanswered_fails_the_next_writer() {
        let fence = fence();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(send(&fence, false, std::future::pending())).unwrap();
        drop(runtime);
        let settled = fence.in_flight().settled().now_or_never();
        assert!(matches!(settled, Some(Err(StoreError::Unavailable(_)))), "{settled:?}");
    }
}
