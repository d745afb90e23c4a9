//! Settings and counters of a [`SqliteJournal`](super::SqliteJournal).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::OptionsError;

/// The settings of a [`SqliteJournal`](super::SqliteJournal) (feature `sqlite`, on by
/// default): plain data, loadable with serde from the application's configuration (unknown
/// keys refused), validated when
/// [`SqliteOptionsBuilder::build`](super::SqliteOptionsBuilder::build) builds the options.
/// `Default` gives the documented defaults; each field's meaning is that of the builder method
/// of the same name.
///
/// | setting | default | what it bounds |
/// |---|---|---|
/// | `max_batch_events` | 10 000 | events in one transaction (group commit) |
/// | `max_batch_bytes` | 8 MiB | payload bytes in one transaction |
/// | `queue_capacity` | 4 096 | writes waiting for the writer thread; callers beyond wait |
/// | `max_queued_bytes` | 64 MiB | payload bytes waiting for the writer; callers beyond wait |
/// | `buffer_events` | 4 096 | recent events kept in `event_buffer` before they are moved into `event_journal` |
/// | `readers` | 2 | read connections, each on its own thread |
/// | `busy_timeout` | 5 s | how long to wait for a lock held by another process or journal |
/// | `max_size_bytes` | none | the database file's size (SQLite `max_page_count`) |
///
/// A transaction closes once the next write would cross a batch bound; a single write larger
/// than a bound goes alone. A caller therefore waits for at most one commit beyond its own
/// unless more than a batch's worth is queued ahead of it.
///
/// In settings files the keys are the names of the table, with `busy_timeout_ms` in
/// milliseconds and `max_size_bytes` a number or `"unbounded"` (the default); missing keys
/// keep their defaults. The file's path is [`SqliteJournal::open_with`]'s argument.
///
/// ```
/// # use actix_delivery::journal::{SqliteConfig, SqliteOptions};
/// let loaded: SqliteConfig =
///     serde_json::from_str(r#"{ "readers": 4, "busy_timeout_ms": 250 }"#).unwrap();
/// let options = SqliteOptions::builder()
///     .max_batch_events(1_000) // a builder value wins over the loaded one
///     .config(loaded)
///     .build()
///     .unwrap();
/// assert_eq!(options.config().readers, 4);
/// assert_eq!(options.config().max_batch_events, 1_000);
/// ```
///
/// [`SqliteJournal::open_with`]: super::SqliteJournal::open_with
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SqliteConfig {
    /// Events in one transaction: default 10 000; at least 1.
    pub max_batch_events: usize,
    /// Payload bytes in one transaction: default 8 MiB; at least 1.
    pub max_batch_bytes: usize,
    /// Writes queued for the writer thread: default 4 096; at least 1.
    pub queue_capacity: usize,
    /// Payload bytes queued for the writer thread: default 64 MiB; 1 to `u32::MAX`.
    pub max_queued_bytes: usize,
    /// Recent events kept in `event_buffer` before they are moved: default 4 096; at least 1.
    pub buffer_events: usize,
    /// Read connections, each on its own thread: default 2; at least 1.
    pub readers: usize,
    /// Settings key `busy_timeout_ms`: default 5 s; at most `i32::MAX` milliseconds.
    #[serde(rename = "busy_timeout_ms", with = "busy_timeout_ms")]
    pub busy_timeout: Duration,
    /// The database's size cap in bytes: default none (`"unbounded"` in settings files).
    #[serde(with = "max_size_bytes")]
    pub max_size_bytes: Option<u64>,
}

crate::config::millis_key!(busy_timeout_ms, "busy_timeout_ms");
crate::config::optional_limit_key!(max_size_bytes, "max_size_bytes");

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            max_batch_events: 10_000,
            max_batch_bytes: 8 << 20,
            queue_capacity: 4_096,
            max_queued_bytes: 64 << 20,
            buffer_events: 4_096,
            readers: 2,
            busy_timeout: Duration::from_secs(5),
            max_size_bytes: None,
        }
    }
}

impl SqliteConfig {
    /// Checks every rule; the error names the first offending settings key.
    ///
    /// # Errors
    /// [`OptionsError`] naming the key and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        at_least_one("max_batch_events", self.max_batch_events)?;
        at_least_one("max_batch_bytes", self.max_batch_bytes)?;
        at_least_one("queue_capacity", self.queue_capacity)?;
        if self.max_queued_bytes == 0 || u32::try_from(self.max_queued_bytes).is_err() {
            return Err(OptionsError::new(
                "max_queued_bytes",
                format!("must be 1 to u32::MAX (got {})", self.max_queued_bytes),
            ));
        }
        // SQLite takes the busy timeout as an i32 of milliseconds.
        if self.busy_timeout > Duration::from_millis(i32::MAX as u64) {
            return Err(OptionsError::new(
                "busy_timeout_ms",
                format!(
                    "must be at most {} (got {})",
                    i32::MAX,
                    self.busy_timeout.as_millis()
                ),
            ));
        }
        at_least_one("buffer_events", self.buffer_events)?;
        at_least_one("readers", self.readers)
    }
}

/// `value` is at least 1, or an error naming `field`.
fn at_least_one(field: &'static str, value: usize) -> Result<(), OptionsError> {
    if value == 0 {
        return Err(OptionsError::new(field, "must be at least 1 (got 0)"));
    }
    Ok(())
}

/// Counters of a [`SqliteJournal`](super::SqliteJournal) since it was opened (feature
/// `sqlite`, on by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteStats {
    /// Appends committed.
    pub appends: u64,
    /// Events committed.
    pub events: u64,
    /// Transactions committed (each one fsync): `appends / transactions` is the mean group
    /// size.
    pub transactions: u64,
    /// Writes refused (conflict, invalid snapshot) or failed (storage errors).
    pub rejected: u64,
    /// Transactions that moved the buffer of recent events into `event_journal`.
    pub folds: u64,
    /// Writes waiting for the writer thread right now.
    pub queued: usize,
}

/// How durable a [`SqliteJournal`](super::SqliteJournal)'s commits are (feature `sqlite`, on
/// by default): the settings of its
/// write connection, read back from that connection once it is set up (they are per
/// connection, so another connection to the file may report otherwise). A journal commits
/// durably with `synchronous` FULL (2), so that a commit is on disk when it returns, and
/// `journal_mode` `wal`; tests check exactly that:
///
/// ```no_run
/// # async fn _demo() -> Result<(), actix_delivery::journal::JournalError> {
/// let journal = actix_delivery::journal::SqliteJournal::open("orders.journal").await?;
/// assert_eq!(journal.durability().synchronous, 2); // FULL
/// assert_eq!(journal.durability().journal_mode, "wal");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteDurability {
    /// `PRAGMA synchronous`: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
    pub synchronous: i64,
    /// `PRAGMA journal_mode`, in lower case.
    pub journal_mode: String,
}

impl SqliteDurability {
    /// Reads the settings of `conn`.
    pub(super) fn of(conn: &rusqlite::Connection) -> rusqlite::Result<Self> {
        Ok(Self {
            synchronous: conn.pragma_query_value(None, "synchronous", |row| row.get(0))?,
            journal_mode: conn
                .pragma_query_value(None, "journal_mode", |row| row.get::<_, String>(0))?
                .to_ascii_lowercase(),
        })
    }
}

/// The counters the writer thread keeps.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) appends: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) transactions: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) folds: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn read(&self, queued: usize) -> SqliteStats {
        SqliteStats {
            appends: self.appends.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            folds: self.folds.load(Ordering::Relaxed),
            queued,
        }
    }
}
