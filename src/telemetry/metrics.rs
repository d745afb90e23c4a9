//! Every counter of every stats struct, and latency and size histograms, through the
//! [`metrics`] facade (feature `metrics`). Without the feature none of this is compiled in.
//!
//! Install a recorder (an exporter, say `metrics-exporter-prometheus`) **before** starting
//! producers, consumers, journals, nodes and carriers: each registers its metrics once, when it
//! is created (a `MemoryJournal`: at its first append), with its labels fixed, and publishes to
//! those handles afterwards (a part created with no recorder installed publishes to nothing).
//!
//! The stats structs stay the source of truth: each part publishes what its struct counted,
//! as it changes (once per mailbox drain, journal commit, socket write or received frame), so
//! a counter here equals the struct's field once the part is idle. Producers and consumers,
//! whose drains come once per message at low windows, publish at most every 10 ms, and 10 ms
//! after their last change at the latest (their own timer), so that a burst costs the same few
//! publishes whatever its rate; they also publish when asked for their stats, a producer when its
//! `idle()` answers, and both when they stop. Counters are published as
//! increments and gauges as changes, so that parts sharing a label add up; a part that ends
//! takes its gauges' contributions back.
//!
//! # Labels
//!
//! Only names the application chose, never anything a peer sends (ids, seqs):
//!
//! | label | on | value |
//! |---|---|---|
//! | `producer` | `actix_delivery_producer_*` | `ProducerOptionsBuilder::metrics_label`; else the producer's fixed `producer_id` (a durable producer always has one); else `"default"`. A work-pulling producer's worker streams add up under its label (never a worker's name); a sharded producer's entity streams have their own series (`actix_delivery_sharded_producer_*`, below), never one per entity |
//! | `consumer` | `actix_delivery_consumer_*` | `ConsumerOptionsBuilder::name`, else `"default"` |
//! | `entity` | `actix_delivery_persistent_*` | `PersistentConfig::metrics_label`; else, for an `EntityHostHandle`'s entities, its entity type; else `"default"` (one per kind of entity, never per stream; a durable producer's log exports nothing here: its producer's series say what it holds) |
//! | `journal` | `actix_delivery_sqlite_*`, `actix_delivery_postgres_*`, `actix_delivery_memory_journal_*` | `SqliteOptionsBuilder::metrics_label` / `PostgresOptionsBuilder::metrics_label`, else `"default"` (a `MemoryJournal`: always `"default"`) |
//! | `node` | `actix_delivery_node_*` | `NodeOptionsBuilder::metrics_label`, else `"default"` |
//! | `carrier` | `actix_delivery_nats_*` | `NatsOptionsBuilder::metrics_label`, else `"default"` |
//! | `projection` | `actix_delivery_projection_*` | the projection's name (`ProjectionOptions::builder`), followed by `/<first>-<last>` for an instance of some slices only |
//!
//! Parts of one kind that share a label value add up (counters and gauges alike).
//!
//! # Names
//!
//! Each counter `…_total` is the stats field of the same name (see the struct's docs for its
//! exact meaning); gauges are the struct's current values.
//!
//! The two per-message histograms (confirm latency, handler run time) are **sampled**, at
//! most one value every 10 ms per producer or consumer, so that their cost stays flat at
//! millions of messages a second: a histogram's `_count` counts samples, not messages (the
//! counters count messages).
//!
//! **Producer** ([`ProducerStats`](crate::protocol::producer::ProducerStats)), label `producer`;
//! a producer exports only what applies to it (the rows marked durable only when it is
//! durable, `chunk_rounds` only with `chunk_size`):
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `actix_delivery_producer_sent_total` | counter | `sent`: first transmissions |
//! | `actix_delivery_producer_retransmitted_total` | counter | `retransmitted` |
//! | `actix_delivery_producer_confirmed_total` | counter | `confirmed`: messages ACKed |
//! | `actix_delivery_producer_ignored_acks_total` | counter | `ignored_acks` |
//! | `actix_delivery_producer_given_up_total` | counter | `given_up` (after `max_attempts`, or by a work-pulling pool) |
//! | `actix_delivery_producer_refused_total` | counter | `refused`: the pending queue was full |
//! | `actix_delivery_producer_timed_out_total` | counter | `timed_out`: `send_timeout` / `store_timeout` got no room in time |
//! | `actix_delivery_producer_stored_total` | counter | `stored` (durable producers) |
//! | `actix_delivery_producer_resumed_total` | counter | `resumed` (durable producers) |
//! | `actix_delivery_producer_resumed_confirmed_total` | counter | `resumed_confirmed` (durable producers) |
//! | `actix_delivery_producer_chunk_rounds_total` | counter | `chunk_rounds`: chunked messages sent again whole (`chunk_size`) |
//! | `actix_delivery_producer_partially_stored_total` | counter | `partially_stored`: chunked messages found partly stored at an opening, dropped (durable producers) |
//! | `actix_delivery_producer_takeovers_total` | counter | `takeovers`: openings that took the stream over from an earlier one (durable producers) |
//! | `actix_delivery_producer_in_flight` | gauge | `in_flight`: sent, not ACKed |
//! | `actix_delivery_producer_queued` | gauge | `queued`: waiting for the window |
//! | `actix_delivery_producer_unconfirmed` | gauge | `unconfirmed`: stored in a durable stream, not settled (durable producers) |
//! | `actix_delivery_producer_next_message_id` | gauge | `next_message_id` (durable producers) |
//! | `actix_delivery_producer_confirm_seconds` | histogram | from the producer taking a message (from a handle, or a `Tell`) to its `Ok` confirmation; sampled: the first message of a batch the producer takes from its handles, at most one per 10 ms of the times messages were taken (a work-pulling producer's worker streams add no samples: its own say when a worker confirmed a job) |
//!
//! **Consumer** ([`ConsumerStats`](crate::protocol::consumer::ConsumerStats)), label `consumer`:
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `actix_delivery_consumer_delivered_total` | counter | `delivered`: handler succeeded |
//! | `actix_delivery_consumer_duplicates_total` | counter | `duplicates`: re-ACKed without a run |
//! | `actix_delivery_consumer_in_progress_total` | counter | `in_progress` |
//! | `actix_delivery_consumer_stale_total` | counter | `stale` |
//! | `actix_delivery_consumer_dead_letters_total` | counter | `dead_letters` |
//! | `actix_delivery_consumer_refused_total` | counter | `refused` |
//! | `actix_delivery_consumer_handler_failures_total` | counter | `handler_failures` |
//! | `actix_delivery_consumer_handler_panics_total` | counter | `handler_panics` |
//! | `actix_delivery_consumer_handler_timeouts_total` | counter | `handler_timeouts` |
//! | `actix_delivery_consumer_evictions_total` | counter | `evictions` |
//! | `actix_delivery_consumer_swept_total` | counter | `swept` |
//! | `actix_delivery_consumer_replaced_incarnations_total` | counter | `replaced_incarnations` |
//! | `actix_delivery_consumer_shared_id_messages_total` | counter | `shared_id_messages` |
//! | `actix_delivery_consumer_assembled_total` | counter | `assembled`: chunked messages reassembled |
//! | `actix_delivery_consumer_chunks_refused_total` | counter | `chunks_refused`: chunks refused by the reassembly bounds |
//! | `actix_delivery_consumer_partial_messages_dropped_total` | counter | `partial_messages_dropped` |
//! | `actix_delivery_consumer_tracked_producers` | gauge | `tracked_producers` |
//! | `actix_delivery_consumer_tracked_incarnations` | gauge | `tracked_incarnations` |
//! | `actix_delivery_consumer_waiting` | gauge | `waiting` |
//! | `actix_delivery_consumer_deferred` | gauge | `deferred` |
//! | `actix_delivery_consumer_partial_messages` | gauge | `partial_messages`: being reassembled |
//! | `actix_delivery_consumer_messages_waiting_for_room` | gauge | `messages_waiting_for_room`: chunked messages refused for room, in line |
//! | `actix_delivery_consumer_reassembly_bytes` | gauge | `reassembly_bytes`: reserved for reassembly |
//! | `actix_delivery_consumer_handler_seconds` | histogram | one handler run, start to outcome (a pipelined handler: to its hand-off); abandoned runs are not recorded; sampled: the first run that ends in each 10 ms |
//!
//! **Persistent entity** ([`PersistentStats`](crate::persistence::PersistentStats)), label
//! `entity`: `actix_delivery_persistent_{decided, events, entries, appends, duplicates, stale,
//! rejected, conflicts, catch_ups, recoveries, snapshots, snapshot_failures, refused,
//! overloaded}_total`, all counters, each the field of that name.
//!
//! **SQLite journal** (`SqliteStats`, feature `sqlite`), label `journal`:
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `actix_delivery_sqlite_appends_total` | counter | `appends` committed |
//! | `actix_delivery_sqlite_events_total` | counter | `events` committed |
//! | `actix_delivery_sqlite_transactions_total` | counter | `transactions` (each one fsync) |
//! | `actix_delivery_sqlite_rejected_total` | counter | `rejected` writes |
//! | `actix_delivery_sqlite_folds_total` | counter | `folds` |
//! | `actix_delivery_sqlite_queued` | gauge | `queued` writes |
//! | `actix_delivery_sqlite_commit_seconds` | histogram | one committed writer transaction, begin to commit |
//! | `actix_delivery_sqlite_commit_writes` | histogram | writes (appends, snapshots, deletions) in one committed transaction: the group size |
//!
//! **PostgreSQL journal** ([`PostgresStats`](crate::journal::PostgresStats), feature
//! `postgres`), label `journal`: `actix_delivery_postgres_{appends, events, transactions,
//! rejected, reconnects}_total` (counters), `actix_delivery_postgres_queued` (gauge),
//! `actix_delivery_postgres_commit_seconds` and `actix_delivery_postgres_commit_writes`
//! (histograms, as for SQLite).
//!
//! **Memory journal** ([`MemoryStats`](crate::journal::MemoryStats)), label `journal`:
//! `actix_delivery_memory_journal_{appends, commits, events}_total` (counters).
//!
//! **TCP node** ([`NodeStats`](crate::tcp::NodeStats)), label `node`: one counter
//! `actix_delivery_node_<field>_total` for each counter field: `connections_opened`,
//! `connections_accepted`, `connect_failures`, `resolve_failures`, `handshake_failures`,
//! `tls_failures`, `handshakes_timed_out`, `handshakes_evicted`, `version_refusals`,
//! `connections_refused`, `idle_timeouts`, `frames_in`, `frames_out`, `decode_failures`,
//! `deliveries_out`, `deliveries_in`, `undecodable_bodies`, `acks_out`, `acks_in`,
//! `unknown_consumer`, `unauthorized_deliveries`, `unroutable_acks`, `acks_dropped_busy`,
//! `deliveries_dropped_full`, `acks_dropped_full`, `deliveries_waited`,
//! `deliveries_dropped_disconnected`, `acks_dropped_disconnected`, `deliveries_unsendable`,
//! `chunks_held_for_version`, `bodies_encoded`; and
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `actix_delivery_node_connections_open` | gauge | `connections_open`, both ways |
//! | `actix_delivery_node_output_high_water_bytes` | gauge | `output_high_water` |
//! | `actix_delivery_node_write_frames` | histogram | frames in one socket write (a batch the writer took) |
//! | `actix_delivery_node_write_bytes` | histogram | bytes in one socket write |
//!
//! **NATS carrier** ([`NatsStats`](crate::nats::NatsStats), feature `nats`), label `carrier`:
//! one counter `actix_delivery_nats_<field>_total` for each counter field: `frames_in`,
//! `frames_out`, `decode_failures`, `version_refusals`, `deliveries_out`, `deliveries_in`,
//! `undecodable_bodies`, `deliveries_without_reply`, `foreign_reply_subjects`,
//! `deliveries_dropped_busy`, `no_responders`, `forged_no_responders`, `acks_out`, `acks_in`,
//! `unroutable_acks`, `acks_dropped_busy`, `deliveries_dropped_full`, `acks_dropped_full`,
//! `deliveries_unsendable`, `chunks_held_for_version`, `publish_failures`, `bodies_encoded`;
//! and the gauge
//! `actix_delivery_nats_output_high_water_bytes`.
//!
//! **Projection** ([`ProjectionStats`](crate::projection::ProjectionStats)), label `projection`:
//! `actix_delivery_projection_{events, entries, batches, retries, skipped, offsets_saved,
//! read_failures, store_failures, conflicts}_total` (counters, each the field of that name) and the
//! gauge `actix_delivery_projection_lag_milliseconds` (`lag_ms`: for the last batch, from its
//! newest entry's commit to the handler's success).
//!
//! The current values `routes` and `cached_bodies` of nodes and carriers are summed over
//! their connections only when `stats()` is called, and are not exported.
//!
//! **Entity host** ([`HostStats`](crate::sharding::HostStats)), label `entity_type` (the
//! type's name, from its options), published once a second: one counter
//! `actix_delivery_entity_host_<field>_total` for each counter field: `activations`,
//! `passivated_idle`, `passivated_over_limit`, `stopped_shard_left`, `stopped_unasked`,
//! `routed`, `waited`, `waited_for_room`, `refused_full`, `refused_not_hosted`,
//! `already_processed`, `refused_malformed`, `refused_foreign`, `refused_shard_count`; and the
//! gauges `actix_delivery_entity_host_{active, stopping, held, peak_active}`.
//!
//! **Shard coordinator** ([`CoordinatorStats`](crate::sharding::CoordinatorStats)), label
//! `entity_type`, published after each round: `actix_delivery_shard_coordinator_{rounds,
//! acquired, renewals, renew_failures, lost, handoffs_started, handoffs,
//! expose_failures}_total` (counters) and `actix_delivery_shard_coordinator_{shards_owned,
//! members}` (gauges).
//!
//! **Sharded producer's entity streams** ([`LaneStats`](crate::sharding::LaneStats)), label
//! `producer` (its fixed `producer_id`, else `"default"`): one set of series per sharded
//! producer, whatever the number of entities (per-entity detail is not exported), published
//! after each mailbox drain of its router: `actix_delivery_sharded_producer_{opened, closed,
//! evicted, waited, routed, settled, retransmitted, ignored_acks}_total` (counters) and
//! `actix_delivery_sharded_producer_{lanes, in_flight, waiting}` (gauges).
//!
//! Each meter is declared beside the stats it exports (`metrics.rs` of the subsystem's folder,
//! with `meter!`); this module keeps the catalogue above and the helpers, and imports
//! nothing of the subsystems (telemetry is a leaf).

