//! `RunHandle`: a run's events as a `Stream`, its output as a future, and its interrupt.

use std::{
    future::IntoFuture,
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, future::BoxFuture};
use tokio::{sync::mpsc::UnboundedReceiver, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{Event, RunError, runtime::event::RunOutput};

/// A running turn: a `Stream<Item = Event>` and an
/// `IntoFuture<Output = Result<RunOutput, RunError>>`.
///
/// Read events with `next().await`, then `.await` the handle for the output. Awaiting without
/// reading events is fine (events not read by then are dropped, and later ones are not kept);
/// dropping the handle does not stop the run.
pub struct RunHandle {
    events: UnboundedReceiver<Event>,
    task: JoinHandle<Result<RunOutput, RunError>>,
    interrupt: CancellationToken,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle").field("interrupted", &self.interrupt.is_cancelled()).finish_non_exhaustive()
    }
}

impl RunHandle {
    pub(crate) fn new(
        events: UnboundedReceiver<Event>,
        task: JoinHandle<Result<RunOutput, RunError>>,
        interrupt: CancellationToken,
    ) -> Self {
        Self { events, task, interrupt }
    }

    /// Barge-in: cancels in-flight interruptible tool calls and the model stream, runs no
    /// further batch, and ends the turn with status `interrupted`. Calls declared
    /// `interruptible = false` run to completion and are journaled.
    pub fn interrupt(&self) {
        self.interrupt.cancel();
    }

    /// A cloneable handle that interrupts this run from elsewhere (another task, a signal
    /// handler).
    pub fn interrupt_handle(&self) -> InterruptHandle {
        InterruptHandle(self.interrupt.clone())
    }
}

/// Interrupts a run; see [`RunHandle::interrupt`].
#[derive(Debug, Clone)]
pub struct InterruptHandle(CancellationToken);

impl InterruptHandle {
    /// Interrupts the run.
    pub fn interrupt(&self) {
        self.0.cancel();
    }
}

impl Stream for RunHandle {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.events.poll_recv(cx)
    }
}

impl IntoFuture for RunHandle {
    type Output = Result<RunOutput, RunError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        // Nobody can read events once the handle is awaited: closing the channel keeps a long
        // run from buffering every event it emits until it ends.
        let Self { events, task, interrupt: _ } = self;
        drop(events);
        Box::pin(async move {
            match task.await {
                Ok(result) => result,
                Err(e) => Err(RunError::Internal(format!("the run task failed: {e}"))),
            }
        })
    }
}
