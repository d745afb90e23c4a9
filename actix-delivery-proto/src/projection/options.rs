//! Validated options of a projection. Pure.

use std::time::Duration;

use crate::config::{duration, positive};
use crate::error::OptionsError;
use crate::journal::by_tag::TagQuery;
use crate::journal::tag::{Slices, Tag};

/// The longest projection name, in bytes.
pub const MAX_PROJECTION_NAME: usize = 128;

/// What a projection does with an entry it cannot get past: one whose handler keeps failing
/// (after `max_retries` retries, alone in its batch), whose events were deleted before the
/// projection read them, or which does not decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoisonPolicy {
    /// Stop the projection (the default): its offset stays before the entry, nothing is
    /// skipped, and `ProjectionHandle::stopped`
    /// names the entry and why. Fix the cause and start it again.
    #[default]
    Stop,
    /// Skip the entry: its offset is stored as handled (in its own transaction, with exactly
    /// once), it is counted (`ProjectionStats::skipped`)
    /// and logged with its stream, seq, offset and why, and the projection goes on.
    Skip,
}

/// Everything a projection needs to know besides its journal, store and handler, validated.
/// Built with [`ProjectionOptions::builder`].
#[derive(Clone, Debug)]
pub struct ProjectionOptions {
    /// The projection's name: the key of its stored offset.
    pub name: String,
    /// The events it reads.
    pub query: TagQuery,
    pub(crate) batch_size: usize,
    pub(crate) fetch_size: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) max_poll_interval: Duration,
    /// Whether it wakes on the journal's notifications instead of only polling.
    pub notifications: bool,
    pub(crate) max_retries: u32,
    pub(crate) retry_backoff: (Duration, Duration),
    pub(crate) poison: PoisonPolicy,
    pub(crate) commit_every: usize,
    pub(crate) commit_interval: Duration,
}

impl ProjectionOptions {
    /// A builder for the projection `name` of the entries tagged `tag`. The name keys its
    /// stored offset (with its slices): a projection started again under the same name goes
    /// on where it stopped; under a new name it starts from the beginning.
    pub fn builder(name: impl Into<String>, tag: Tag) -> ProjectionOptionsBuilder {
        ProjectionOptionsBuilder {
            options: Self {
                name: name.into(),
                query: TagQuery::new(tag),
                batch_size: 256,
                fetch_size: 1024,
                poll_interval: Duration::from_millis(100),
                max_poll_interval: Duration::from_secs(1),
                notifications: true,
                max_retries: 3,
                retry_backoff: (Duration::from_millis(100), Duration::from_secs(10)),
                poison: PoisonPolicy::Stop,
                commit_every: 1000,
                commit_interval: Duration::from_secs(1),
            },
        }
    }

    /// The projection's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it reads: its tag and slices.
    pub fn query(&self) -> &TagQuery {
        &self.query
    }
}

/// Builds [`ProjectionOptions`]; every setting has a default.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | `slices` | all | the streams this instance follows (N instances of one name split a tag with [`Slices::split`]) |
/// | `batch_size` | 256 | events per handler call (whole entries: an entry's events never split) |
/// | `fetch_size` | 1024 | entries per read of the journal |
/// | `poll_interval` | 100 ms | the wait after a read found nothing new, doubling (with jitter) up to `max_poll_interval` |
/// | `max_poll_interval` | 1 s | the longest wait between reads of an idle tag |
/// | `notifications` | on | also read as soon as the journal says tagged entries were committed (`Journal::tag_notifications`) |
/// | `max_retries` | 3 | a failing batch is retried this often, then its entries one by one, each as often; then the [`PoisonPolicy`] decides |
/// | `retry_backoff` | 100 ms to 10 s | the wait before a retry, doubling (with jitter); also after a failure of the journal or the store |
/// | `poison` | [`PoisonPolicy::Stop`] | what to do with an entry that cannot be got past |
/// | `commit_every` | 1000 | at least once: store the offset after this many handled events… |
/// | `commit_interval` | 1 s | … or this long after the first one not yet stored (and when stopped) |
#[derive(Clone, Debug)]
pub struct ProjectionOptionsBuilder {
    options: ProjectionOptions,
}

impl ProjectionOptionsBuilder {
    /// Follow only the streams of `slices`.
    #[must_use]
    pub fn slices(mut self, slices: Slices) -> Self {
        self.options.query = self.options.query.slices(slices);
        self
    }

    /// Events per handler call.
    #[must_use]
    pub fn batch_size(mut self, events: usize) -> Self {
        self.options.batch_size = events;
        self
    }

    /// Entries per read of the journal.
    #[must_use]
    pub fn fetch_size(mut self, entries: usize) -> Self {
        self.options.fetch_size = entries;
        self
    }

