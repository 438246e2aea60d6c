//! A worker ([`Runtime::serve_with`]) serving in the background until stopped, for the tests
//! that drive runs through workers (`workers.rs`, `faults.rs`, `partition.rs`).

use kuralle::{RunError, Runtime, ServeReport, WorkerOptions};
use tokio::{sync::oneshot, task::JoinHandle};

/// A worker serving on its own task until [`Serving::stop`].
pub struct Serving {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<ServeReport, RunError>>,
}

impl Serving {
    /// Starts serving `runtime` with `options`.
    pub fn start(runtime: &Runtime, options: WorkerOptions) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = runtime.clone();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            runtime.serve_with(shutdown, options).await
        });
        Self { stop, task }
    }

    /// Asks the worker to shut down and hands back its task, to watch the shutdown happen.
    pub fn begin_shutdown(self) -> JoinHandle<Result<ServeReport, RunError>> {
        let _ = self.stop.send(());
        self.task
    }

    /// Asks the worker to shut down and returns its report once it has.
    pub async fn stop(self) -> ServeReport {
        let _ = self.stop.send(());
        self.task.await.expect("the worker does not panic").expect("the worker ends cleanly")
    }
}
