//! `--store` → a [`RunStore`]. One match arm per kind of store.

use std::{path::Path, sync::Arc};

use kuralle::RunStore;

use crate::error::CliError;

/// Opens the store `spec` names: `sqlite:PATH` (the file must exist) or `postgres://...`.
pub async fn open(spec: &str) -> Result<Arc<dyn RunStore>, CliError> {
    if let Some(path) = spec.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        // Opening would create an empty store; an operator's typo must not look like "no runs".
        if !Path::new(path).is_file() {
            return Err(CliError::MissingStore(path.to_owned()));
        }
        return Ok(Arc::new(kuralle::stores::SqliteStore::open(path)?));
    }
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        return open_postgres(spec).await;
    }
    Err(CliError::UnsupportedStore(spec.to_owned()))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> Result<Arc<dyn RunStore>, CliError> {
    Ok(Arc::new(kuralle::stores::PostgresStore::connect(url).await?))
}

/// This build has no `PostgresStore` to open.
#[cfg(not(feature = "postgres"))]
#[allow(clippy::unused_async)]
async fn open_postgres(url: &str) -> Result<Arc<dyn RunStore>, CliError> {
    Err(CliError::NoPostgres(redact(url)))
}

/// The URL without its password, for messages.
#[cfg_attr(feature = "postgres", allow(dead_code))]
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_echoed() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
    }
}