use std::time::{Duration, Instant};

use metrics::Histogram;

/// Declares a meter: the metric handles of one stats struct, registered once with a fixed
/// label, and `publish`, which hands them what changed since the last call.
macro_rules! meter {
    (
        $(#[$doc:meta])*
        $meter:ident($stats:ty, $label:literal) {
            $(counter $c:ident: $cname:literal,)*
            $(gauge $g:ident: $gname:literal,)*
            $(histogram $h:ident: $hname:literal,)*
        }
    ) => {
        $(#[$doc])*
        pub(crate) struct $meter {
            last: $stats,
            $($c: ::metrics::Counter,)*
            $($g: ::metrics::Gauge,)*
            $(pub(crate) $h: ::metrics::Histogram,)*
        }

        impl $meter {
            /// Registers the metrics, labelled `label`, with the recorder installed now.
            pub(crate) fn new(label: &str) -> Self {
                Self {
                    last: <$stats>::default(),
                    $($c: ::metrics::counter!($cname, $label => label.to_owned()),)*
                    $($g: ::metrics::gauge!($gname, $label => label.to_owned()),)*
                    $($h: ::metrics::histogram!($hname, $label => label.to_owned()),)*
                }
            }

            /// Publishes what changed since the last call.
            #[allow(clippy::cast_precision_loss, clippy::unnecessary_cast)]
            pub(crate) fn publish(&mut self, stats: &$stats) {
                $(if stats.$c > self.last.$c {
                    self.$c.increment((stats.$c - self.last.$c) as u64);
                })*
                $(if stats.$g != self.last.$g {
                    self.$g.increment(stats.$g as f64 - self.last.$g as f64);
                })*
                self.last = *stats;
            }

            /// The part's stats start again from zero (its core was replaced, as under a
            /// supervised restart): its counters count on from there; its gauges keep their
            /// baseline.
            #[allow(dead_code)] // restarts replace the stats of some parts only
            pub(crate) fn restarted(&mut self) {
                $(self.last.$c = Default::default();)*
            }
        }

        impl Drop for $meter {
            #[allow(clippy::cast_precision_loss, clippy::unnecessary_cast)]
            fn drop(&mut self) {
                // A part that ends no longer holds what its gauges said.
                $(self.$g.decrement(self.last.$g as f64);)*
            }
        }

        impl std::fmt::Debug for $meter {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($meter)).finish_non_exhaustive()
            }
        }
    };
}

