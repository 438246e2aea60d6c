//! The in-flight workload of issue 27, for runs driven by worker processes
//! (`benches/in_flight_pg.rs`, `src/bin/bench_worker.rs`) and for the renewal count
//! (`benches/renewals.rs`): each run is three one-call turns and an answer, the model answering
//! every request after a fixed latency. It is the workload of `kuralle/benches/in_flight.rs`,
//! whose model also takes the run's index from its input, `run {i}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use kuralle::{
    AgentDef, FinishReason, Message, Model, ModelError, ModelEvent, ModelRequest, RunStore, Runtime, ToolCallRequest,
    Usage, tool,
};

/// Tool-call turns per run before the answer.
pub const CALLS: usize = 3;

/// The agent's id.
pub const AGENT: &str = "bench";

/// Add one.
#[tool]
async fn inc(
    /// The number.
    x: u64,
) -> u64 {
    x + 1
}

/// When each run made its latest model request, and the turns' added latency: a run's time
/// from one request to its next, less the model's latency (three samples per run).
pub struct Turns {
    start: Instant,
    latency: Duration,
    requested: Vec<AtomicU64>,
    added: Vec<AtomicU64>,
}

impl Turns {
    /// Room for `runs` runs (indices `0..runs`) answered after `latency`.
    pub fn new(runs: usize, latency: Duration) -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            latency,
            requested: (0..runs).map(|_| AtomicU64::new(0)).collect(),
            added: (0..runs * CALLS).map(|_| AtomicU64::new(u64::MAX)).collect(),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The added latency per turn of the turns measured here, in µs, at quantile `q` (0..=1);
    /// `None` if none was.
    pub fn added_us(&self, q: f64) -> Option<f64> {
        let mut v: Vec<u64> = self.added.iter().map(|a| a.load(Ordering::Relaxed)).filter(|&a| a != u64::MAX).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        Some(v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1e3)
    }
}

/// A model that answers after the latency of `turns`: [`CALLS`] one-call turns, then `done`,
/// chosen by the number of assistant messages in the transcript.
struct Latent {
    turns: Arc<Turns>,
}

impl Model for Latent {
    fn name(&self) -> &str {
        "latent"
    }

    fn stream(&self, request: ModelRequest) -> BoxStream<'static, Result<ModelEvent, ModelError>> {
        let turns = Arc::clone(&self.turns);
        let now = turns.now();
        let run = match request.messages.first() {
            Some(Message::User { content }) => content.strip_prefix("run ").and_then(|i| i.parse::<usize>().ok()),
            _ => None,
        };
        let turn = request.messages.iter().filter(|m| matches!(m, Message::Assistant { .. })).count();
        if let Some(run) = run.filter(|&r| r < turns.requested.len()) {
            if turn > 0 && turn <= CALLS {
                let wall = now.saturating_sub(turns.requested[run].load(Ordering::Relaxed));
                turns.added[run * CALLS + turn - 1]
                    .store(wall.saturating_sub(turns.latency.as_nanos() as u64), Ordering::Relaxed);
            }
            turns.requested[run].store(now, Ordering::Relaxed);
        }
        let latency = turns.latency;
        async_stream::stream! {
            tokio::time::sleep(latency).await;
            let usage = Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() };
            if turn < CALLS {
                yield Ok::<_, ModelError>(ModelEvent::ToolCall(ToolCallRequest {
                    call_id: format!("call_{turn}").into(),
                    name: "inc".into(),
                    arguments: format!(r#"{{"x":{turn}}}"#),
                }));
                yield Ok(ModelEvent::Finish { reason: FinishReason::ToolCalls, usage });
            } else {
                yield Ok::<_, ModelError>(ModelEvent::TextDelta { delta: "done".to_owned() });
                yield Ok(ModelEvent::Finish { reason: FinishReason::Stop, usage });
            }
        }
        .boxed()
    }
}

/// The runtime of the workload on `store`, its model noting turns in `turns`.
pub fn runtime(store: Arc<dyn RunStore>, turns: Arc<Turns>) -> Runtime {
    Runtime::builder()
        .agent(AgentDef::new(AGENT, "Count.").tool(Inc).max_steps(CALLS + 1))
        .model(Latent { turns })
        .store_arc(store)
        .build()
        .expect("the in-flight runtime builds")
}

/// This process's CPU time (user + system, every thread), from `/proc/self/stat`.
pub fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    cpu_of_stat(&stat)
}

/// The CPU time (user + system) in a `/proc/PID/stat` line, at the usual 100 ticks a second.
pub fn cpu_of_stat(stat: &str) -> Duration {
    // Fields after the command name (which may hold spaces) start at field 3; utime and stime
    // are fields 14 and 15.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
