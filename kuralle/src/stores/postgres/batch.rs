//! Writes of many runs as one statement: the queue that gathers them and the task that sends
//! them.
//!
//! A statement's fixed costs on the server (the round trip, executor start-up, the commit) are
//! most of what a one-row write costs: `pgbench` on the step outcome's statement measured about
//! 4.5 times the rows a second sent 16 at a time as one statement as sent one by one (see
//! `docs/performance.md`). So a write that can be batched is queued; if fewer than the queue's
//! slots of batches of its kind are in flight, the writer spawns a task that takes the queue and
//! sends it as one statement, and goes on taking until the queue is empty. Under load every
//! slot is busy and writes gather while they wait: the busier the store, the larger the batches.
//! A write that finds itself alone goes in the one-write statement, which costs the server less.
//!
//! Each write keeps its own outcome (its run's fence, its own errors). No two writes of a batch
//! share a [`Batched::key`], so no statement writes a row twice.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::FutureExt as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::PostgresStore;
use super::errors::{self, Fail, retrying};
use super::steps::KEY_CONSTRAINT;
use crate::store::StoreError;

/// The most writes one statement carries.
const MAX_BATCH: usize = 256;

/// The most bytes of values one statement carries (a write larger than this goes alone): a
/// PostgreSQL message is at most 1 GiB, and one write's values may be tens of MiB.
const MAX_BATCH_BYTES: usize = 32 << 20;

/// How many writes of a batch the server refused go at once when they are sent one by one.
const SENT_APART: usize = 4;

/// A write that may share a statement with other runs' writes of its kind.
pub(super) trait Batched: Sized + Send + Sync + 'static {
    /// What the write returns to its writer.
    type Output: Send + 'static;

    /// What no two writes of one batch share: the row the write must be alone to change (a
    /// run, whose ordinals an append reserves; a run's step, which an outcome finishes).
    fn key(&self) -> (&str, Option<u64>);

    /// About how many bytes of parameters the write sends.
    fn bytes(&self) -> usize;

    /// The store's queue of this kind of write.
    fn queue(store: &PostgresStore) -> &Queue<Self>;

    /// Sends `batch` as one statement (retrying as a single write would): one outcome per
    /// write, in order, or why there is none.
    fn send(
        store: &PostgresStore,
        batch: &[Self],
    ) -> impl Future<Output = Result<Vec<Result<Self::Output, StoreError>>, Unsent>> + Send;

    /// Sends `write` in a statement of its own.
    fn send_alone(store: &PostgresStore, write: &Self)
    -> impl Future<Output = Result<Self::Output, StoreError>> + Send;
}

/// Why a batch has no outcome for each write.
pub(super) enum Unsent {
    /// The server refused the statement for a value in it, so nothing of it was written:
    /// perhaps one write's (a NUL in a key, a key too long to index), which must not fail the
    /// others.
    Refused(StoreError),
    /// A write holds a key its run already journaled, or one key twice: nothing was written.
    Clash,
    /// What a single write would be told (unavailable, in doubt, out of space, an answer that
    /// cannot be read): every write of the batch is.
    Failed(StoreError),
}

impl From<StoreError> for Unsent {
    fn from(error: StoreError) -> Self {
        Self::Failed(error)
    }
}

/// Why the server refused a statement, if it refused it for what it holds (it did not run):
/// the journal's unique key, or a value (SQLSTATE classes 22, data exception; 23, integrity
/// constraint; 54, program limit).
fn refusal(error: tokio_postgres::Error) -> Result<Unsent, tokio_postgres::Error> {
    let Some(db) = error.as_db_error() else { return Err(error) };
    if db.constraint() == Some(KEY_CONSTRAINT) {
        return Ok(Unsent::Clash);
    }
    match &db.code().code()[..2] {
        "22" | "23" | "54" => Ok(Unsent::Refused(errors::map(error))),
        _ => Err(error),
    }
}

type Reply<W> = oneshot::Sender<Result<<W as Batched>::Output, StoreError>>;

/// Writes of one kind waiting to be sent, and the slots for batches in flight.
pub(super) struct Queue<W: Batched> {
    pending: Mutex<VecDeque<(W, Reply<W>)>>,
    slots: Arc<Semaphore>,
}

impl<W: Batched> Queue<W> {
    /// A queue that sends at most `slots` batches at once (at least one).
    pub fn new(slots: usize) -> Self {
        Self { pending: Mutex::new(VecDeque::new()), slots: Arc::new(Semaphore::new(slots.max(1))) }
    }

