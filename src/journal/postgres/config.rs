//! Settings and counters of a [`PostgresJournal`](super::PostgresJournal).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::journal::JournalError;

/// Settings of a [`PostgresJournal`](super::PostgresJournal); start from `default()` and
/// change what you need:
///
/// ```
/// # use actix_delivery::journal::PostgresConfig;
/// let options = PostgresConfig::default().schema("orders").readers(4);
/// ```
///
/// | setting | default | what it does |
/// |---|---|---|
/// | `schema` | `public` | the PostgreSQL schema holding the tables (created if missing) |
/// | `create_tables` | `true` | create the tables on first connect (else they must exist) |
/// | `readers` | 2 | read connections (each pipelines any number of concurrent reads) |
/// | `max_batch_events` | 10 000 | events in one transaction (group commit) |
/// | `max_batch_bytes` | 8 MiB | payload bytes in one transaction |
/// | `queue_capacity` | 4 096 | writes waiting for the writer; callers beyond wait |
/// | `max_queued_bytes` | 64 MiB | payload bytes waiting for the writer; callers beyond wait |
/// | `connect_timeout` | 5 s | one connection attempt |
/// | `commit_timeout` | 30 s | one group's transaction, from sending it to its commit's answer |
/// | `reconnect_backoff` | 50 ms, doubling to 2 s, each wait shortened by a random part of up to half | the writer's wait between failed connection attempts |
///
/// A transaction closes once the next write would cross a batch bound; a single write larger
/// than a bound goes alone.
///
/// **From settings files.** Loadable with serde (unknown keys refused) under the names of the
/// table, with the durations in milliseconds (`connect_timeout_ms`, `commit_timeout_ms`, and
/// `reconnect_min_ms` / `reconnect_max_ms` for `reconnect_backoff`); missing keys keep their
/// defaults. Setters called on the loaded value win over it. Not data, so never loaded: the
/// connection string (it holds the password; [`PostgresJournal::connect_with`]'s argument)
/// and `tls` (feature `tls`). Invalid values are refused when the journal connects.
///
/// ```
/// # use actix_delivery::journal::PostgresConfig;
/// let loaded: PostgresConfig =
///     serde_json::from_str(r#"{ "schema": "orders", "commit_timeout_ms": 5000 }"#).unwrap();
/// let options = loaded.readers(4); // a setter wins over the loaded value
/// # let _ = options;
/// ```
///
/// [`PostgresJournal::connect_with`]: super::PostgresJournal::connect_with
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct PostgresConfig {
    pub(super) schema: String,
    pub(super) create_tables: bool,
    pub(super) readers: usize,
    pub(super) max_batch_events: usize,
    pub(super) max_batch_bytes: usize,
    pub(super) queue_capacity: usize,
    pub(super) max_queued_bytes: usize,
    #[serde(rename = "connect_timeout_ms", with = "connect_timeout_ms")]
    pub(super) connect_timeout: Duration,
    #[serde(rename = "commit_timeout_ms", with = "commit_timeout_ms")]
    pub(super) commit_timeout: Duration,
    #[serde(rename = "reconnect_min_ms", with = "reconnect_min_ms")]
    pub(super) reconnect_min: Duration,
    #[serde(rename = "reconnect_max_ms", with = "reconnect_max_ms")]
    pub(super) reconnect_max: Duration,
    #[cfg(feature = "tls")]
    #[serde(skip)]
    pub(super) tls: Option<super::tls::PostgresTls>,
    /// Builder-only (like the labels of nodes and carriers), so that one settings file
    /// loads with and without the feature.
    #[cfg(feature = "metrics")]
    #[serde(skip)]
    pub(super) metrics_label: Option<String>,
}

