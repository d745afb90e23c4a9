//! Which "no responders" statuses on one destination's reply subject can be the server's.
//! Pure: time is passed in.
//!
//! The server answers a batch published to a subject nobody listens on with one status on
//! the batch's reply subject, at once: before anything it sends this client after processing
//! the batch. Any client may publish the same status to the inbox, and nothing in it tells
//! the two apart. So a destination counts the batches that may still be answered. A batch is
//! open from its publication until a status answers it, or until a probe that the carrier
//! published to the reply subject behind it comes back through the server: every status for
//! the batches before the probe has come by then. A status while no batch is open answers
//! nothing: another client's. Within the moment a batch is open, a status another client
//! publishes cannot be told from the server's, at most one per open batch.

use std::time::{Duration, Instant};

/// A probe not back after this long is taken as lost (the connection broke, say): the next
/// batch sends another. One that comes back later still closes the batches before it.
pub(crate) const PROBE_LOST_AFTER: Duration = Duration::from_secs(1);

/// The batches of one destination that the server may still answer, and its probe.
#[derive(Debug, Default)]
pub struct Notices {
    /// Batches published (queued for the server, in the order it sees them).
    published: u64,
    /// Batches closed: answered by a status, or published before a probe that came back.
    closed: u64,
    /// The probe in flight: the batches published before it, and when it was queued.
    probe: Option<(u64, Instant)>,
}

impl Notices {
    /// `batches` more were queued for publishing.
    pub fn published(&mut self, batches: u64) {
        self.published += batches;
    }

    /// The probe to queue now, if one is due (some batch is open, and no probe is in flight
    /// or the one in flight is lost): the number of batches before it, which it carries.
    pub fn probe_due(&self, now: Instant) -> Option<u64> {
        let lost = |&(_, queued): &(u64, Instant)| now.duration_since(queued) >= PROBE_LOST_AFTER;
        let due = self.published > self.closed && self.probe.as_ref().is_none_or(lost);
        due.then_some(self.published)
    }

    /// The probe carrying `before` (from [`probe_due`](Self::probe_due)) was queued.
    pub fn probe_queued(&mut self, before: u64, now: Instant) {
        self.probe = Some((before, now));
    }

    /// A probe carrying `before` came back: those batches cannot be answered any more.
    pub fn probe_back(&mut self, before: u64) {
        self.closed = self.closed.max(before);
        if self.probe.is_some_and(|(in_flight, _)| in_flight == before) {
            self.probe = None;
        }
    }

    /// A "no responders" status arrived: whether it can be the server's (it then answers an
    /// open batch, which it closes).
    pub fn status(&mut self) -> bool {
        let open = self.published > self.closed;
        self.closed += u64::from(open);
        open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_counts_as_the_servers_only_while_a_batch_is_open() {
        let now = Instant::now();
        let mut notices = Notices::default();
        assert!(!notices.status(), "nothing published");
        assert_eq!(notices.probe_due(now), None);
        notices.published(3);
        assert_eq!(notices.probe_due(now), Some(3));
        notices.probe_queued(3, now);
        assert_eq!(notices.probe_due(now), None, "one probe in flight");
        // One of the three batches found nobody: the server's status comes before the probe.
        assert!(notices.status());
        notices.published(2);
        notices.probe_back(3);
        // The other two of the first three were delivered: the next two statuses answer the
        // two batches published after the probe, and any more answer nothing.
        assert!(notices.status());
        assert!(notices.status());
        assert!(!notices.status());
        assert!(!notices.status());
        assert_eq!(notices.probe_due(now), None, "nothing open");
    }

    #[test]
    fn statuses_after_the_probe_came_back_answer_nothing() {
        let now = Instant::now();
        let mut notices = Notices::default();
        for _ in 0..20 {
            notices.published(1);
            if let Some(before) = notices.probe_due(now) {
                notices.probe_queued(before, now);
                notices.probe_back(before);
            }
        }
        assert!((0..20).all(|_| !notices.status()));
    }

    #[test]
    fn a_lost_probe_is_replaced_and_a_late_one_still_closes_what_came_before_it() {
        let start = Instant::now();
        let mut notices = Notices::default();
        notices.published(2);
        notices.probe_queued(2, start);
        notices.published(1);
        assert_eq!(notices.probe_due(start + PROBE_LOST_AFTER / 2), None);
        let later = start + PROBE_LOST_AFTER;
        assert_eq!(
            notices.probe_due(later),
            Some(3),
            "the first is taken as lost"
        );
        notices.probe_queued(3, later);
        // The first comes back after all: it closes its two, and the second stays in flight.
        notices.probe_back(2);
        assert_eq!(notices.probe_due(later), None);
        assert!(notices.status(), "the third batch is open");
        assert!(!notices.status());
        notices.probe_back(3);
        assert_eq!(notices.probe_due(later), None);
    }
}