    fn pending(&self) -> MutexGuard<'_, VecDeque<(W, Reply<W>)>> {
        // A panic while the lock was held left the queue whole (push and take do not panic
        // midway); keep going rather than fail every later write.
        self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// The next batch: up to [`MAX_BATCH`] writes and [`MAX_BATCH_BYTES`] (at least one write)
    /// in queue order, no two with one key (a later write of a key stays in line, ahead of the
    /// writes queued after it, for a later batch; with more than one slot that batch may
    /// commit first: writes of one key are ordered only as their writer awaits them).
    fn take(&self) -> Vec<(W, Reply<W>)> {
        let mut pending = self.pending();
        let mut batch = Vec::with_capacity(pending.len().min(MAX_BATCH));
        let mut keys = HashSet::new();
        let mut later = VecDeque::new();
        let mut bytes = 0;
        while batch.len() < MAX_BATCH {
            let Some(entry) = pending.pop_front() else { break };
            let size = entry.0.bytes();
            if !batch.is_empty() && bytes + size > MAX_BATCH_BYTES {
                pending.push_front(entry);
                break;
            }
            let (run_id, row) = entry.0.key();
            if keys.insert((run_id.to_owned(), row)) {
                bytes += size;
                batch.push(entry);
            } else {
                later.push_back(entry);
            }
        }
        if !later.is_empty() {
            later.append(&mut pending);
            *pending = later;
        }
        batch
    }
}

impl PostgresStore {
    /// Queues `write` to be sent with other runs' writes of its kind and waits for its outcome.
    pub(super) async fn batched<W: Batched>(&self, write: W) -> Result<W::Output, StoreError> {
        let queue = W::queue(self);
        let (reply, outcome) = oneshot::channel();
        queue.pending().push_back((write, reply));
        if let Some(slot) = queue.slot() {
            // A task of its own: the batch holds other writers' writes, so it must not be
            // dropped with this writer's future.
            tokio::spawn(self.clone().drain::<W>(slot));
        }
        outcome.await.unwrap_or_else(|_| Err(in_doubt("ended without an outcome")))
    }

    /// Sends batches of `W` while any are queued, holding `slot`.
    async fn drain<W: Batched>(self, mut slot: OwnedSemaphorePermit) {
        let queue = W::queue(&self);
        loop {
            let batch = queue.take();
            if batch.is_empty() {
                drop(slot);
                // A write queued after `take` whose writer found every slot busy: if no slot
                // is free now, its holder will see the write after it lets go of its slot.
                if queue.pending().is_empty() {
                    return;
                }
                match queue.slot() {
                    Some(again) => slot = again,
                    None => return,
                }
                continue;
            }
            let (writes, replies): (Vec<W>, Vec<Reply<W>>) = batch.into_iter().unzip();
            // A panic sending one batch fails its writes, not the queue behind it.
            let outcomes = AssertUnwindSafe(self.send_batch(&writes)).catch_unwind().await;
            let outcomes = outcomes.unwrap_or_else(|_| writes.iter().map(|_| Err(in_doubt("panicked"))).collect());
            debug_assert_eq!(outcomes.len(), replies.len());
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A writer that stopped waiting has nothing to hear.
                let _ = reply.send(outcome);
            }
        }
    }

    /// One outcome per write of `writes`: a lone write in its own statement, several in one.
    async fn send_batch<W: Batched>(&self, writes: &[W]) -> Vec<Result<W::Output, StoreError>> {
        if let [write] = writes {
            return vec![W::send_alone(self, write).await];
        }
        match W::send(self, writes).await {
            Ok(outcomes) => outcomes,
            // Each alone then, so only the write at fault fails.
            Err(Unsent::Refused(error)) => {
                tracing::debug!(%error, writes = writes.len(), "PostgreSQL refused a batch; sending its writes one by one");
                self.send_each(writes).await
            }
            Err(Unsent::Clash) => self.send_each(writes).await,
            Err(Unsent::Failed(error)) => writes.iter().map(|_| Err(error.clone())).collect(),
        }
    }
}

impl PostgresStore {
    /// Each of `writes` in a statement of its own, [`SENT_APART`] at a time: a batch of 256
    /// one after another would keep its writers waiting for 256 round trips, and all at once
    /// would ask the pool for 256 connections.
    pub(super) async fn send_each<'w, W: Batched>(
        &self,
        writes: impl IntoIterator<Item = &'w W>,
    ) -> Vec<Result<W::Output, StoreError>> {
        let writes: Vec<&W> = writes.into_iter().collect();
        let mut outcomes = Vec::with_capacity(writes.len());
        for few in writes.chunks(SENT_APART) {
            outcomes.extend(futures::future::join_all(few.iter().map(|write| W::send_alone(self, write))).await);
        }
        outcomes
    }

    /// Runs a batch's statement `sql` (retrying as a single write would) and checks that it
    /// answered one row per write of `writes`.
    pub(super) async fn query_batch(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        writes: usize,
    ) -> Result<Vec<Row>, Unsent> {
        let rows = retrying(|| async {
            let client = self.client().await?;
            let stmt = client.prepare_cached(sql).await.map_err(Fail::write)?;
            match client.query(&stmt, params).await {
                Ok(rows) => Ok(Ok(rows)),
                Err(e) => refusal(e).map(Err).map_err(Fail::write),
            }
        })
        .await??;
        if rows.len() != writes {
            let message = format!("{writes} batched writes were sent and {} answered", rows.len());
            return Err(StoreError::Corrupt(message.into()).into());
        }
        Ok(rows)
    }
}

fn in_doubt(what: &str) -> StoreError {
    StoreError::Unavailable(
        format!("the PostgreSQL batch that carried this write {what}; the write is in doubt").into(),
    )
}
