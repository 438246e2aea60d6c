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
/// reading events is fine (they are buffered); dropping the handle does not stop the run.
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
        Box::pin(async move {
            match self.task.await {
                Ok(result) => result,
                Err(e) => Err(RunError::Internal(format!("the run task failed: {e}"))),
            }
        })
    }
}
