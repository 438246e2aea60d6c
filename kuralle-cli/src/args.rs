//! The command line, on clap's derive API.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};
use kuralle::RunStatus;

/// See and steer durable kuralle runs: list, inspect, approve, deny, or open the web console.
///
/// Needs only the store, never the agent's code: decisions are recorded, and the process
/// that owns the run (or a worker) resumes it.
#[derive(Debug, Parser)]
#[command(name = "kuralle", version)]
pub struct Cli {
    /// The store: `sqlite:PATH` or `postgres://USER@HOST/DB` (before or after the command).
    #[arg(long, env = "KURALLE_STORE", global = true)]
    pub store: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs: list, show, approve, deny, cancel, retry, fork, export.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Serve the web console (beyond loopback only with authentication).
    Console(ConsoleArgs),
}

/// `kuralle runs ...`.
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Runs, most recently updated first: id, agent, status, steps, last update, pending approvals.
    List {
        /// Only runs with this status.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// Only runs of this agent.
        #[arg(long = "agent", value_name = "ID")]
        agent: Option<String>,
        /// Only runs whose id starts with this.
        #[arg(long, value_name = "ID")]
        prefix: Option<String>,
        /// At most this many runs.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Skip this many matching runs first (with --limit: paging).
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: usize,
    },
    /// A run's journal step by step, and the approvals it waits for.
    Show {
        /// Run id.
        id: String,
    },
    /// Approve a pending request; the run's owner resumes it.
    Approve {
        /// Run id.
        id: String,
        /// Request id (from `runs show`).
        request: String,
        /// Who approves.
        #[arg(long, value_name = "NAME")]
        by: String,
    },
    /// Deny a pending request; the model is told the reason and the call never runs.
    Deny {
        /// Run id.
        id: String,
        /// Request id (from `runs show`).
        request: String,
        /// Who denies.
        #[arg(long, value_name = "NAME")]
        by: String,
        /// Why (the model is told).
        #[arg(long, value_name = "TEXT")]
        reason: String,
    },
    /// Cancel a running or paused run: a paused (or orphaned) run is closed at once; a run's
    /// owner stops at its next step or lease renewal. Workers never resume it.
    Cancel {
        /// Run id.
        id: String,
    },
    /// Make a failed run runnable again: a worker (or the owner's `resume`) continues it, and
    /// the steps its failed turn finished replay from the journal.
    Retry {
        /// Run id.
        id: String,
    },
    /// Fork a run at a journal step: a new run whose journal is a copy of the original's
    /// steps before --at, left for a worker (or `resume`) to continue from there.
    Fork {
        /// Run id.
        id: String,
        /// The first step the fork does again (`runs show` lists the ordinals).
        #[arg(long, value_name = "N")]
        at: u64,
        /// The fork's run id (default: a new UUID).
        #[arg(long = "new-id", value_name = "ID")]
        new_id: Option<String>,
        /// Continue as this agent (its model and instructions); it must be registered where
        /// the fork runs.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        /// Continue with these instructions instead of the agent's.
        #[arg(long, value_name = "TEXT")]
        instructions: Option<String>,
    },
    /// Write a run and its journal as a versioned JSON file that
    /// `kuralle::testing::Replay::from_export` plays back as a test.
    Export {
        /// Run id.
        id: String,
        /// Write to this file (created; never overwritten, owner-only permissions) instead of
        /// standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<std::path::PathBuf>,
    },
}

/// `kuralle console ...`.
#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Address to listen on (port 0 picks a free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,
    /// A `Host` the console answers besides loopback names (`name` or `name:port`); repeat
    /// for several. Every other host is refused (DNS rebinding).
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Tokens that log in, one a line as `NAME:TOKEN` (the name is who decides); `#` starts a
    /// comment. `KURALLE_CONSOLE_TOKEN` adds one more (`NAME:TOKEN`, or a bare token for
    /// --operator). Needed, or --trust-proxy-header, beyond loopback.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Trust this request header (e.g. `X-Forwarded-User`) to name the person, as set by an
    /// authenticating reverse proxy. Only safe where nothing but the proxy reaches the console.
    #[arg(long, value_name = "HEADER")]
    pub trust_proxy_header: Option<String>,
    /// Who decides on loopback without authentication (default: `$USER`), and the name of a
    /// bare `KURALLE_CONSOLE_TOKEN`.
    #[arg(long, value_name = "NAME")]
    pub operator: Option<String>,
}

/// A run status on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StatusArg {
    /// A turn is in progress (or its process died).
    Running,
    /// Waiting for a human decision.
    Paused,
    /// Finished with a model answer.
    Finished,
    /// Reached `max_steps`.
    MaxSteps,
    /// Interrupted by its caller.
    Interrupted,
    /// Failed.
    Failed,
    /// Stopped by one of its run limits.
    LimitExceeded,
    /// Cancelled by an operator.
    Cancelled,
}

impl From<StatusArg> for RunStatus {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Running => Self::Running,
            StatusArg::Paused => Self::Paused,
            StatusArg::Finished => Self::Finished,
            StatusArg::MaxSteps => Self::MaxSteps,
            StatusArg::Interrupted => Self::Interrupted,
            StatusArg::Failed => Self::Failed,
            StatusArg::LimitExceeded => Self::LimitExceeded,
            StatusArg::Cancelled => Self::Cancelled,
        }
    }
}
