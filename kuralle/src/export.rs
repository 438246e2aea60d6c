//! A run and its journal as one versioned JSON document: what `kuralle runs export` writes
//! and [`Replay::from_export`](crate::testing::Replay::from_export) reads, so a run recorded
//! in production can be played back as a test.
//!
//! The document is the run's record and every journal step, exactly as the store keeps them.
//! Arguments and results are included as journaled: treat an export like the database it came
//! from.

use serde::{Deserialize, Serialize};

use crate::store::{RunRecord, RunStore, StepRecord, StoreError};

/// The `format` field of every export.
pub const FORMAT: &str = "kuralle.run-export";

/// The export version this build writes and reads.
pub const VERSION: u32 = 1;

/// A run and its journal, as exported.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::{AgentDef, Runtime, export::RunExport, testing::{ScriptedModel, Turn}};
///
/// let runtime = Runtime::builder()
///     .agent(AgentDef::new("support", "Answer briefly."))
///     .model(ScriptedModel::new([Turn::text("Hello.")]))
///     .build()
///     .unwrap();
/// let run_id = runtime.run("Hi").await.unwrap().run_id;
/// let export = RunExport::from_store(runtime.store().as_ref(), &run_id).await.unwrap();
/// let text = export.to_json();
/// let back = RunExport::from_json(&text).unwrap();
/// assert_eq!(back.run.run_id, run_id);
/// assert_eq!(back.steps.len(), 1); // the model response
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunExport {
    /// Always [`FORMAT`].
    pub format: String,
    /// The version the document was written in ([`VERSION`]).
    pub version: u32,
    /// The run's record: status, agent and the runtime's state (its transcript).
    pub run: RunRecord,
    /// Every journal step, in ordinal order.
    pub steps: Vec<StepRecord>,
}

/// Why an export could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The store has no run with this id.
    #[error("no run `{0}` in the store")]
    RunNotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The text is not an export document.
    #[error("not a run export: {0}")]
    Malformed(String),
    /// The document is JSON of another kind.
    #[error("not a run export: `format` is {found:?}, expected {FORMAT:?}")]
    Format {
        /// The `format` found.
        found: Option<String>,
    },
    /// The document was written by a newer kuralle.
    #[error("run export version {found} is newer than this build reads ({VERSION})")]
    Version {
        /// The version found.
        found: u64,
    },
    /// The run's stored state cannot be read.
    #[error("the exported run's state is unreadable: {0}")]
    State(String),
}

impl RunExport {
    /// The run `run_id` and its journal, read from `store`, with its tools' sensitive values
    /// ([`Secret`](crate::Secret)) redacted.
    ///
    /// # Errors
    /// [`ExportError::RunNotFound`] for an unknown id, [`ExportError::Store`] when the store
    /// fails.
    pub async fn from_store(store: &dyn RunStore, run_id: &str) -> Result<Self, ExportError> {
        let mut run = store.get_run(run_id).await?.ok_or_else(|| ExportError::RunNotFound(run_id.to_owned()))?;
        let mut steps = store.steps(run_id).await?;
        steps.sort_by_key(|s| s.ordinal);
        // An export leaves the machine: sensitive values never go with it.
        let redact = crate::Redactions::of(&run);
        redact.record(&mut run);
        steps.iter_mut().for_each(|s| redact.step(s));
        Ok(Self { format: FORMAT.to_owned(), version: VERSION, run, steps })
    }

    /// The document as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Records hold only string-keyed maps and finite numbers: serializing cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads a document written by [`to_json`](Self::to_json). The header is checked before
    /// the body, so a file of another kind or a newer version gets an error that says so.
    ///
    /// ```
    /// use kuralle::export::{ExportError, RunExport};
    ///
    /// let err = RunExport::from_json(r#"{"format":"kuralle.run-export","version":99}"#).unwrap_err();
    /// assert!(matches!(err, ExportError::Version { found: 99 }));
    /// assert!(matches!(RunExport::from_json("{}"), Err(ExportError::Format { found: None })));
    /// ```
    ///
    /// # Errors
    /// [`ExportError::Malformed`], [`ExportError::Format`] or [`ExportError::Version`].
    pub fn from_json(text: &str) -> Result<Self, ExportError> {
        #[derive(Deserialize)]
        struct Header {
            format: Option<String>,
            version: Option<u64>,
        }
        let header: Header = serde_json::from_str(text).map_err(|e| ExportError::Malformed(e.to_string()))?;
        if header.format.as_deref() != Some(FORMAT) {
            return Err(ExportError::Format { found: header.format });
        }
        match header.version {
            Some(v) if v > u64::from(VERSION) => return Err(ExportError::Version { found: v }),
            _ => {}
        }
        serde_json::from_str(text).map_err(|e| ExportError::Malformed(e.to_string()))
    }

    /// The user inputs of the run's turns, in order: what a test sends to replay it.
    ///
    /// # Errors
    /// [`ExportError::State`] when the run's state is not the runtime's.
    pub fn inputs(&self) -> Result<Vec<String>, ExportError> {
        crate::runtime::recorded_inputs(&self.run).map_err(|e| ExportError::State(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_of_another_kind_is_refused_by_its_header() {
        let err = RunExport::from_json(r#"{"format":"something-else","version":1}"#).unwrap_err();
        assert!(matches!(err, ExportError::Format { found: Some(f) } if f == "something-else"));
        assert!(matches!(RunExport::from_json("[1,2]"), Err(ExportError::Malformed(_))));
        assert!(matches!(RunExport::from_json("not json"), Err(ExportError::Malformed(_))));
    }

    #[test]
    fn a_current_header_with_a_broken_body_is_malformed() {
        let err = RunExport::from_json(r#"{"format":"kuralle.run-export","version":1,"run":7}"#).unwrap_err();
        assert!(matches!(err, ExportError::Malformed(_)), "{err}");
    }

    #[test]
    fn an_export_reads_back_equal() {
        let export = RunExport {
            format: FORMAT.into(),
            version: VERSION,
            run: RunRecord::new("r1", "support"),
            steps: vec![StepRecord {
                ordinal: 0,
                key: "k".into(),
                kind: crate::store::StepKind::Now,
                name: "now".into(),
                epoch: 0,
                status: crate::store::StepStatus::Finished,
                result: Some(crate::JsonText::from(serde_json::json!(5))),
                error: None,
                started_at_ms: 1,
                finished_at_ms: Some(2),
            }],
        };
        assert_eq!(RunExport::from_json(&export.to_json()).unwrap(), export);
    }
}
