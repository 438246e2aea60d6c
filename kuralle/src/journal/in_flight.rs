//! Outcomes on their way to the store. A call's outcome is sent to the store as the call ends,
//! and the run goes on (builds the next request, asks the model) while it commits; the run's
//! next write waits for it first.
//!
//! Why: a run used to wait for that commit before it asked the model, so each turn of a run
//! paid two commits (the response with the calls' intents, then their outcomes) and every run
//! in flight parked and woke twice a turn. Now a turn pays one, and the outcome's commit runs
//! under the model's latency.
//!
//! What it does not change: the write is sent when the call ends, as before, so a crash loses
//! an outcome in the same moments it did (the call re-runs with its key, or is
//! `Indeterminate` for an `at_most_once` tool). The model may have seen that outcome; its
//! response is journaled only after the outcome committed, so the journal never holds an
//! answer to an outcome it lost. A failed outcome write fails the run's next write (which
//! would build on it), and the turn's error is that failure.

use std::{
    sync::{Mutex, PoisonError},
    task::{Context, Poll},
};

use tokio::sync::Notify;

use super::Fence;
use crate::store::StoreError;

/// The writes a turn sent and has not had answered.
#[derive(Default)]
pub(crate) struct InFlight {
    state: Mutex<State>,
    /// Notified when the last write in flight is answered.
    ended: Notify,
}

#[derive(Default)]
struct State {
    writes: usize,
    /// The first write that failed: the next writer's answer. Boxed: a turn holds this for its
    /// whole life, and a store error is rare and large.
    failed: Option<Box<StoreError>>,
}

impl InFlight {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Each critical section is a counter and an option: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ended(&self, result: Result<(), StoreError>) {
        let mut st = self.state();
        st.writes -= 1;
        if let Err(e) = result {
            st.failed.get_or_insert_with(|| Box::new(e));
        }
        let last = st.writes == 0;
        drop(st);
        if last {
            self.ended.notify_waiters();
        }
    }

    /// Waits until every write sent is answered; the first that failed, if any, is this
    /// caller's error (and no later caller's: the caller fails the turn with it).
    pub(crate) async fn settled(&self) -> Result<(), StoreError> {
        loop {
            // Made before the check: a write answered between the two still wakes this.
            let ended = self.ended.notified();
            {
                let mut st = self.state();
                if st.writes == 0 {
                    return st.failed.take().map_or(Ok(()), |e| Err(*e));
                }
            }
            ended.await;
        }
    }

    /// Whether nothing is in flight (no write pending, none failed unreported).
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        let st = self.state();
        st.writes == 0 && st.failed.is_none()
    }
}

/// Sends `write` under `fence`'s turn and returns without waiting for its commit where it can.
/// The write is polled once here: a store that answers at once (`MemoryStore`) answers here, an
/// error included; one that queues its write (SQLite's writer thread, a PostgreSQL connection)
/// has it queued before the caller goes on. The rest of the write (its answer, or its retries
/// through an outage) then runs as a task of its own, counted in the fence's [`InFlight`] until
/// it ends. Outside a Tokio runtime the write is awaited here.
pub(crate) async fn send<F>(fence: &std::sync::Arc<Fence>, write: F) -> Result<(), StoreError>
where
    F: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let mut write = Box::pin(write);
    if let Poll::Ready(answer) = write.as_mut().poll(&mut Context::from_waker(futures::task::noop_waker_ref())) {
        return answer;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return write.await;
    };
    fence.in_flight().state().writes += 1;
    let sent = Sent { fence: std::sync::Arc::clone(fence), answered: false };
    runtime.spawn(async move {
        let mut sent = sent;
        let answer = write.await;
        sent.answered = true;
        sent.fence.in_flight().ended(answer);
    });
    Ok(())
}

/// A write in flight's place in its [`InFlight`]: given back when it is answered, or when its
/// task is dropped unanswered (a runtime shutting down), so that no writer waits forever.
struct Sent {
    fence: std::sync::Arc<Fence>,
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

/// Polls `future` once, as [`send`] does, for tests.
#[cfg(test)]
fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    std::pin::pin!(future).poll(&mut Context::from_waker(futures::task::noop_waker_ref()))
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

    /// A store that answers at once answers the sender: nothing is left in flight.
    #[tokio::test]
    async fn a_write_answered_at_once_is_not_in_flight() {
        let fence = fence();
        send(&fence, async { Ok(()) }).await.unwrap();
        let refused = send(&fence, async { Err(StoreError::LimitExceeded("too big".into())) }).await;
        assert!(matches!(refused, Err(StoreError::LimitExceeded(_))));
        assert!(fence.in_flight().is_idle());
    }

    /// A queued write is in flight until answered; the next writer waits for it and gets its
    /// failure, once.
    #[tokio::test(start_paused = true)]
    async fn the_next_writer_waits_for_a_write_in_flight_and_gets_its_failure() {
        let fence = fence();
        let (answer, answered) = tokio::sync::oneshot::channel::<Result<(), StoreError>>();
        send(&fence, async move { answered.await.unwrap() }).await.unwrap();
        let mut settled = Box::pin(fence.in_flight().settled());
        assert!(poll_once(settled.as_mut()).is_pending(), "the write is in flight");
        answer.send(Err(StoreError::Unavailable("disk".into()))).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(1), settled).await.expect("woken when answered");
        assert!(matches!(got, Err(StoreError::Unavailable(_))));
        assert!(fence.in_flight().settled().await.is_ok(), "the failure is one writer's");
    }

    /// Two writers waiting at once are both woken.
    #[tokio::test(start_paused = true)]
    async fn every_waiting_writer_is_woken() {
        let fence = fence();
        let (answer, answered) = tokio::sync::oneshot::channel::<Result<(), StoreError>>();
        send(&fence, async move { answered.await.unwrap() }).await.unwrap();
        let (a, b) = (fence.in_flight().settled(), fence.in_flight().settled());
        let both = async { tokio::join!(a, b) };
        let answering = async {
            tokio::task::yield_now().await;
            answer.send(Ok(())).unwrap();
        };
        let ((a, b), ()) = tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(both, answering) })
            .await
            .expect("both woken");
        assert!(a.is_ok() && b.is_ok());
    }

    /// A write whose task is dropped unanswered (its runtime shut down) fails the next writer
    /// instead of leaving it waiting.
    #[test]
    fn a_write_dropped_unanswered_fails_the_next_writer() {
        let fence = fence();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(send(&fence, std::future::pending())).unwrap();
        drop(runtime);
        let settled = poll_once(fence.in_flight().settled());
        assert!(matches!(settled, Poll::Ready(Err(StoreError::Unavailable(_)))), "{settled:?}");
    }
}
