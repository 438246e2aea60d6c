//! One model step: a response replayed from the journal, or streamed from the model,
//! assembled into its parts and journaled.

use std::sync::Arc;

use futures::StreamExt;

use super::{
    Inner,
    response::{ModelResponse, Offered, cap_arguments, dedupe_call_ids, with_calls},
};
use crate::{
    dispatch::TurnCtx,
    error::RunError,
    event::Event,
    journal::Lookup,
    json::JsonText,
    model::{FinishReason, Model, ModelError, ModelEvent, ModelRequest, Origin, Part, Usage},
    store::{StepKind, StepOutcome, StoreError},
};

/// One model response: replayed from the journal when recorded, else requested (live text
/// deltas) and journaled. `None` when the caller interrupted the stream.
///
/// An `async` block, not an `async fn`, which would store the request twice (as it came in
/// and as the body's local) through the model's whole latency. The request comes boxed: a
/// captured value keeps its bytes in the future even once moved into the model's stream, and
/// this future is held through the model's whole latency.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(super) fn model_step<'a>(
    rt: &'a Inner,
    ctx: &'a TurnCtx,
    model: &'a dyn Model,
    request: Box<ModelRequest>,
    callsite: u64,
) -> impl Future<Output = Result<Option<ModelResponse>, RunError>> + Send + 'a {
    async move {
        let journal = &ctx.journal;
        let key = journal.model_key(callsite);
        if let Some(replayed) = journal.result_text(&key) {
            // Boxed: a replay is the rare path, and its locals would widen the live one's future.
            return Box::pin(replay(ctx, replayed)).await.map(Some);
        }
        crate::trace::replayed(false);
        if let Some(exceeded) = ctx.budget.before_request(&journal.spent()) {
            return Err(Box::pin(super::limits::refuse(ctx, exceeded)).await);
        }
        // No intent is written before asking: a response cut off by a crash is asked for again
        // either way, so the response is journaled once it is complete, with the intents of the
        // calls it asks for (one commit). An intent left by an older turn is finished in place.
        let unfinished = match journal.lookup(&key) {
            Lookup::Running(ordinal) => Some(ordinal),
            // Model failures are never journaled as final (they are transient), so a failed step
            // cannot occur; treat one like a fresh step and ask again.
            Lookup::Finished(_) | Lookup::Failed(_) | Lookup::Fresh => None,
        };

        let offered = Some(Offered::Specs(Arc::clone(&request.tools)));
        let mut stream = model.stream(*request);
        let mut response = ModelResponse {
            parts: Vec::new(),
            origin: None,
            finish: FinishReason::Stop,
            usage: Usage::default(),
            offered,
            cost_usd: None,
        };
        // Text streamed since the last part; it becomes a text part when the next part starts.
        let mut open_text = String::new();
        let mut finished = false;
        loop {
            // What to tell the listener is sent after the model's event is gone: an event held
            // across a send would keep its 128 bytes in this future through the model's whole
            // latency, which is when every run in flight holds one.
            let told = {
                let next = tokio::select! {
                    biased;
                    () = ctx.interrupt.cancelled() => return Ok(None),
                    next = stream.next() => next,
                };
                match next {
                    None => break,
                    Some(Err(e)) => return Err(e.into()),
                    Some(Ok(ModelEvent::TextDelta { delta })) => {
                        open_text.push_str(&delta);
                        Some(Event::TextDelta { delta })
                    }
                    Some(Ok(ModelEvent::ReasoningDelta { delta })) => {
                        ctx.events.is_listening().then_some(Event::ReasoningDelta { delta })
                    }
                    Some(Ok(ModelEvent::ToolCall(call))) => {
                        close_text(&mut response.parts, &mut open_text);
                        response.parts.push(Part::call(call));
                        None
                    }
                    Some(Ok(ModelEvent::Part { part })) => {
                        if matches!(part, Part::Text { .. }) {
                            // The part is the streamed text, complete, with its signature or id.
                            open_text.clear();
                        } else {
                            close_text(&mut response.parts, &mut open_text);
                        }
                        response.parts.push(part);
                        None
                    }
                    Some(Ok(ModelEvent::Finish { reason, usage })) => {
                        response.finish = reason;
                        response.usage = usage;
                        finished = true;
                        None
                    }
                }
            };
            // Made before it is awaited, so that `told` is moved from, not matched on: a matched
            // local keeps its slot through the await in its arm.
            if let Some(sending) = told.map(|event| ctx.events.send(event)) {
                sending.await;
            }
        }
        if !finished {
            return Err(ModelError::Protocol("the model stream ended without a finish reason".into()).into());
        }
        close_text(&mut response.parts, &mut open_text);
        response.cost_usd = rt.pricing.get(model.name()).map(|p| p.cost(&response.usage));
        // Provider state goes back only to its provider; a turn without any needs no origin.
        if response.parts.iter().any(Part::is_provider_state) {
            response.origin = Some(Origin::new(model.provider(), model.name()));
        }
        // Before journaling, so a replay gives the model the same answers.
        let budget = rt.max_value_bytes.saturating_sub(response.text_bytes());
        with_calls(&mut response.parts, |calls| {
            dedupe_call_ids(calls);
            cap_arguments(calls, budget);
        });
        // The parts join the transcript for the run's life; a one-call response would keep
        // room for four 120-byte parts.
        response.parts.shrink_to_fit();
        // Written once, from the typed response, as the text the store keeps; measured by its
        // length. A `ModelResponse` always serializes (its maps have string keys).
        let value = JsonText::serialize_from(&response).unwrap_or_default();
        let size = value.len();
        if size > rt.max_value_bytes {
            return Err(RunError::ResponseTooLarge { size, limit: rt.max_value_bytes });
        }
        // Boxed: the step's future is held through the model's whole latency, these writes only
        // after it.
        match unfinished {
            Some(ordinal) => Box::pin(journal.finish(&key, ordinal, StepOutcome::Finished(value), false)).await?,
            None => Box::pin(journal.defer_finished(key, StepKind::Model, "model", value)).await?,
        }
        journal.spend(response.usage, response.cost_usd);
        Ok(Some(response))
    }
}

/// A response journaled by an earlier attempt, decoded straight from the journal's text into
/// the typed response (no tree in between), its text sent as one delta.
async fn replay(ctx: &TurnCtx, replayed: JsonText) -> Result<ModelResponse, RunError> {
    let response = replayed.decode::<ModelResponse>().map_err(|e| {
        RunError::Store(StoreError::Corrupt(format!("journaled model response is unreadable: {e}").into()))
    })?;
    if ctx.events.is_listening() {
        let text = response.text();
        if !text.is_empty() {
            ctx.events.send(Event::TextDelta { delta: text }).await;
        }
    }
    crate::trace::replayed(true);
    Ok(response)
}

/// Ends the text streamed since the last part as a text part of its own.
pub(super) fn close_text(parts: &mut Vec<Part>, open: &mut String) {
    if !open.is_empty() {
        parts.push(Part::text(std::mem::take(open)));
    }
}
