//! The receiver's record of processed deliveries, kept as part of a persistent entity's state:
//! the protocol's dedup windows, keyed by the public incarnation id and changed only by marks
//! that were journaled (so recovery rebuilds exactly the record the entity had).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::protocol::dedup::{DedupTable, WindowRecord};
use crate::protocol::envelope::{DeliveryInfo, IncarnationId, ProducerId};

/// The processed mark of one delivery, stored in the same journal entry as the events of the
/// command it carried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// The producer.
    pub producer_id: ProducerId,
    /// The public id of its incarnation.
    pub incarnation: IncarnationId,
    /// The delivery's seq.
    pub seq: u64,
    /// The delivery's window start: seqs below it were settled at the producer.
    pub window_start: u64,
    /// Of a chunked message: the seq of its first chunk; the mark covers every seq from it
    /// through `seq` (see [`DeliveryInfo::first_seq`]).
    pub first_seq: Option<u64>,
}

impl Mark {
    /// The first seq the mark covers: `first_seq`, or `seq` alone.
    pub fn first(&self) -> u64 {
        self.first_seq.unwrap_or(self.seq)
    }
}

impl From<&DeliveryInfo> for Mark {
    fn from(info: &DeliveryInfo) -> Self {
        Self {
            producer_id: info.producer_id.clone(),
            incarnation: info.incarnation,
            seq: info.seq,
            window_start: info.window_start,
            first_seq: info.first_seq,
        }
    }
}

/// What the record says about a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not processed: decide.
    New,
    /// Processed (its mark is recorded): answer "already processed" without deciding.
    Duplicate,
    /// Declared settled by its producer without a recorded mark: refuse it (it must not run,
    /// and must not be confirmed as processed either).
    Stale,
    /// With must-follow: its predecessor was not processed; this seq is the one expected.
    OutOfOrder {
        /// The seq that must come first.
        expected: u64,
    },
}

/// The processed deliveries of one persistent entity: per producer incarnation the contiguous
/// mark and the seqs above it, for at most `max_producers` producer ids (the least recently
/// *recorded* one is dropped beyond).
#[derive(Debug)]
pub struct DeliveryRecord {
    table: DedupTable<IncarnationId>,
    /// The record ignores time (no idle sweep): one fixed instant for the table.
    epoch: Instant,
}

impl DeliveryRecord {
    /// An empty record for at most `max_producers` producer ids. `epoch` is the one instant
    /// its table is given (it ignores time; the shell that makes the record reads the clock).
    ///
    /// # Panics
    /// If `max_producers` is 0 (options validation rejects it).
    pub fn new(max_producers: usize, epoch: Instant) -> Self {
        Self {
            table: DedupTable::new(Some(max_producers), None),
            epoch,
        }
    }

    /// Whether `info`'s delivery was processed, is stale, or is new. With `follows`
    /// (must-follow: the seq of the producer's delivery that must come first, 0 for none), a
    /// new one whose predecessor was neither processed nor settled by the producer (given up:
    /// its `window_start` moved past it) is out of order. A chunked message is judged by its
    /// seqs: processed by its last, stale by its first. Changes nothing.
    pub fn seen(&self, info: &DeliveryInfo, follows: Option<u64>) -> Seen {
        let first = *info.seqs().start();
        let window = self.table.peek(info.producer_id.as_str(), info.incarnation);
        if let Some(window) = window {
            if window.is_handled(info.seq) {
                return Seen::Duplicate;
            }
            if window.is_stale(first) {
                return Seen::Stale;
            }
        }
        if let Some(previous) = follows {
            let settled = window
                .map_or(0, |w| w.contiguous())
                .max(info.window_start.saturating_sub(1));
            let processed = previous <= settled || window.is_some_and(|w| w.is_handled(previous));
            if !processed {
                return Seen::OutOfOrder { expected: previous };
            }
        }
        Seen::New
    }

    /// Records a mark (of a decided command, or of a replayed journal entry): every seq it
    /// covers, so that the record's `contiguous` mark passes a chunked message's seqs.
    pub fn record(&mut self, mark: &Mark) {
        let (window, _, _) = self.table.window_for(
            &mark.producer_id,
            mark.incarnation,
            mark.window_start,
            self.epoch,
        );
        window.complete_range(mark.first(), mark.seq);
    }

    /// The instant its table was given when the record was made.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// The record's content, for a snapshot.
    pub fn to_records(&self) -> Vec<WindowRecord<IncarnationId>> {
        self.table.records()
    }

