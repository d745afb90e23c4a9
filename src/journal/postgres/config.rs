//! Settings and counters of a [`PostgresJournal`](super::PostgresJournal).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::OptionsError;

/// The settings of a [`PostgresJournal`](super::PostgresJournal) (feature `postgres`): plain
/// data, loadable with serde from the application's configuration (unknown keys refused),
/// validated when [`PostgresOptionsBuilder::build`](super::PostgresOptionsBuilder::build)
/// builds the options. `Default` gives the documented defaults; each field's meaning is that
/// of the builder method of the same name.
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
/// In settings files the keys are the names of the table, with the durations in milliseconds
/// (`connect_timeout_ms`, `commit_timeout_ms`, and `reconnect_min_ms` / `reconnect_max_ms`
/// for `reconnect_backoff`); missing keys keep their defaults. Not data, so never loaded: the
/// connection string (it holds the password; [`PostgresJournal::connect_with`]'s argument)
/// and `tls` (feature `tls`, set on the builder).
///
/// ```
/// # use actix_delivery::journal::{PostgresConfig, PostgresOptions};
/// let loaded: PostgresConfig =
///     serde_json::from_str(r#"{ "schema": "orders", "commit_timeout_ms": 5000 }"#).unwrap();
/// let options = PostgresOptions::builder()
///     .config(loaded)
///     .readers(4) // a builder value wins over the loaded one
///     .build()
///     .unwrap();
/// assert_eq!(options.config().schema, "orders");
/// assert_eq!(options.config().readers, 4);
/// ```
///
/// [`PostgresJournal::connect_with`]: super::PostgresJournal::connect_with
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// The schema holding the tables: default `public`; 1 to 63 characters of a-z, 0-9 and
    /// `_`, not starting with a digit.
    pub schema: String,
    /// Whether the first connect creates the schema and tables: default `true`.
    pub create_tables: bool,
    /// Read connections: default 2; at least 1.
    pub readers: usize,
    /// Events in one transaction: default 10 000; at least 1.
    pub max_batch_events: usize,
    /// Payload bytes in one transaction: default 8 MiB; at least 1.
    pub max_batch_bytes: usize,
    /// Writes queued for the writer: default 4 096; at least 1.
    pub queue_capacity: usize,
    /// Payload bytes queued for the writer: default 64 MiB; 1 to `u32::MAX`.
    pub max_queued_bytes: usize,
    /// Settings key `connect_timeout_ms`: default 5 s; positive, at most 365 days.
    #[serde(rename = "connect_timeout_ms", with = "connect_timeout_ms")]
    pub connect_timeout: Duration,
    /// Settings key `commit_timeout_ms`: default 30 s; positive, at most 365 days.
    #[serde(rename = "commit_timeout_ms", with = "commit_timeout_ms")]
    pub commit_timeout: Duration,
    /// The first wait between the writer's connection attempts. Settings key
    /// `reconnect_min_ms`: default 50 ms; positive, at most 365 days.
    #[serde(rename = "reconnect_min_ms", with = "reconnect_min_ms")]
    pub reconnect_min: Duration,
    /// The longest wait between the writer's connection attempts. Settings key
    /// `reconnect_max_ms`: default 2 s; at least `reconnect_min`, at most 365 days.
    #[serde(rename = "reconnect_max_ms", with = "reconnect_max_ms")]
    pub reconnect_max: Duration,
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
        }
    }
}

impl PostgresConfig {
    /// Checks every rule; the error names the first offending settings key.
    ///
    /// # Errors
    /// [`OptionsError`] naming the key and the rule it breaks.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if !is_plain_identifier(&self.schema) {
            return Err(OptionsError::new(
                "schema",
                format!(
                    "{:?} must be 1 to 63 characters of a-z, 0-9 and _, not starting with a digit",
                    self.schema
                ),
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
                return Err(OptionsError::new(name, "must be at least 1 (got 0)"));
            }
        }
        if self.max_queued_bytes == 0 || u32::try_from(self.max_queued_bytes).is_err() {
            return Err(OptionsError::new(
                "max_queued_bytes",
                format!("must be 1 to u32::MAX (got {})", self.max_queued_bytes),
            ));
        }
        crate::config::duration("connect_timeout_ms", self.connect_timeout)?;
        crate::config::duration("commit_timeout_ms", self.commit_timeout)?;
        crate::config::duration("reconnect_min_ms", self.reconnect_min)?;
        crate::config::duration("reconnect_max_ms", self.reconnect_max)?;
        if self.reconnect_min > self.reconnect_max {
            return Err(OptionsError::new(
                "reconnect_max_ms",
                format!(
                    "reconnect_backoff needs min <= max (reconnect_min_ms {:?}, reconnect_max_ms \
                     {:?})",
                    self.reconnect_min, self.reconnect_max
                ),
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