pub(crate) use meter;

/// The label a part gets when the application gave it none.
pub(crate) const DEFAULT_LABEL: &str = "default";

/// How often, at most, a producer or consumer publishes its counters and gauges and samples a
/// latency: every 10 ms, so that what the metrics cost does not grow with the message rate (and
/// a busy part's timer wakes it at most 100 times a second for them). A scrape comes every few
/// seconds: 10 ms of lag is not seen, and 100 samples a second make a histogram.
pub(crate) const PUBLISH_INTERVAL: Duration = Duration::from_millis(10);

/// Paces something done for the metrics to at most once per [`PUBLISH_INTERVAL`].
#[derive(Debug, Default)]
pub(crate) struct Pace {
    /// When it may be done again; `None` before the first time.
    next: Option<Instant>,
}

impl Pace {
    /// Whether it may be done at `now`.
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    /// It was done at `now`: the next time is one interval later.
    pub(crate) fn done(&mut self, now: Instant) {
        self.next = Some(now + PUBLISH_INTERVAL);
    }
}

/// A part's publishing, paced to once per [`PUBLISH_INTERVAL`], and owed once more after its
/// last change: the part arms its timer for [`owed`](Self::owed), so that one that falls quiet
/// still publishes its last state (its own timer: a timer of its own would be polled at every
/// wake-up of the actor).
#[derive(Debug, Default)]
pub(crate) struct PublishPace {
    pace: Pace,
    /// Something changed since the last publish.
    changed: bool,
}

