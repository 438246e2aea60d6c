//! `kuralle runs export`: a run written to a file a test can replay.

use std::{io::Write, path::Path};

use kuralle::export::ExportError;

use crate::error::CliError;

/// Writes `text` to a new file at `path`, readable by its owner only: an export holds the
/// run's arguments and results as journaled. An existing file is never replaced.
pub(crate) fn write_new(path: &Path, text: &str) -> Result<(), CliError> {
    let fail = |e| CliError::Output(path.display().to_string(), e);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.write_all(b"\n").map_err(fail)?;
    file.sync_all().map_err(fail)
}

pub(crate) fn error(e: ExportError) -> CliError {
    match e {
        ExportError::RunNotFound(id) => CliError::UnknownRun(id),
        ExportError::Store(s) => CliError::Store(s),
        other => CliError::Export(other.to_string()),
    }
}