    /// The first wait after a read found nothing new.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.options.poll_interval = interval;
        self
    }

    /// The longest wait between reads of an idle tag.
    #[must_use]
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.options.max_poll_interval = interval;
        self
    }

    /// Whether to read as soon as the journal says tagged entries were committed (else: poll
    /// only).
    #[must_use]
    pub fn notifications(mut self, on: bool) -> Self {
        self.options.notifications = on;
        self
    }

    /// Retries of a failing batch (and then of each of its entries alone).
    #[must_use]
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.options.max_retries = retries;
        self
    }

    /// The first and the longest wait before a retry.
    #[must_use]
    pub fn retry_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.options.retry_backoff = (first, max);
        self
    }

    /// What to do with an entry that cannot be got past.
    #[must_use]
    pub fn poison(mut self, policy: PoisonPolicy) -> Self {
        self.options.poison = policy;
        self
    }

    /// At least once: store the offset after this many handled events.
    #[must_use]
    pub fn commit_every(mut self, events: usize) -> Self {
        self.options.commit_every = events;
        self
    }

    /// At least once: store the offset at the latest this long after the first handled event
    /// not yet stored.
    #[must_use]
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.options.commit_interval = interval;
        self
    }

    /// The options, checked.
    ///
    /// # Errors
    /// [`OptionsError`] naming the setting: an empty name or one longer than
    /// [`MAX_PROJECTION_NAME`] bytes, a size or count of 0, an interval or wait of zero or
    /// beyond 365 days, a longest wait below the first.
    pub fn build(self) -> Result<ProjectionOptions, OptionsError> {
        let o = &self.options;
        if o.name.is_empty() || o.name.len() > MAX_PROJECTION_NAME {
            return Err(OptionsError::new(
                "name",
                format!(
                    "must have 1 to {MAX_PROJECTION_NAME} bytes (got {})",
                    o.name.len()
                ),
            ));
        }
        positive("batch_size", o.batch_size)?;
        positive("fetch_size", o.fetch_size)?;
        positive("commit_every", o.commit_every)?;
        duration("poll_interval", o.poll_interval)?;
        duration("max_poll_interval", o.max_poll_interval)?;
        duration("retry_backoff", o.retry_backoff.0)?;
        duration("retry_backoff", o.retry_backoff.1)?;
        duration("commit_interval", o.commit_interval)?;
        for (field, first, max) in [
            ("max_poll_interval", o.poll_interval, o.max_poll_interval),
            ("retry_backoff", o.retry_backoff.0, o.retry_backoff.1),
        ] {
            if max < first {
                return Err(OptionsError::new(
                    field,
                    format!("the longest wait ({max:?}) is below the first ({first:?})"),
                ));
            }
        }
        Ok(self.options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> ProjectionOptionsBuilder {
        ProjectionOptions::builder("balances", Tag::from_static("account"))
    }

    #[test]
    fn defaults_are_valid_and_every_invalid_setting_is_named() {
        let options = builder().build().unwrap();
        assert_eq!(options.name(), "balances");
        assert_eq!(options.query().slices, Slices::ALL);
        let field = |builder: ProjectionOptionsBuilder| builder.build().unwrap_err().field;
        assert_eq!(
            field(ProjectionOptions::builder("", Tag::from_static("t"))),
            "name"
        );
        let long = "x".repeat(MAX_PROJECTION_NAME + 1);
        assert_eq!(
            field(ProjectionOptions::builder(long, Tag::from_static("t"))),
            "name"
        );
        assert_eq!(field(builder().batch_size(0)), "batch_size");
        assert_eq!(field(builder().fetch_size(0)), "fetch_size");
        assert_eq!(field(builder().commit_every(0)), "commit_every");
        assert_eq!(
            field(builder().poll_interval(Duration::ZERO)),
            "poll_interval"
        );
        assert_eq!(
            field(builder().commit_interval(Duration::ZERO)),
            "commit_interval"
        );
        let backwards = builder().max_poll_interval(Duration::from_millis(10));
        assert_eq!(field(backwards), "max_poll_interval");
        let retry = builder().retry_backoff(Duration::from_secs(2), Duration::from_secs(1));
        let error = retry.build().unwrap_err();
        assert_eq!(error.field, "retry_backoff");
        assert!(error.reason.contains("below the first"), "{error}");
        let zero = builder().retry_backoff(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(field(zero), "retry_backoff");
        let century = Duration::from_secs(100 * 365 * 24 * 3600);
        assert_eq!(field(builder().commit_interval(century)), "commit_interval");
        assert_eq!(
            field(builder().max_poll_interval(century)),
            "max_poll_interval"
        );
    }
}
