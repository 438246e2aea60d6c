//! `kuralle`: see and steer durable runs from outside the process that owns them.
//!
//! ```text
//! kuralle runs list --store sqlite:runs.db --status paused
//! kuralle runs show RUN --store sqlite:runs.db
//! kuralle runs approve RUN REQUEST --by alice --store sqlite:runs.db
//! kuralle runs cancel RUN --store sqlite:runs.db
//! kuralle runs fork RUN --at 3 --instructions "Refund instead." --store sqlite:runs.db
//! kuralle runs export RUN -o incident.json --store sqlite:runs.db
//! kuralle console --store sqlite:runs.db
//! ```

mod args;
mod clean;
mod console;
mod decide;
mod error;
mod export;
mod lifecycle;
mod store;
mod text;
mod time;
mod view;

use std::{io::Write, process::ExitCode};

use clap::Parser;

use crate::{
    args::{Cli, Command, RunsCommand},
    error::CliError,
    text::Style,
    view::ListQuery,
};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors quote run ids, request ids and store text: none of it may drive the terminal.
            eprintln!("error: {}", clean::terminal(&e.to_string(), false));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    let style = Style::detect();
    let spec = cli.store.filter(|s| !s.trim().is_empty()).ok_or(CliError::NoStore)?;
    let store = store::open(&spec).await?;
    let as_json = cli.json;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Runs(RunsCommand::List { status, agent, prefix, limit, offset }) => {
            let query = ListQuery { status: status.map(Into::into), agent, prefix, offset, limit };
            let rows = view::list(store.as_ref(), &query).await?;
            if as_json { json(&mut out, &rows)? } else { write!(out, "{}", text::runs(&rows, style))? }
        }
        Command::Runs(RunsCommand::Show { id }) => {
            let detail = view::show(store.as_ref(), &id).await?;
            if as_json { json(&mut out, &detail)? } else { write!(out, "{}", text::run(&detail, style))? }
        }
        Command::Runs(RunsCommand::Approve { id, request, by }) => {
            let decided = decide::decide(store.as_ref(), &id, &request, &by, None, decide::Via::cli()).await?;
            report(&mut out, as_json, &decided)?;
        }
        Command::Runs(RunsCommand::Deny { id, request, by, reason }) => {
            let decided = decide::decide(store.as_ref(), &id, &request, &by, Some(&reason), decide::Via::cli()).await?;
            report(&mut out, as_json, &decided)?;
        }
        Command::Runs(RunsCommand::Cancel { id }) => {
            let cancelled = lifecycle::cancel(store.as_ref(), &id).await?;
            if as_json {
                json(&mut out, &cancelled)?;
            } else {
                writeln!(out, "cancelled run {id} (was {}); an owner stops at its next step", cancelled.was)?;
            }
        }
        Command::Runs(RunsCommand::Retry { id }) => {
            lifecycle::retry(store.as_ref(), &id).await?;
            if as_json {
                json(&mut out, &serde_json::json!({"run_id": id, "status": "running"}))?;
            } else {
                writeln!(
                    out,
                    "run {id} is runnable again; a worker (or the owner's resume) continues it from its journal"
                )?;
            }
        }
        Command::Runs(RunsCommand::Fork { id, at, new_id, agent, instructions }) => {
            let fork = lifecycle::fork(store.as_ref(), &id, at, new_id, agent, instructions).await?;
            if as_json {
                json(&mut out, &serde_json::json!({"run_id": fork, "forked_from": id, "at": at}))?;
            } else {
                writeln!(out, "forked run {id} at step {at} as {fork}; a worker (or resume) continues it")?;
            }
        }
        Command::Runs(RunsCommand::Export { id, output }) => {
            let export = kuralle::export::RunExport::from_store(store.as_ref(), &id).await.map_err(export::error)?;
            match output {
                Some(path) => {
                    export::write_new(&path, &export.to_json())?;
                    let line = format!("run {id} ({} steps) written to {}", export.steps.len(), path.display());
                    writeln!(out, "{}", clean::terminal(&line, false))?;
                }
                None => writeln!(out, "{}", export.to_json())?,
            }
        }
        Command::Console(args) => {
            drop(out);
            console::serve(args, store).await?;
        }
    }
    Ok(())
}

fn json(out: &mut impl Write, value: &impl serde::Serialize) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::other)?;
    writeln!(out)?;
    Ok(())
}

fn report(out: &mut impl Write, as_json: bool, d: &decide::Decided) -> Result<(), CliError> {
    if as_json {
        return json(out, d);
    }
    let reason = d.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
    let line =
        format!("{} {} of run {} by {}{reason}; the run's owner resumes it", d.decision, d.request_id, d.run_id, d.by);
    writeln!(out, "{}", clean::terminal(&line, false))?;
    Ok(())
}