impl PublishPace {
    /// Something happened that may have changed the part's stats.
    pub(crate) fn changed(&mut self) {
        self.changed = true;
    }

    /// Whether to publish at `now` (a time the caller read already): something changed and
    /// the interval is over. A change not published yet is owed.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if !self.changed || !self.pace.is_due(now) {
            return false;
        }
        self.pace.done(now);
        self.changed = false;
        true
    }

    /// When the owed publish is due, if one is.
    pub(crate) fn owed(&self) -> Option<Instant> {
        self.pace.next.filter(|_| self.changed)
    }
}

/// Records a duration in seconds.
pub(crate) fn record_seconds(histogram: &Histogram, duration: Duration) {
    histogram.record(duration.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_allows_once_per_interval() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert!(pace.is_due(start), "the first time is always due");
        pace.done(start);
        assert!(!pace.is_due(start));
        assert!(!pace.is_due(start + PUBLISH_INTERVAL - Duration::from_nanos(1)));
        assert!(pace.is_due(start + PUBLISH_INTERVAL));
    }

    #[test]
    fn publishing_is_paced_and_owes_the_last_change() {
        let start = Instant::now();
        let quarter = PUBLISH_INTERVAL / 4;
        let mut pace = PublishPace::default();
        assert!(!pace.due(start), "nothing changed: nothing to publish");
        pace.changed();
        assert!(pace.due(start));
        assert_eq!(pace.owed(), None, "published: nothing owed");
        // Changes within the interval: none publishes, one is owed when the interval ends.
        pace.changed();
        assert!(!pace.due(start + quarter));
        pace.changed();
        assert!(!pace.due(start + 2 * quarter));
        assert_eq!(pace.owed(), Some(start + PUBLISH_INTERVAL));
        // The owed publish comes (the part's timer): it is due, nothing is owed after it.
        assert!(pace.due(start + PUBLISH_INTERVAL));
        assert_eq!(pace.owed(), None);
        // Wake-ups without a change owe nothing: a quiet part's timer stops.
        assert!(!pace.due(start + PUBLISH_INTERVAL + quarter));
        assert!(!pace.due(start + 5 * PUBLISH_INTERVAL));
        assert_eq!(pace.owed(), None);
    }
}
