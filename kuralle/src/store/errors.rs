//! Why a store operation failed.

use std::{error::Error, fmt, ops::Deref, sync::Arc};

/// Why a store operation failed.
///
/// ```
/// use kuralle::{RunStore, stores::MemoryStore};
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use kuralle::StoreError;
///
/// let store = MemoryStore::new();
/// let lease = store.acquire_lease("run-1", "worker-a", std::time::Duration::from_secs(30)).await?;
/// store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await?;
/// let again = store.create_run(kuralle::RunRecord::new("run-1", "support"), lease.token).await;
/// assert_eq!(again, Err(StoreError::RunExists("run-1".into())));
/// # Ok::<(), kuralle::StoreError>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No run with that id.
    #[error("run `{0}` not found")]
    RunNotFound(String),
    /// [`RunStore::create_run`](super::RunStore::create_run) for an id that exists.
    #[error("run `{0}` already exists")]
    RunExists(String),
    /// [`RunStore::put_run`](super::RunStore::put_run) lost an optimistic-concurrency race.
    #[error("version conflict on run `{run_id}`: expected version {expected}, stored version is {actual}")]
    VersionConflict {
        /// Run id.
        run_id: String,
        /// The version the writer read.
        expected: u64,
        /// The version the store holds.
        actual: u64,
    },
    /// An intent whose key the run's journal already holds.
    #[error("step key `{key}` is already journaled for run `{run_id}`")]
    DuplicateKey {
        /// Run id.
        run_id: String,
        /// The effect key.
        key: String,
    },
    /// No step at that ordinal, or it is not `Running`.
    #[error("no running step {ordinal} in run `{run_id}`")]
    StepNotRunning {
        /// Run id.
        run_id: String,
        /// The ordinal.
        ordinal: u64,
    },
    /// The store cannot be reached or written right now (locked, read-only, I/O error,
    /// connection lost; a full disk is [`StorageFull`](Self::StorageFull)). Nothing was lost; the operation can be retried and the run resumed.
    #[error("store unavailable (retryable): {0}")]
    Unavailable(#[source] StoreErrorMessage),
    /// The store has no room for the write: the disk is full, or the store reached a size
    /// limit it was given (such as the SQLite store's `SqliteOptions::max_size_bytes`). The
    /// write was not made and nothing acknowledged was lost. Retryable once there is room:
    /// free disk space or raise the limit, then resume the unfinished runs (a run that met
    /// this error stays resumable; [`serve`](crate::Runtime::serve) workers back off and
    /// retry on their own).
    ///
    /// ```
    /// use kuralle::StoreError;
    ///
    /// let e = StoreError::StorageFull("database or disk is full".into());
    /// assert!(e.is_retryable());
    /// assert!(e.to_string().starts_with("store is out of space (free space or raise the size limit"));
    /// ```
    #[error("store is out of space (free space or raise the size limit, then resume): {0}")]
    StorageFull(#[source] StoreErrorMessage),
    /// The file or database is not a usable kuralle store.
    #[error("store is corrupt or not a kuralle store: {0}")]
    Corrupt(#[source] StoreErrorMessage),
    /// A limit of the store was reached (for example a value too large to store).
    #[error("store limit exceeded: {0}")]
    LimitExceeded(#[source] StoreErrorMessage),
    /// The connection's TLS failed in a way that retrying cannot fix: the server's certificate
    /// is not signed by a trusted root or not valid for the host name, the server offers no
    /// TLS where the connection requires it, or the TLS settings cannot be used (an unreadable
    /// `sslrootcert`). The message carries the cause. Nothing was sent; fix the configuration
    /// (the URL's `sslmode` / `sslrootcert`, the server's certificate). Not retryable: a
    /// worker that meets it stops instead of retrying forever.
    ///
    /// ```
    /// use kuralle::StoreError;
    ///
    /// let e = StoreError::Tls("invalid peer certificate: UnknownIssuer".into());
    /// assert!(!e.is_retryable());
    /// assert_eq!(e.to_string(), "TLS to the store failed (not retryable): invalid peer certificate: UnknownIssuer");
    /// ```
    #[error("TLS to the store failed (not retryable): {0}")]
    Tls(#[source] StoreErrorMessage),
    /// The store refused the connection: authentication failed, or its access rules reject
    /// this user, database, address or encryption (PostgreSQL: SQLSTATE class 28, such as a
    /// `pg_hba.conf` that has no line for a connection without TLS, a wrong password, or a
    /// role that may not log in). The message carries the server's reason. Not retryable, and
    /// a run that meets it stays resumable: fix the credentials or the rules, then resume.
    ///
    /// ```
    /// use kuralle::StoreError;
    ///
    /// let e = StoreError::AccessDenied("no pg_hba.conf entry for host \"10.0.0.7\" (SQLSTATE 28000)".into());
    /// assert!(!e.is_retryable());
    /// assert!(e.to_string().starts_with("the store refused access (not retryable): no pg_hba.conf entry"));
    /// ```
    #[error("the store refused access (not retryable): {0}")]
    AccessDenied(#[source] StoreErrorMessage),
    /// A write or renewal under a fencing token that is no longer the run's current one
    /// (someone acquired the lease since, or it was released). Nothing was changed.
    #[error("run `{run_id}`: lease token {token} is no longer current (another owner took over, or it was released)")]
    Fenced {
        /// Run id.
        run_id: String,
        /// The stale token.
        token: u64,
    },
    /// [`RunStore::acquire_lease`](super::RunStore::acquire_lease) while another owner holds an unexpired lease.
    #[error("run `{run_id}` is owned by `{owner}` until {expires_at_ms} (ms since the Unix epoch)")]
    LeaseHeld {
        /// Run id.
        run_id: String,
        /// The current holder.
        owner: String,
        /// When its lease expires, by the store's clock.
        expires_at_ms: i64,
    },
    /// [`RunStore::lock_instance`](super::RunStore::lock_instance) for an instance id that
    /// another live holder has (see
    /// [`RuntimeBuilder::instance_id`](crate::RuntimeBuilder::instance_id)).
    #[error("instance id `{instance_id}` is in use: {holder}")]
    InstanceInUse {
        /// The instance id.
        instance_id: String,
        /// What holds it, as far as the store can tell (a lock file and the process id written
        /// in it, a PostgreSQL backend).
        holder: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed.
    ///
    /// ```
    /// use kuralle::StoreError;
    ///
    /// assert!(StoreError::Unavailable("database is locked".into()).is_retryable());
    /// assert!(!StoreError::RunNotFound("run-1".into()).is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::StorageFull(_))
    }
}

impl StoreError {
    /// The error with `source` as the cause of its message (for the variants that carry a
    /// [`StoreErrorMessage`]; others are returned as they are).
    pub(crate) fn with_source(self, source: impl Error + Send + Sync + 'static) -> Self {
        match self {
            Self::Unavailable(m) => Self::Unavailable(m.with_source(source)),
            Self::StorageFull(m) => Self::StorageFull(m.with_source(source)),
            Self::Corrupt(m) => Self::Corrupt(m.with_source(source)),
            Self::LimitExceeded(m) => Self::LimitExceeded(m.with_source(source)),
            Self::Tls(m) => Self::Tls(m.with_source(source)),
            Self::AccessDenied(m) => Self::AccessDenied(m.with_source(source)),
            other => other,
        }
    }
}

/// What a store says about an [`Unavailable`](StoreError::Unavailable),
/// [`StorageFull`](StoreError::StorageFull), [`Corrupt`](StoreError::Corrupt), [`LimitExceeded`](StoreError::LimitExceeded),
/// [`Tls`](StoreError::Tls) or [`AccessDenied`](StoreError::AccessDenied) error: a
/// message, and the driver's error that caused it, when there is one
/// ([`Error::source`] of the store error). It reads as its text (it derefs to `str`), and two
/// messages are equal when their texts are.
///
/// ```
/// use std::error::Error;
/// use kuralle::{StoreError, StoreErrorMessage};
///
/// let io = std::io::Error::other("disk full");
/// let e = StoreError::Unavailable(StoreErrorMessage::new("write failed").with_source(io));
/// assert_eq!(e.to_string(), "store unavailable (retryable): write failed");
/// assert_eq!(e.source().and_then(Error::source).map(ToString::to_string).as_deref(), Some("disk full"));
/// assert_eq!(e, StoreError::Unavailable("write failed".into()));
/// let StoreError::Unavailable(message) = &e else { unreachable!() };
/// assert!(message.contains("write"));
/// ```
#[derive(Clone)]
pub struct StoreErrorMessage {
    text: String,
    source: Option<Arc<dyn Error + Send + Sync>>,
}

impl StoreErrorMessage {
    /// A message without a cause.
    pub fn new(text: impl Into<String>) -> Self {
        Self { text: text.into(), source: None }
    }

    /// The message with `source` as its cause.
    #[must_use]
    pub fn with_source(mut self, source: impl Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The message with `prefix: ` before its text, keeping its cause.
    pub(crate) fn prefixed(self, prefix: &str) -> Self {
        Self { text: format!("{prefix}: {}", self.text), source: self.source }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Deref for StoreErrorMessage {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for StoreErrorMessage {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for StoreErrorMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for StoreErrorMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl Error for StoreErrorMessage {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

impl PartialEq for StoreErrorMessage {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for StoreErrorMessage {}

impl PartialEq<str> for StoreErrorMessage {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for StoreErrorMessage {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl From<String> for StoreErrorMessage {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

impl From<&str> for StoreErrorMessage {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}
