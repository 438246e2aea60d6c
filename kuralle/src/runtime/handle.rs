//! `RunHandle`: a run's events as a `Stream`, its output as a future, and its interrupt.

use std::{
    future::{Future, IntoFuture},
    pin::Pin,
    task::{Context, Poll},
};

use futures::{Stream, StreamExt, future::BoxFuture};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    error::RunError,
    event::{Event, EventReceiver, RunOutput},
};

/// A running turn: a `Stream<Item = Event>` and an
/// `IntoFuture<Output = Result<RunOutput, RunError>>`.
///
/// Read events with `next().await`, then `.await` the handle for the output. Awaiting without
/// reading events is fine (awaiting stops the event stream); dropping the handle does not stop
/// the run. The event stream ends when the run ends, even if a timed-out tool that blocks its
/// thread is still running (blocking work belongs in `tokio::task::spawn_blocking`). Events
/// are buffered up to [`RuntimeBuilder::event_buffer`](crate::RuntimeBuilder::event_buffer).
///
/// ```
/// # use kuralle::{Runtime, agent, tool, testing::{ScriptedModel, Turn}};
/// # /// Echo back the text.
/// # #[tool] async fn echo(text: String) -> String { text }
/// # /// Wait until the call is cancelled.
/// # #[tool] async fn wait(ctx: &kuralle::ToolContext) { ctx.cancellation().cancelled().await }
/// # /// Use the echo tool.
/// # #[agent(id = "support", tools = [Echo, Wait])] struct Support;
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use futures::StreamExt;
/// use kuralle::Event;
///
/// let model = ScriptedModel::new([
///     Turn::tool_calls([("call_1", "echo", r#"{"text":"hi"}"#)]),
///     Turn::text("Echoed: hi"),
/// ]);
/// let runtime = Runtime::builder().agent(Support).model(model).build()?;
/// let mut handle = runtime.run("Echo hi");
/// let mut names = Vec::new();
/// while let Some(event) = handle.next().await {
///     if let Event::ToolResult { name, .. } = event {
///         names.push(name);
///     }
/// }
/// assert_eq!(names, ["echo"]);
/// assert_eq!(handle.await?.text, "Echoed: hi");
/// # Ok::<(), kuralle::RunError>(())
/// # }).unwrap();
/// ```
pub struct RunHandle {
    events: flume::r#async::RecvStream<'static, Box<Event>>,
    task: JoinHandle<Result<RunOutput, RunError>>,
    interrupt: CancellationToken,
    /// The run's result, once its task ended (taken by `into_future`).
    output: Option<Result<RunOutput, RunError>>,
    /// The stream has returned `None` and stays ended.
    ended: bool,
}

impl std::fmt::Debug for RunHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHandle").field("interrupted", &self.interrupt.is_cancelled()).finish_non_exhaustive()
    }
}

impl RunHandle {
    pub(crate) fn new(
        events: EventReceiver,
        task: JoinHandle<Result<RunOutput, RunError>>,
        interrupt: CancellationToken,
    ) -> Self {
        Self { events: events.into_stream(), task, interrupt, output: None, ended: false }
    }

    /// Barge-in: cancels in-flight interruptible tool calls and the model stream, runs no
    /// further batch, and ends the turn with status `interrupted`. Calls declared
    /// `interruptible = false` run to completion and are journaled.
    ///
    /// ```
    /// # use kuralle::{Runtime, agent, tool, testing::{ScriptedModel, Turn}};
    /// # /// Echo back the text.
    /// # #[tool] async fn echo(text: String) -> String { text }
    /// # /// Wait until the call is cancelled.
    /// # #[tool] async fn wait(ctx: &kuralle::ToolContext) { ctx.cancellation().cancelled().await }
    /// # /// Use the echo tool.
    /// # #[agent(id = "support", tools = [Echo, Wait])] struct Support;
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use kuralle::RunStatus;
    ///
    /// // The tool waits until cancelled: only the interrupt ends this turn.
    /// let model = ScriptedModel::new([Turn::tool_calls([("call_1", "wait", "{}")]), Turn::text("done")]);
    /// let runtime = Runtime::builder().agent(Support).model(model).build()?;
    /// let handle = runtime.run("Echo hi");
    /// handle.interrupt();
    /// assert_eq!(handle.await?.status, RunStatus::Interrupted);
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    pub fn interrupt(&self) {
        self.interrupt.cancel();
    }

