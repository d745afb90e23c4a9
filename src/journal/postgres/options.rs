//! The PostgreSQL journal's options, validated when built.

use std::time::Duration;

use crate::config::Overrides;
use crate::error::OptionsError;
use crate::journal::postgres::config::PostgresConfig;
#[cfg(feature = "tls")]
use crate::journal::postgres::tls::PostgresTls;

/// How a [`PostgresJournal`](super::PostgresJournal) connects, validated (feature `postgres`):
/// built with [`PostgresOptions::builder`] (`default()` gives the defaults) and passed to
/// [`PostgresJournal::connect_with`](super::PostgresJournal::connect_with) with the connection
/// string.
///
/// ```
/// # use actix_delivery::journal::PostgresOptions;
/// let options = PostgresOptions::builder()
///     .schema("orders")
///     .readers(4)
///     .build()
///     .unwrap();
/// assert_eq!(options.config().schema, "orders");
/// ```
#[derive(Clone, Debug, Default)]
pub struct PostgresOptions {
    pub(super) config: PostgresConfig,
    #[cfg(feature = "tls")]
    pub(super) tls: Option<PostgresTls>,
    #[cfg(feature = "metrics")]
    pub(super) metrics_label: Option<String>,
}

impl PostgresOptions {
    /// Starts a builder from the defaults.
    pub fn builder() -> PostgresOptionsBuilder {
        PostgresOptionsBuilder {
            loaded: PostgresConfig::default(),
            explicit: Overrides::default(),
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "metrics")]
            metrics_label: None,
        }
    }

    /// The validated settings.
    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }
}

/// Builds [`PostgresOptions`]: TLS and the metrics label, and the data settings
/// ([`PostgresConfig`]): a value set here wins over one [loaded](Self::config), which wins
/// over the default, whatever order the calls come in.
#[derive(Debug)]
pub struct PostgresOptionsBuilder {
    loaded: PostgresConfig,
    explicit: Overrides<PostgresConfig>,
    #[cfg(feature = "tls")]
    tls: Option<PostgresTls>,
    #[cfg(feature = "metrics")]
    metrics_label: Option<String>,
}