crate::config::millis_key!(connect_timeout_ms, "connect_timeout_ms");
crate::config::millis_key!(commit_timeout_ms, "commit_timeout_ms");
crate::config::millis_key!(reconnect_min_ms, "reconnect_min_ms");
crate::config::millis_key!(reconnect_max_ms, "reconnect_max_ms");

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            schema: "public".to_string(),
            create_tables: true,
            readers: 2,
            max_batch_events: 10_000,
            max_batch_bytes: 8 << 20,
            queue_capacity: 4_096,
            max_queued_bytes: 64 << 20,
            connect_timeout: Duration::from_secs(5),
            commit_timeout: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_secs(2),
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "metrics")]
            metrics_label: None,
        }
    }
}

impl PostgresConfig {
    /// The value of the `journal` label on this journal's metrics (feature `metrics`;
    /// default `"default"`; not empty).
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.metrics_label = Some(label.into());
        self
    }

    /// Connect over TLS (feature `tls`): [`PostgresTls::verify_full`] or
    /// [`PostgresTls::require`] (default: no TLS, as `NoTls`).
    ///
    /// [`PostgresTls::verify_full`]: crate::journal::PostgresTls::verify_full
    /// [`PostgresTls::require`]: crate::journal::PostgresTls::require
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: super::tls::PostgresTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The PostgreSQL schema (namespace) that holds the journal's tables: 1 to 63 characters
    /// of lower-case ASCII letters, digits and `_`, not starting with a digit. Created on
    /// first connect if it does not exist (and `create_tables` is on). Separate schemas are
    /// separate journals in one database.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Whether the first connect creates the schema and tables when none exist (default).
    /// Off: they must have been created beforehand, e.g. by a DBA from
    /// [`PostgresJournal::SCHEMA_SQL`](super::PostgresJournal::SCHEMA_SQL), and the journal's
    /// role needs no `CREATE` privilege.
    pub fn create_tables(mut self, create: bool) -> Self {
        self.create_tables = create;
        self
    }

    /// This many read connections (at least 1). Reads are spread over them in turn; each
    /// pipelines the reads it is given.
    pub fn readers(mut self, readers: usize) -> Self {
        self.readers = readers;
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

    /// At most this many writes (appends, deletes, snapshots) queued for the writer;
    /// further callers wait for room (at least 1).
    pub fn queue_capacity(mut self, writes: usize) -> Self {
        self.queue_capacity = writes;
        self
    }

    /// At most this many payload bytes queued for the writer; further callers wait for room.
    /// A single write larger than this waits until the queue is empty. (1 to `u32::MAX`.)
    pub fn max_queued_bytes(mut self, bytes: usize) -> Self {
        self.max_queued_bytes = bytes;
        self
    }

    /// How long one attempt to connect (and set up the connection) may take (above 0).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one group's transaction may take, from sending it to the commit's answer
    /// (above 0). Past it the writer gives up on the connection: the group's appends fail
    /// with a [`JournalError::Storage`] error that says they may or may not be stored.
    pub fn commit_timeout(mut self, timeout: Duration) -> Self {
        self.commit_timeout = timeout;
        self
    }

    /// After a failed connection attempt the writer waits `min` before the next one,
    /// doubling the wait after each further failure up to `max` (`0 < min <= max`), each
    /// wait shortened by a random part of up to half (as a TCP node's
    /// [`reconnect_backoff`](crate::tcp::NodeOptionsBuilder::reconnect_backoff): many
    /// processes that lost one server do not come back in lockstep). Writes queued meanwhile
    /// wait; each group then gets one attempt.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    pub(super) fn validate(&self) -> Result<(), JournalError> {
        let invalid = |reason: String| {
            Err(JournalError::InvalidArgument {
                persistence_id: None,
                reason,
            })
        };
        #[cfg(feature = "metrics")]
        if self.metrics_label.as_deref() == Some("") {
            return invalid("metrics_label must not be empty".to_string());
        }
        if !is_plain_identifier(&self.schema) {
            return invalid(format!(
                "schema {:?} must be 1 to 63 characters of a-z, 0-9 and _, not starting with a digit",
                self.schema
            ));
        }
        let positive = [
            ("readers", self.readers),
            ("max_batch_events", self.max_batch_events),
            ("max_batch_bytes", self.max_batch_bytes),
            ("queue_capacity", self.queue_capacity),
        ];
        for (name, value) in positive {
            if value == 0 {
                return invalid(format!("{name} must be at least 1 (got 0)"));
            }
        }
        if self.max_queued_bytes == 0 || u32::try_from(self.max_queued_bytes).is_err() {
            return invalid(format!(
                "max_queued_bytes must be 1 to u32::MAX (got {})",
                self.max_queued_bytes
            ));
        }
        for (name, value) in [
            ("connect_timeout_ms", self.connect_timeout),
            ("commit_timeout_ms", self.commit_timeout),
            ("reconnect_min_ms", self.reconnect_min),
            ("reconnect_max_ms", self.reconnect_max),
        ] {
            if let Err(error) = crate::config::duration(name, value) {
                return invalid(error.to_string());
            }
        }
        if self.reconnect_min > self.reconnect_max {
            return invalid(format!(
                "reconnect_backoff needs min <= max (reconnect_min_ms {:?}, reconnect_max_ms \
                 {:?})",
                self.reconnect_min, self.reconnect_max
            ));
        }
        Ok(())
    }
}

