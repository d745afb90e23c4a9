//! Settings and counters of a [`SqliteJournal`](super::SqliteJournal).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::journal::JournalError;

/// Settings of a [`SqliteJournal`](super::SqliteJournal) (feature `sqlite`, on by default);
/// start from `default()` and change what you need:
///
/// ```
/// # use actix_delivery::journal::SqliteConfig;
/// let options = SqliteConfig::default().max_batch_events(1_000).readers(1);
/// ```
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
/// **From settings files.** Loadable with serde (unknown keys refused) under the names of the
/// table, with `busy_timeout_ms` in milliseconds and `max_size_bytes` a number or
/// `"unbounded"` (the default); missing keys keep their defaults. Setters called on the
/// loaded value win over it. The file's path is [`SqliteJournal::open_with`]'s argument.
/// Invalid values are refused when the journal opens.
///
/// ```
/// # use actix_delivery::journal::SqliteConfig;
/// let loaded: SqliteConfig =
///     serde_json::from_str(r#"{ "readers": 4, "busy_timeout_ms": 250 }"#).unwrap();
/// let options = loaded.max_batch_events(1_000); // a setter wins over the loaded value
/// # let _ = options;
/// ```
///
/// [`SqliteJournal::open_with`]: super::SqliteJournal::open_with
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SqliteConfig {
    pub(super) max_batch_events: usize,
    pub(super) max_batch_bytes: usize,
    pub(super) queue_capacity: usize,
    pub(super) max_queued_bytes: usize,
    pub(super) buffer_events: usize,
    pub(super) readers: usize,
    #[serde(rename = "busy_timeout_ms", with = "busy_timeout_ms")]
    pub(super) busy_timeout: Duration,
    #[serde(with = "max_size_bytes")]
    pub(super) max_size_bytes: Option<u64>,
    /// Builder-only (like the labels of nodes and carriers), so that one settings file
    /// loads with and without the feature.
    #[cfg(feature = "metrics")]
    #[serde(skip)]
    pub(super) metrics_label: Option<String>,
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
            #[cfg(feature = "metrics")]
            metrics_label: None,
        }
    }
}

impl SqliteConfig {
    /// The value of the `journal` label on this journal's metrics (feature `metrics`;
    /// default `"default"`; not empty).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.metrics_label = Some(label.into());
        self
    }

    /// At most this many events per transaction (at least 1).
    pub fn max_batch_events(mut self, events: usize) -> Self {
        self.max_batch_events = events;
        self
    }

    /// At most this many payload bytes per transaction (at least 1).
    pub fn max_batch_bytes(mut self, bytes: usize) -> Self {
        self.max_batch_bytes = bytes;
        self
    }

    /// At most this many writes (appends, deletes, snapshots) queued for the writer thread;
    /// further callers wait for room (at least 1).
    pub fn queue_capacity(mut self, writes: usize) -> Self {
        self.queue_capacity = writes;
        self
    }

    /// At most this many payload bytes queued for the writer thread; further callers wait
    /// for room. A single write larger than this waits until the queue is empty. (1 to
    /// `u32::MAX`.)
    pub fn max_queued_bytes(mut self, bytes: usize) -> Self {
        self.max_queued_bytes = bytes;
        self
    }

    /// Moves the recent events from the unindexed `event_buffer` into `event_journal` once
    /// there are this many (or 4 MiB of them); at least 1. Larger values make commits of many
    /// streams cheaper (a commit dirties the buffer's last page instead of one index page per
    /// stream), smaller ones make replays of recently written streams cheaper (the buffer is
    /// scanned for them).
    pub fn buffer_events(mut self, events: usize) -> Self {
        self.buffer_events = events;
        self
    }

    /// This many read connections, each on its own thread (at least 1).
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers;
        self
    }

    /// How long to wait for a lock held elsewhere before failing with a
    /// [`JournalError::Storage`] error: SQLite's locks ("database is locked"), and on open the
    /// journal's own lock file (held by another process, or by a journal of this one whose
    /// last handle was dropped and which is still finishing its queue). Default 5 s, at most
    /// `i32::MAX` milliseconds (SQLite's limit).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Caps the database's size (rounded up to whole pages, and never below its current
    /// size): a write that would grow it further fails with a [`JournalError::Storage`]
    /// error ("database or disk is full"), as on a full disk.
    pub fn max_size_bytes(mut self, bytes: Option<u64>) -> Self {
        self.max_size_bytes = bytes;
        self
    }

    pub(super) fn validate(&self) -> Result<(), JournalError> {
        let invalid = |reason: &str| {
            Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason: reason.to_string(),
            })
        };
        #[cfg(feature = "metrics")]
        if self.metrics_label.as_deref() == Some("") {
            return invalid("metrics_label must not be empty");
        }
        if self.max_batch_events == 0 {
            return invalid("max_batch_events must be at least 1 (got 0)");
        }
        if self.max_batch_bytes == 0 {
            return invalid("max_batch_bytes must be at least 1 (got 0)");
        }
        if self.queue_capacity == 0 {
            return invalid("queue_capacity must be at least 1 (got 0)");
        }
        if self.max_queued_bytes == 0 || u32::try_from(self.max_queued_bytes).is_err() {
            return invalid(&format!(
                "max_queued_bytes must be 1 to u32::MAX (got {})",
                self.max_queued_bytes
            ));
        }
        // SQLite takes the busy timeout as an i32 of milliseconds.
        if self.busy_timeout > Duration::from_millis(i32::MAX as u64) {
            return invalid(&format!(
                "busy_timeout_ms must be at most {} (got {})",
                i32::MAX,
                self.busy_timeout.as_millis()
            ));
        }
        if self.buffer_events == 0 {
            return invalid("buffer_events must be at least 1 (got 0)");
        }
        if self.readers == 0 {
            return invalid("readers must be at least 1 (got 0)");
        }
        Ok(())
    }
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
/// # async fn demo() -> Result<(), actix_delivery::journal::JournalError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_bounds_are_refused() {
        assert!(SqliteConfig::default().validate().is_ok());
        for options in [
            SqliteConfig::default().max_batch_events(0),
            SqliteConfig::default().max_batch_bytes(0),
            SqliteConfig::default().queue_capacity(0),
            SqliteConfig::default().max_queued_bytes(0),
            SqliteConfig::default().readers(0),
            SqliteConfig::default().buffer_events(0),
            SqliteConfig::default().max_queued_bytes(u32::MAX as usize + 1),
            // Beyond what SQLite takes (an i32 of milliseconds): refused, not a panic at open.
            SqliteConfig::default().busy_timeout(Duration::from_millis(i32::MAX as u64 + 1)),
            SqliteConfig::default().busy_timeout(Duration::MAX),
        ] {
            assert!(
                matches!(
                    options.validate(),
                    Err(JournalError::InvalidArgument {
                        persistence_id: None,
                        ..
                    })
                ),
                "{options:?}"
            );
        }
    }
}
