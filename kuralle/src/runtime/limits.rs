//! Where run limits meet the runtime: which limits a run holds to, whether its model is
//! priced when a dollar cap needs it, and how a refused request or batch ends the run.
//! The limits themselves, and the tally they are checked against, are in [`crate::limits`].

use std::collections::HashMap;

use super::{RunRequest, state::RunState};
use crate::{
    agent::AgentDef,
    dispatch::TurnCtx,
    error::RunError,
    event::Event,
    limits::{Exceeded, Pricing, RunLimits},
    model::Model,
};

/// `build()`'s check: every price is a real amount, and an agent with a dollar cap has a priced
/// model (a cap on an unpriced model would count every response as free).
pub(super) fn check_config(
    agents: &[AgentDef],
    default_model: Option<&dyn Model>,
    pricing: &HashMap<String, Pricing>,
) -> Result<(), RunError> {
    if let Some((model, _)) = pricing.iter().find(|(_, p)| !p.is_valid()) {
        return Err(RunError::Config(format!("the price of model `{model}` must be finite and at least zero")));
    }
    for a in agents {
        let model = a.model.as_deref().or(default_model);
        if let Some(model) = model {
            priced(a.limits.max_cost_usd.is_some(), &a.id, model, pricing)?;
        }
    }
    Ok(())
}

/// The model's price; an error when a dollar cap (`capped`) needs one and there is none.
pub(super) fn priced(
    capped: bool,
    agent: &str,
    model: &dyn Model,
    pricing: &HashMap<String, Pricing>,
) -> Result<Option<Pricing>, RunError> {
    match pricing.get(model.name()) {
        Some(p) => Ok(Some(*p)),
        None if capped => Err(RunError::Config(format!(
            "agent `{agent}` has a `max_cost_usd` limit but its model `{}` has no price: add \
             `.pricing(\"{}\", Pricing::new(input_per_mtok, output_per_mtok))` to the runtime",
            model.name(),
            model.name()
        ))),
        None => Ok(None),
    }
}

/// The limits a new turn opened by `req` holds to: the agent's, tightened by the request's.
pub(super) fn for_turn(agent: &AgentDef, req: &RunRequest) -> RunLimits {
    match &req.limits {
        Some(limits) => agent.limits.tighter(limits),
        None => agent.limits,
    }
}

/// The limits a run holds to: those kept with it when its turn opened (the agent's, for a
/// run recorded before limits were kept).
pub(super) fn of_run(agent: &AgentDef, state: &RunState) -> RunLimits {
    state.limits.as_deref().copied().unwrap_or(agent.limits)
}

/// Ends the turn for `exceeded`: the model response the refused batch came from (if not yet
/// written) is journaled, since what it spent was spent; the event names the limit; the error
/// ends the run with status `limit_exceeded`.
pub(crate) async fn refuse(ctx: &TurnCtx, exceeded: Exceeded) -> RunError {
    let run_id = ctx.journal.run_id().to_owned();
    tracing::info!(run_id, limit = %exceeded.limit, used = %exceeded.used, max = %exceeded.max, "run limit reached");
    if let Err(e) = ctx.journal.flush().await {
        return e;
    }
    let Exceeded { limit, used, max } = exceeded;
    ctx.emit(Event::LimitExceeded { run_id: run_id.clone(), limit, used, max }).await;
    RunError::LimitExceeded { run_id, limit, used, max }
}