/// An identifier that needs no quoting in SQL: lower-case ASCII, digits, `_`, at most 63
/// bytes (PostgreSQL's limit), not starting with a digit.
pub(crate) fn is_plain_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_'))
        && name.len() <= 63
}

/// Counters of a [`PostgresJournal`](super::PostgresJournal) since it was connected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresStats {
    /// Appends committed.
    pub appends: u64,
    /// Events committed.
    pub events: u64,
    /// Transactions committed by the writer: `appends / transactions` is the mean group size.
    pub transactions: u64,
    /// Writes refused (conflict, invalid snapshot) or failed (storage errors).
    pub rejected: u64,
    /// Connections the writer and the readers opened again after losing one.
    pub reconnects: u64,
    /// Writes waiting for the writer right now.
    pub queued: usize,
}

/// The counters the writer and readers keep.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) appends: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) transactions: AtomicU64,
    pub(super) rejected: AtomicU64,
    pub(super) reconnects: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn read(&self, queued: usize) -> PostgresStats {
        PostgresStats {
            appends: self.appends.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
            queued,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_options_are_refused() {
        assert!(PostgresConfig::default().validate().is_ok());
        assert!(PostgresConfig::default()
            .schema("journal_2")
            .validate()
            .is_ok());
        let ms = Duration::from_millis;
        for options in [
            PostgresConfig::default().schema(""),
            PostgresConfig::default().schema("Orders"),
            PostgresConfig::default().schema("2nd"),
            PostgresConfig::default().schema("a; DROP TABLE x"),
            PostgresConfig::default().schema("x".repeat(64)),
            PostgresConfig::default().readers(0),
            PostgresConfig::default().max_batch_events(0),
            PostgresConfig::default().max_batch_bytes(0),
            PostgresConfig::default().queue_capacity(0),
            PostgresConfig::default().max_queued_bytes(0),
            PostgresConfig::default().max_queued_bytes(u32::MAX as usize + 1),
            PostgresConfig::default().connect_timeout(Duration::ZERO),
            PostgresConfig::default().commit_timeout(Duration::ZERO),
            PostgresConfig::default().reconnect_backoff(Duration::ZERO, ms(1)),
            PostgresConfig::default().reconnect_backoff(ms(2), ms(1)),
            // Beyond a year: refused, not an `Instant` overflow in the writer.
            PostgresConfig::default().reconnect_backoff(Duration::MAX, Duration::MAX),
            PostgresConfig::default().connect_timeout(Duration::MAX),
            PostgresConfig::default().commit_timeout(Duration::MAX),
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