    /// A record rebuilt from a snapshot's content.
    pub fn from_records(
        max_producers: usize,
        records: Vec<WindowRecord<IncarnationId>>,
        epoch: Instant,
    ) -> Self {
        let mut record = Self::new(max_producers, epoch);
        record.table.restore(records, record.epoch);
        record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl DeliveryRecord {
        fn seen_now(&self, info: &DeliveryInfo) -> Seen {
            self.seen(info, None)
        }
    }

    #[test]
    fn with_must_follow_only_the_successor_of_what_was_processed_or_settled_is_new() {
        let mut record = DeliveryRecord::new(8, Instant::now());
        let follow = |record: &DeliveryRecord, seq: u64, window_start| {
            record.seen(&info("p", 1, seq, window_start), Some(seq - 1))
        };
        assert_eq!(follow(&record, 1, 1), Seen::New);
        assert_eq!(follow(&record, 2, 1), Seen::OutOfOrder { expected: 1 });
        record.record(&Mark::from(&info("p", 1, 1, 1)));
        assert_eq!(follow(&record, 3, 1), Seen::OutOfOrder { expected: 2 });
        assert_eq!(follow(&record, 2, 1), Seen::New);
        // The producer gave 2..=4 up: its window start says so, 5 follows.
        assert_eq!(
            follow(&record, 5, 5),
            Seen::New,
            "no deadlock on a given-up seq"
        );
        assert_eq!(follow(&record, 1, 1), Seen::Duplicate);
    }

    #[test]
    fn with_an_explicit_predecessor_a_delivery_follows_that_seq_not_seq_minus_one() {
        // One producer's deliveries to this entity are seqs 3, 7 and 8 of its stream (the
        // others went elsewhere): 7 follows 3, 8 follows 7, 3 follows none (0).
        let mut record = DeliveryRecord::new(8, Instant::now());
        let seen = |record: &DeliveryRecord, seq, previous| {
            record.seen(&info("p", 1, seq, 1), Some(previous))
        };
        assert_eq!(seen(&record, 7, 3), Seen::OutOfOrder { expected: 3 });
        assert_eq!(seen(&record, 3, 0), Seen::New, "no predecessor");
        record.record(&Mark::from(&info("p", 1, 3, 1)));
        assert_eq!(
            seen(&record, 7, 3),
            Seen::New,
            "3 processed, above contiguous"
        );
        assert_eq!(seen(&record, 8, 7), Seen::OutOfOrder { expected: 7 });
        // 7 was given up: the producer's window start moved past it.
        assert_eq!(
            record.seen(&info("p", 1, 8, 8), Some(7)),
            Seen::New,
            "settled at the producer"
        );
    }

    fn info(id: &str, incarnation: u128, seq: u64, window_start: u64) -> DeliveryInfo {
        DeliveryInfo {
            producer_id: ProducerId::from(id),
            incarnation: IncarnationId::from_u128(incarnation),
            seq,
            window_start,
            trace_context: None,
            first_seq: None,
        }
    }

    #[test]
    fn recorded_marks_are_duplicates_others_new_and_below_the_window_stale() {
        let mut record = DeliveryRecord::new(8, Instant::now());
        assert_eq!(record.seen_now(&info("p", 1, 1, 1)), Seen::New);
        record.record(&Mark::from(&info("p", 1, 1, 1)));
        record.record(&Mark::from(&info("p", 1, 3, 1)));
        assert_eq!(record.seen_now(&info("p", 1, 1, 1)), Seen::Duplicate);
        assert_eq!(record.seen_now(&info("p", 1, 3, 2)), Seen::Duplicate);
        assert_eq!(record.seen_now(&info("p", 1, 2, 2)), Seen::New);
        assert_eq!(
            record.seen_now(&info("p", 2, 1, 1)),
            Seen::New,
            "another incarnation"
        );
        // The producer gave 2..=9 up: its mark of 10 says so.
        record.record(&Mark::from(&info("p", 1, 10, 10)));
        assert_eq!(
            record.seen_now(&info("p", 1, 2, 2)),
            Seen::Stale,
            "never confirmed unrun"
        );
        assert_eq!(record.seen_now(&info("p", 1, 10, 2)), Seen::Duplicate);
        assert_eq!(record.seen_now(&info("p", 1, 11, 10)), Seen::New);
    }

    #[test]
    fn a_chunked_messages_mark_covers_its_range_and_it_is_judged_by_its_seqs() {
        let mut record = DeliveryRecord::new(8, Instant::now());
        let chunked = |first, last, window_start| DeliveryInfo {
            first_seq: Some(first),
            ..info("p", 1, last, window_start)
        };
        assert_eq!(record.seen(&chunked(1, 4, 1), Some(0)), Seen::New);
        assert_eq!(
            record.seen(&chunked(5, 7, 1), Some(4)),
            Seen::OutOfOrder { expected: 4 },
            "must follow: its first seq follows the previous message's last"
        );
        record.record(&Mark::from(&chunked(1, 4, 1)));
        assert_eq!(record.seen(&chunked(5, 7, 1), Some(4)), Seen::New);
        assert_eq!(record.seen(&chunked(1, 4, 1), None), Seen::Duplicate);
        record.record(&Mark::from(&chunked(5, 7, 1)));
        let window = record.table.peek("p", IncarnationId::from_u128(1)).unwrap();
        assert_eq!((window.contiguous(), window.out_of_order()), (7, 0));
        // The producer settled 8..=9 (given up): a chunked message of them is stale.
        record.record(&Mark::from(&info("p", 1, 10, 10)));
        assert_eq!(record.seen(&chunked(8, 9, 8), None), Seen::Stale);
    }

    #[test]
    fn seeing_does_not_change_the_record_and_its_snapshot_restores_it() {
        let mut record = DeliveryRecord::new(2, Instant::now());
        record.record(&Mark::from(&info("a", 1, 1, 1)));
        record.record(&Mark::from(&info("b", 1, 1, 1)));
        // A duplicate of a's does not make a the most recent: c evicts a.
        assert_eq!(record.seen_now(&info("a", 1, 1, 1)), Seen::Duplicate);
        let restored = DeliveryRecord::from_records(2, record.to_records(), Instant::now());
        for mut r in [record, restored] {
            r.record(&Mark::from(&info("c", 1, 1, 1)));
            assert_eq!(r.seen_now(&info("a", 1, 1, 1)), Seen::New, "evicted");
            assert_eq!(r.seen_now(&info("b", 1, 1, 1)), Seen::Duplicate);
            assert_eq!(r.table.len(), 2);
        }
    }
}
