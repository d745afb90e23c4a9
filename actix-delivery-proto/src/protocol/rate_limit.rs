//! "At most one warning per minute, with the count of what happened in between."

use std::time::{Duration, Instant};

/// How often a rate-limited warning may be written.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// Counts events of one kind and says when a warning about them may be written.
#[derive(Debug, Default)]
pub struct RateLimited {
    last_emitted: Option<Instant>,
    unreported: u64,
}

impl RateLimited {
    /// Records `events` events at `now`. Returns `Some(n)` when a warning is due, where `n` is
    /// the number of events since the previous warning (these included); `None` while the
    /// previous warning is less than [`WARNING_INTERVAL`] old.
    pub fn record(&mut self, now: Instant, events: u64) -> Option<u64> {
        self.unreported += events;
        let due = self
            .last_emitted
            .is_none_or(|last| now.saturating_duration_since(last) >= WARNING_INTERVAL);
        if !due || self.unreported == 0 {
            return None;
        }
        self.last_emitted = Some(now);
        Some(std::mem::take(&mut self.unreported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_warns_then_at_most_once_a_minute_with_the_count_in_between() {
        let t0 = Instant::now();
        let mut limiter = RateLimited::default();
        assert_eq!(limiter.record(t0, 1), Some(1));
        assert_eq!(limiter.record(t0 + Duration::from_secs(1), 1), None);
        assert_eq!(limiter.record(t0 + Duration::from_secs(30), 5), None);
        assert_eq!(limiter.record(t0 + Duration::from_millis(59_999), 1), None);
        // The warning due at one minute reports the 7 suppressed events plus this one.
        assert_eq!(limiter.record(t0 + Duration::from_secs(60), 1), Some(8));
        assert_eq!(limiter.record(t0 + Duration::from_secs(61), 1), None);
        assert_eq!(limiter.record(t0 + Duration::from_secs(200), 2), Some(3));
    }
}