    /// A cloneable handle that interrupts this run from elsewhere (another task, a signal
    /// handler).
    ///
    /// ```
    /// # use kuralle::{Runtime, agent, tool, testing::{ScriptedModel, Turn}};
    /// # /// Echo back the text.
    /// # #[tool] async fn echo(text: String) -> String { text }
    /// # /// Wait until the call is cancelled.
    /// # #[tool] async fn wait(ctx: &kuralle::ToolContext) { ctx.cancellation().cancelled().await }
    /// # /// Use the echo tool.
    /// # #[agent(id = "support", tools = [Echo, Wait])] struct Support;
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use kuralle::RunStatus;
    ///
    /// let model = ScriptedModel::new([Turn::tool_calls([("call_1", "wait", "{}")]), Turn::text("done")]);
    /// let runtime = Runtime::builder().agent(Support).model(model).build()?;
    /// let handle = runtime.run("Echo hi");
    /// let interrupt = handle.interrupt_handle();
    /// tokio::spawn(async move { interrupt.interrupt() }); // e.g. from a Ctrl-C handler
    /// assert_eq!(handle.await?.status, RunStatus::Interrupted);
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    pub fn interrupt_handle(&self) -> InterruptHandle {
        InterruptHandle(self.interrupt.clone())
    }
}

/// Interrupts a run; see [`RunHandle::interrupt`].
///
/// ```
/// # use kuralle::{Runtime, agent, tool, testing::{ScriptedModel, Turn}};
/// # /// Echo back the text.
/// # #[tool] async fn echo(text: String) -> String { text }
/// # /// Wait until the call is cancelled.
/// # #[tool] async fn wait(ctx: &kuralle::ToolContext) { ctx.cancellation().cancelled().await }
/// # /// Use the echo tool.
/// # #[agent(id = "support", tools = [Echo, Wait])] struct Support;
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{InterruptHandle, RunStatus};
///
/// let model = ScriptedModel::new([Turn::tool_calls([("call_1", "wait", "{}")]), Turn::text("done")]);
/// let runtime = Runtime::builder().agent(Support).model(model).build()?;
/// let handle = runtime.run("Echo hi");
/// let interrupt: InterruptHandle = handle.interrupt_handle();
/// interrupt.clone().interrupt(); // clones interrupt the same run
/// assert_eq!(handle.await?.status, RunStatus::Interrupted);
/// # Ok::<(), kuralle::RunError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct InterruptHandle(CancellationToken);

impl InterruptHandle {
    /// Interrupts the run.
    ///
    /// ```
    /// # use kuralle::{Runtime, agent, tool, testing::{ScriptedModel, Turn}};
    /// # /// Echo back the text.
    /// # #[tool] async fn echo(text: String) -> String { text }
    /// # /// Wait until the call is cancelled.
    /// # #[tool] async fn wait(ctx: &kuralle::ToolContext) { ctx.cancellation().cancelled().await }
    /// # /// Use the echo tool.
    /// # #[agent(id = "support", tools = [Echo, Wait])] struct Support;
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let model = ScriptedModel::new([Turn::tool_calls([("call_1", "wait", "{}")]), Turn::text("done")]);
    /// let runtime = Runtime::builder().agent(Support).model(model).build()?;
    /// let handle = runtime.run("Echo hi");
    /// handle.interrupt_handle().interrupt();
    /// assert_eq!(handle.await?.status, kuralle::RunStatus::Interrupted);
    /// # Ok::<(), kuralle::RunError>(())
    /// # }).unwrap();
    /// ```
    pub fn interrupt(&self) {
        self.0.cancel();
    }
}

fn joined(result: Result<Result<RunOutput, RunError>, tokio::task::JoinError>) -> Result<RunOutput, RunError> {
    result.unwrap_or_else(|e| Err(RunError::Internal(format!("the run task failed: {e}"))))
}

impl Stream for RunHandle {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            if let Poll::Ready(event) = this.events.poll_next_unpin(cx) {
                this.ended = event.is_none();
                return Poll::Ready(event.map(|e| *e));
            }
            // Nothing buffered. The stream ends with the run, not with the last sender: a
            // timed-out call stuck in a blocking section may still hold one.
            if this.output.is_some() {
                this.ended = true;
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.task).poll(cx) {
                // Look at the buffer once more: events sent before the end are still delivered.
                Poll::Ready(result) => this.output = Some(joined(result)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl IntoFuture for RunHandle {
    type Output = Result<RunOutput, RunError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        let Self { events, task, output, .. } = self;
        // Nobody reads events any more: close the channel so the run never waits on it.
        drop(events);
        // Two futures, not one `async` block holding both: a run awaited this way is boxed for
        // its whole life, and the block kept room for an output (168 bytes) beside the task's
        // handle while it waited. Waiting boxes only the handle.
        match output {
            Some(result) => Box::pin(std::future::ready(result)),
            None => Box::pin(futures::FutureExt::map(task, joined)),
        }
    }
}
