//! The SQLite journal's options, validated when built.

use std::time::Duration;

use crate::config::Overrides;
use crate::error::OptionsError;
use crate::journal::sqlite::config::SqliteConfig;

/// How a [`SqliteJournal`](super::SqliteJournal) is opened, validated (feature `sqlite`, on by
/// default): built with [`SqliteOptions::builder`] (`default()` gives the defaults) and passed
/// to [`SqliteJournal::open_with`](super::SqliteJournal::open_with).
///
/// ```
/// # use actix_delivery::journal::SqliteOptions;
/// let options = SqliteOptions::builder()
///     .max_batch_events(1_000)
///     .readers(1)
///     .build()
///     .unwrap();
/// assert_eq!(options.config().readers, 1);
/// ```
#[derive(Clone, Debug, Default)]
pub struct SqliteOptions {
    pub(super) config: SqliteConfig,
    #[cfg(feature = "metrics")]
    pub(super) metrics_label: Option<String>,
}

impl SqliteOptions {
    /// Starts a builder from the defaults.
    pub fn builder() -> SqliteOptionsBuilder {
        SqliteOptionsBuilder {
            loaded: SqliteConfig::default(),
            explicit: Overrides::default(),
            #[cfg(feature = "metrics")]
            metrics_label: None,
        }
    }

    /// The validated settings.
    pub fn config(&self) -> &SqliteConfig {
        &self.config
    }
}

/// Builds [`SqliteOptions`]: a value set here wins over one [loaded](Self::config), which
/// wins over the default, whatever order the calls come in.
#[derive(Debug)]
pub struct SqliteOptionsBuilder {
    loaded: SqliteConfig,
    explicit: Overrides<SqliteConfig>,
    #[cfg(feature = "metrics")]
    metrics_label: Option<String>,
}

impl SqliteOptionsBuilder {
    /// Loaded settings (e.g. the `[journal.sqlite]` section of the application's config
    /// file); values set on the builder still win.
    pub fn config(mut self, config: SqliteConfig) -> Self {
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

    /// At most this many writes (appends, deletes, snapshots) queued for the writer thread;
    /// further callers wait for room (at least 1).
    pub fn queue_capacity(mut self, writes: usize) -> Self {
        self.explicit.set(move |c| c.queue_capacity = writes);
        self
    }

    /// At most this many payload bytes queued for the writer thread; further callers wait
    /// for room. A single write larger than this waits until the queue is empty. (1 to
    /// `u32::MAX`.)
    pub fn max_queued_bytes(mut self, bytes: usize) -> Self {
        self.explicit.set(move |c| c.max_queued_bytes = bytes);
        self
    }

    /// Moves the recent events from the unindexed `event_buffer` into `event_journal` once
    /// there are this many (or 4 MiB of them); at least 1. Larger values make commits of many
    /// streams cheaper (a commit dirties the buffer's last page instead of one index page per
    /// stream), smaller ones make replays of recently written streams cheaper (the buffer is
    /// scanned for them).
    pub fn buffer_events(mut self, events: usize) -> Self {
        self.explicit.set(move |c| c.buffer_events = events);
        self
    }

    /// This many read connections, each on its own thread (at least 1).
    pub fn readers(mut self, readers: usize) -> Self {
        self.explicit.set(move |c| c.readers = readers);
        self
    }

    /// How long to wait for a lock held elsewhere before failing with a
    /// [`JournalError::Storage`](crate::journal::JournalError::Storage) error: SQLite's locks
    /// ("database is locked"), and on open the journal's own lock file (held by another
    /// process, or by a journal of this one whose last handle was dropped and which is still
    /// finishing its queue). Default 5 s, at most `i32::MAX` milliseconds (SQLite's limit).
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.busy_timeout = timeout);
        self
    }

    /// Caps the database's size (rounded up to whole pages, and never below its current
    /// size): a write that would grow it further fails with a
    /// [`JournalError::Storage`](crate::journal::JournalError::Storage) error ("database or
    /// disk is full"), as on a full disk. `None` (the default): no cap.
    pub fn max_size_bytes(mut self, bytes: Option<u64>) -> Self {
        self.explicit.set(move |c| c.max_size_bytes = bytes);
        self
    }

    /// The options, validated.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting and why.
    pub fn build(self) -> Result<SqliteOptions, OptionsError> {
        #[cfg(feature = "metrics")]
        if let Some(label) = &self.metrics_label {
            crate::config::check_label(label)?;
        }
        let config = self.explicit.apply(self.loaded);
        config.validate()?;
        Ok(SqliteOptions {
            config,
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
        assert!(SqliteOptions::builder().build().is_ok());
        assert!(SqliteConfig::default().validate().is_ok());
    }

    #[test]
    fn every_invalid_setting_is_named() {
        let cases = [
            (
                "max_batch_events",
                SqliteOptions::builder().max_batch_events(0),
            ),
            (
                "max_batch_bytes",
                SqliteOptions::builder().max_batch_bytes(0),
            ),
            ("queue_capacity", SqliteOptions::builder().queue_capacity(0)),
            (
                "max_queued_bytes",
                SqliteOptions::builder().max_queued_bytes(0),
            ),
            ("readers", SqliteOptions::builder().readers(0)),
            ("buffer_events", SqliteOptions::builder().buffer_events(0)),
            (
                "max_queued_bytes",
                SqliteOptions::builder().max_queued_bytes(u32::MAX as usize + 1),
            ),
            // Beyond what SQLite takes (an i32 of milliseconds): refused, not a panic at open.
            (
                "busy_timeout_ms",
                SqliteOptions::builder().busy_timeout(Duration::from_millis(i32::MAX as u64 + 1)),
            ),
            (
                "busy_timeout_ms",
                SqliteOptions::builder().busy_timeout(Duration::MAX),
            ),
        ];
        for (field, builder) in cases {
            let error = builder.build().unwrap_err();
            assert_eq!(error.field, field, "{error}");
        }
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn an_empty_metrics_label_is_refused() {
        let error = SqliteOptions::builder()
            .metrics_label("")
            .build()
            .unwrap_err();
        assert_eq!(error.field, "metrics_label");
    }

    #[test]
    fn a_builder_value_wins_over_a_loaded_one_in_either_order() {
        let loaded = SqliteConfig {
            readers: 4,
            queue_capacity: 8,
            ..SqliteConfig::default()
        };
        let before = SqliteOptions::builder()
            .readers(1)
            .config(loaded.clone())
            .build()
            .unwrap();
        let after = SqliteOptions::builder()
            .config(loaded)
            .readers(1)
            .build()
            .unwrap();
        for options in [before, after] {
            assert_eq!(options.config().readers, 1);
            assert_eq!(options.config().queue_capacity, 8);
        }
    }
}