impl PostgresOptionsBuilder {
    /// Loaded settings (e.g. the `[journal.postgres]` section of the application's config
    /// file); values set on the builder still win.
    pub fn config(mut self, config: PostgresConfig) -> Self {
        self.loaded = config;
        self
    }

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
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: PostgresTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The PostgreSQL schema (namespace) that holds the journal's tables: 1 to 63 characters
    /// of lower-case ASCII letters, digits and `_`, not starting with a digit. Created on
    /// first connect if it does not exist (and `create_tables` is on). Separate schemas are
    /// separate journals in one database.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        let schema = schema.into();
        self.explicit.set(move |c| c.schema = schema);
        self
    }

    /// Whether the first connect creates the schema and tables when none exist (default).
    /// Off: they must have been created beforehand, e.g. by a DBA from
    /// [`PostgresJournal::SCHEMA_SQL`](super::PostgresJournal::SCHEMA_SQL), and the journal's
    /// role needs no `CREATE` privilege.
    pub fn create_tables(mut self, create: bool) -> Self {
        self.explicit.set(move |c| c.create_tables = create);
        self
    }

    /// This many read connections (at least 1). Reads are spread over them in turn; each
    /// pipelines the reads it is given.
    pub fn readers(mut self, readers: usize) -> Self {
        self.explicit.set(move |c| c.readers = readers);
        self
    }

    /// At most this many events per transaction (at least 1).
    pub fn max_batch_events(mut self, events: usize) -> Self {
        self.explicit.set(move |c| c.max_batch_events = events);
        self
    }

    /// At most this many payload bytes per transaction (at least 1).
    pub fn max_batch_bytes(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_batch_bytes = bytes);
        self
    }

    /// At most this many writes (appends, deletes, snapshots) queued for the writer;
    /// further callers wait for room (at least 1).
    pub fn queue_capacity(mut self, writes: usize) -> Self {
        self.explicit.set(move |c| c.queue_capacity = writes);
        self
    }

    /// At most this many payload bytes queued for the writer; further callers wait for room.
    /// A single write larger than this waits until the queue is empty. (1 to `u32::MAX`.)
    pub fn max_queued_bytes(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_queued_bytes = bytes);
        self
    }

    /// How long one attempt to connect (and set up the connection) may take (above 0).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.connect_timeout = timeout);
        self
    }

    /// How long one group's transaction may take, from sending it to the commit's answer
    /// (above 0). Past it the writer gives up on the connection: the group's appends fail
    /// with a [`JournalError::Storage`](crate::journal::JournalError::Storage) error that says
    /// they may or may not be stored.
    pub fn commit_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.commit_timeout = timeout);
        self
    }

    /// After a failed connection attempt the writer waits `min` before the next one,
    /// doubling the wait after each further failure up to `max` (`0 < min <= max`), each
    /// wait shortened by a random part of up to half (as a TCP node's
    /// [`reconnect_backoff`](crate::tcp::NodeOptionsBuilder::reconnect_backoff): many
    /// processes that lost one server do not come back in lockstep). Writes queued meanwhile
    /// wait; each group then gets one attempt.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.explicit.set(move |c| {
            c.reconnect_min = min;
            c.reconnect_max = max;
        });
        self
    }

    /// The options, validated.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting and why.
    pub fn build(self) -> Result<PostgresOptions, OptionsError> {
        #[cfg(feature = "metrics")]
        if let Some(label) = &self.metrics_label {
            crate::config::check_label(label)?;
        }
        let config = self.explicit.apply(self.loaded);
        config.validate()?;
        Ok(PostgresOptions {
            config,
            #[cfg(feature = "tls")]
            tls: self.tls,
            #[cfg(feature = "metrics")]
            metrics_label: self.metrics_label,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        assert!(PostgresOptions::builder().build().is_ok());
        assert!(PostgresOptions::builder()
            .schema("journal_2")
            .build()
            .is_ok());
    }

    #[test]
    fn every_invalid_setting_is_named() {
        let builder = PostgresOptions::builder;
        let ms = Duration::from_millis;
        let cases = [
            ("schema", builder().schema("")),
            ("schema", builder().schema("Orders")),
            ("schema", builder().schema("2nd")),
            ("schema", builder().schema("a; DROP TABLE x")),
            ("schema", builder().schema("x".repeat(64))),
            ("readers", builder().readers(0)),
            ("max_batch_events", builder().max_batch_events(0)),
            ("max_batch_bytes", builder().max_batch_bytes(0)),
            ("queue_capacity", builder().queue_capacity(0)),
            ("max_queued_bytes", builder().max_queued_bytes(0)),
            (
                "max_queued_bytes",
                builder().max_queued_bytes(u32::MAX as usize + 1),
            ),
            (
                "connect_timeout_ms",
                builder().connect_timeout(Duration::ZERO),
            ),
            (
                "commit_timeout_ms",
                builder().commit_timeout(Duration::ZERO),
            ),
            (
                "reconnect_min_ms",
                builder().reconnect_backoff(Duration::ZERO, ms(1)),
            ),
            (
                "reconnect_max_ms",
                builder().reconnect_backoff(ms(2), ms(1)),
            ),
            // Beyond a year: refused, not an `Instant` overflow in the writer.
            (
                "reconnect_min_ms",
                builder().reconnect_backoff(Duration::MAX, Duration::MAX),
            ),
            (
                "connect_timeout_ms",
                builder().connect_timeout(Duration::MAX),
            ),
            ("commit_timeout_ms", builder().commit_timeout(Duration::MAX)),
        ];
        for (field, builder) in cases {
            let error = builder.build().unwrap_err();
            assert_eq!(error.field, field, "{error}");
        }
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn an_empty_metrics_label_is_refused() {
        let error = PostgresOptions::builder()
            .metrics_label("")
            .build()
            .unwrap_err();
        assert_eq!(error.field, "metrics_label");
    }

    #[test]
    fn a_builder_value_wins_over_a_loaded_one_in_either_order() {
        let loaded = PostgresConfig {
            schema: "orders".to_string(),
            readers: 4,
            ..PostgresConfig::default()
        };
        let before = PostgresOptions::builder()
            .readers(1)
            .config(loaded.clone())
            .build()
            .unwrap();
        let after = PostgresOptions::builder()
            .config(loaded)
            .readers(1)
            .build()
            .unwrap();
        for options in [before, after] {
            assert_eq!(options.config().readers, 1);
            assert_eq!(options.config().schema, "orders");
        }
    }
}
