//! Generator glue for streaming tools.
//!
//! `async-stream` blocks can neither return a value nor use `?`, but a generator tool's body
//! does both: its [`progress!`](crate::progress) points are progress and its return value is
//! the call's result. So `#[tool]` rewrites `progress!(e)` to
//! `progress!(__kuralle_emit, e).await` (an [`Emitter::emit`]) and runs the body as an
//! ordinary `async` block whose output is the fn's declared return type. [`Generator`] polls
//! that future and, whenever it suspends right after an [`Emitter::emit`], hands out the
//! emitted value as a [`Yielded::Progress`]; the future's output becomes the final
//! [`Yielded::Return`].
//!
//! The same machinery turns any tool into a [`ToolStream`](crate::ToolStream): see
//! [`tool_stream`].

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};

use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::Value;

use crate::{
    error::ToolError,
    tool::{ToolEvent, ToolStream, Yielded},
};

/// The sending half of a generator: `progress!(e)` becomes `emitter.emit(e).await`.
#[derive(Debug)]
pub struct Emitter<P> {
    slot: Arc<Mutex<Option<P>>>,
}

/// The receiving half of a generator, polled by [`Generator`].
#[derive(Debug)]
pub struct Slot<P> {
    slot: Arc<Mutex<Option<P>>>,
}

/// A connected [`Emitter`] / [`Slot`] pair. The progress type is inferred from the `emit` calls.
pub fn emitter<P>() -> (Emitter<P>, Slot<P>) {
    let slot = Arc::new(Mutex::new(None));
    (Emitter { slot: Arc::clone(&slot) }, Slot { slot })
}

impl<P> Slot<P> {
    fn take(&self) -> Option<P> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl<P> Emitter<P> {
    /// Stores `value` and suspends the body once, so the driving [`Generator`] can hand the
    /// value out before the body runs on.
    pub fn emit(&self, value: P) -> Emit {
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
        Emit { suspended: false }
    }
}

/// The future returned by [`Emitter::emit`]: pending once, then ready.
#[derive(Debug)]
#[must_use = "a progress value is only handed out when the `emit` future is awaited"]
pub struct Emit {
    suspended: bool,
}

impl Future for Emit {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.suspended {
            Poll::Ready(())
        } else {
            // No waker is registered: the generator sees the emitted value right after this
            // `Pending` and returns it as a ready item, so its consumer polls again anyway.
            self.suspended = true;
            Poll::Pending
        }
    }
}

/// Pins `body` to output `R`, so that `return` and `?` inside an `async` block see the fn's
/// declared return type instead of an inference variable.
pub fn returning<R, F: Future<Output = R>>(body: F) -> F {
    body
}

pin_project_lite::pin_project! {
    /// A stream of [`Yielded::Progress`] values emitted by `body`, then one [`Yielded::Return`]
    /// holding its output.
    #[derive(Debug)]
    #[must_use = "streams do nothing unless polled"]
    pub struct Generator<P, F> {
        slot: Slot<P>,
        #[pin]
        body: F,
        done: bool,
    }
}

impl<P, F: Future> Generator<P, F> {
    /// A generator driving `body`, whose emitted values arrive in `slot`.
    pub fn new(slot: Slot<P>, body: F) -> Self {
        Self { slot, body, done: false }
    }
}

impl<P, F: Future> Stream for Generator<P, F> {
    type Item = Yielded<P, F::Output>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        match this.body.poll(cx) {
            Poll::Ready(out) => {
                *this.done = true;
                Poll::Ready(Some(Yielded::Return(out)))
            }
            Poll::Pending => match this.slot.take() {
                Some(progress) => Poll::Ready(Some(Yielded::Progress(progress))),
                None => Poll::Pending,
            },
        }
    }
}

/// A [`ToolStream`]: [`ToolEvent::Progress`] for each value emitted into `slot` while `body`
/// runs, then `body`'s outcome.
pub fn tool_stream<F>(slot: Slot<Value>, body: F) -> ToolStream
where
    F: Future<Output = ToolEvent> + Send + 'static,
{
    // Every tool calls this with its own future type: boxing it here means the generator, the
    // mapping and their drop glue are compiled once, not once per tool (one more allocation
    // per call, next to the stream's own).
    events(slot, Box::pin(body))
}

fn events(slot: Slot<Value>, body: Pin<Box<dyn Future<Output = ToolEvent> + Send>>) -> ToolStream {
    Generator::new(slot, body)
        .map(|item| match item {
            Yielded::Progress(value) => ToolEvent::Progress(value),
            Yielded::Return(event) => event,
        })
        .boxed()
}

/// The [`ToolStream`] of a tool without progress: `body`'s outcome alone. (The body is boxed
/// by the caller so this is compiled once, not once per tool. Generic over the body, the
/// stream would need one allocation instead of two, about 100 of a trivial call's 2,900
/// instructions, but 100 tools took 0.6 s longer to build: 8.0x plain fns instead of 6.7x.)
pub fn outcome_stream(body: Pin<Box<dyn Future<Output = ToolEvent> + Send>>) -> ToolStream {
    futures::stream::once(body).boxed()
}

/// Drives a tool's progress stream to its end, forwarding progress (as JSON) to `sink`.
///
/// # Errors
/// [`ToolError::InvalidOutput`] when a progress value cannot be serialized or the stream ends
/// without a [`Yielded::Return`].
pub async fn forward<S, P, R>(tool: &str, stream: S, sink: &Emitter<Value>) -> Result<R, ToolError>
where
    S: Stream<Item = Yielded<P, R>>,
    P: Serialize,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Yielded::Progress(p) => {
                let value = serde_json::to_value(&p).map_err(|e| ToolError::InvalidOutput {
                    tool: tool.to_owned(),
                    message: format!("a progress value could not be serialized: {e}"),
                })?;
                sink.emit(value).await;
            }
            Yielded::Return(r) => return Ok(r),
        }
    }
    Err(ToolError::InvalidOutput {
        tool: tool.to_owned(),
        message: "the stream ended without a return value (`Yielded::Return`)".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn generator_hands_out_progress_then_the_return_value() {
        let (emit, slot) = emitter();
        let body = returning::<Result<u32, String>, _>(async move {
            emit.emit(1).await;
            tokio::task::yield_now().await;
            emit.emit(2).await;
            let n: u32 = "3".parse().map_err(|_| "bad".to_owned())?;
            Ok(n)
        });
        let items: Vec<_> = Generator::new(slot, body).collect().await;
        assert_eq!(items, vec![Yielded::Progress(1), Yielded::Progress(2), Yielded::Return(Ok(3))]);
    }
}
