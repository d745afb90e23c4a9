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
//! a counter here equals the struct's field once the part is idle. Counters are published as
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
//! | `entity` | `actix_delivery_persistent_*` | `PersistentConfig::metrics_label`; else, for an `EntityHost`'s entities, its entity type; else `"default"` (one per kind of entity, never per stream; a durable producer's log exports nothing here: its producer's series say what it holds) |
//! | `journal` | `actix_delivery_sqlite_*`, `actix_delivery_postgres_*`, `actix_delivery_memory_journal_*` | `SqliteOptions::metrics_label` / `PostgresOptions::metrics_label`, else `"default"` (a `MemoryJournal`: always `"default"`) |
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
//! The two per-message histograms (confirm latency, handler run time) are **sampled**, one
//! value per batch, so that their cost stays flat at millions of messages a second: a
//! histogram's `_count` counts samples, not messages (the counters count messages).
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
//! | `actix_delivery_producer_confirm_seconds` | histogram | from the producer taking a message (from a handle, or a `Tell`) to its `Ok` confirmation; sampled: the first message of each batch the producer takes from its handles, at most one per batch of confirmations (every message when they come one at a time) |
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
//! | `actix_delivery_consumer_handler_seconds` | histogram | one handler run, start to outcome (a pipelined handler: to its hand-off); abandoned runs are not recorded; sampled: the first run that ends in each mailbox drain |
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
//! **TCP node** ([`NodeStats`](crate::remote::NodeStats)), label `node`: one counter
//! `actix_delivery_node_<field>_total` for each counter field: `connections_opened`,
//! `connections_accepted`, `connect_failures`, `resolve_failures`, `handshake_failures`,
//! `tls_failures`, `handshakes_timed_out`, `handshakes_evicted`, `version_refusals`,
//! `connections_refused`, `idle_timeouts`, `frames_in`, `frames_out`, `decode_failures`,
//! `deliveries_out`, `deliveries_in`, `undecodable_bodies`, `acks_out`, `acks_in`,
//! `unknown_consumer`, `unauthorized_deliveries`, `unroutable_acks`, `acks_dropped_busy`,
//! `deliveries_dropped_full`, `acks_dropped_full`, `deliveries_waited`,
//! `deliveries_dropped_disconnected`, `acks_dropped_disconnected`, `deliveries_unsendable`,
//! `bodies_encoded`; and
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
//! `deliveries_unsendable`, `publish_failures`, `bodies_encoded`; and the gauge
//! `actix_delivery_nats_output_high_water_bytes`.
//!
//! **Projection** ([`ProjectionStats`](crate::projection::ProjectionStats)), label
//! `projection`: `actix_delivery_projection_{events, entries, batches, retries, skipped,
//! offsets_saved, read_failures, store_failures, conflicts}_total` (counters, each the field of that
//! name) and the gauge `actix_delivery_projection_lag_milliseconds` (`lag_ms`: for the last
//! batch, from its newest entry's commit to the handler's success).
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

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

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
            $($c: Counter,)*
            $($g: Gauge,)*
            $(pub(crate) $h: Histogram,)*
        }

        impl $meter {
            /// Registers the metrics, labelled `label`, with the recorder installed now.
            pub(crate) fn new(label: &str) -> Self {
                Self {
                    last: <$stats>::default(),
                    $($c: metrics::counter!($cname, $label => label.to_owned()),)*
                    $($g: metrics::gauge!($gname, $label => label.to_owned()),)*
                    $($h: metrics::histogram!($hname, $label => label.to_owned()),)*
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

meter! {
    /// A producer's metrics.
    ProducerMeter(crate::protocol::producer::ProducerStats, "producer") {
        counter sent: "actix_delivery_producer_sent_total",
        counter retransmitted: "actix_delivery_producer_retransmitted_total",
        counter confirmed: "actix_delivery_producer_confirmed_total",
        counter ignored_acks: "actix_delivery_producer_ignored_acks_total",
        counter given_up: "actix_delivery_producer_given_up_total",
        counter refused: "actix_delivery_producer_refused_total",
        counter timed_out: "actix_delivery_producer_timed_out_total",
        gauge in_flight: "actix_delivery_producer_in_flight",
        gauge queued: "actix_delivery_producer_queued",
        histogram confirm_seconds: "actix_delivery_producer_confirm_seconds",
    }
}

meter! {
    /// What only a durable producer has to say.
    DurableProducerMeter(crate::protocol::producer::ProducerStats, "producer") {
        counter stored: "actix_delivery_producer_stored_total",
        counter resumed: "actix_delivery_producer_resumed_total",
        counter resumed_confirmed: "actix_delivery_producer_resumed_confirmed_total",
        counter partially_stored: "actix_delivery_producer_partially_stored_total",
        counter takeovers: "actix_delivery_producer_takeovers_total",
        gauge unconfirmed: "actix_delivery_producer_unconfirmed",
        gauge next_message_id: "actix_delivery_producer_next_message_id",
    }
}

meter! {
    /// What only a producer with `chunk_size` has to say.
    ChunkingProducerMeter(crate::protocol::producer::ProducerStats, "producer") {
        counter chunk_rounds: "actix_delivery_producer_chunk_rounds_total",
    }
}

/// A producer's meters: those of every producer, and those of what it is (durable,
/// chunking), so that it exports only what applies to it.
pub(crate) struct ProducerMeters {
    pub(crate) base: ProducerMeter,
    durable: Option<DurableProducerMeter>,
    chunking: Option<ChunkingProducerMeter>,
}

impl ProducerMeters {
    /// The meters of a producer labelled `label`, chunking or not.
    pub(crate) fn new(label: &str, chunking: bool) -> Self {
        Self {
            base: ProducerMeter::new(label),
            durable: None,
            chunking: chunking.then(|| ChunkingProducerMeter::new(label)),
        }
    }

    /// The producer is durable.
    pub(crate) fn durable(&mut self, label: &str) {
        self.durable = Some(DurableProducerMeter::new(label));
    }

    /// Publishes what changed since the last call.
    pub(crate) fn publish(&mut self, stats: &crate::protocol::producer::ProducerStats) {
        self.base.publish(stats);
        if let Some(durable) = &mut self.durable {
            durable.publish(stats);
        }
        if let Some(chunking) = &mut self.chunking {
            chunking.publish(stats);
        }
    }
}

meter! {
    /// A consumer's metrics.
    ConsumerMeter(crate::protocol::consumer::ConsumerStats, "consumer") {
        counter delivered: "actix_delivery_consumer_delivered_total",
        counter duplicates: "actix_delivery_consumer_duplicates_total",
        counter in_progress: "actix_delivery_consumer_in_progress_total",
        counter stale: "actix_delivery_consumer_stale_total",
        counter dead_letters: "actix_delivery_consumer_dead_letters_total",
        counter refused: "actix_delivery_consumer_refused_total",
        counter handler_failures: "actix_delivery_consumer_handler_failures_total",
        counter handler_panics: "actix_delivery_consumer_handler_panics_total",
        counter handler_timeouts: "actix_delivery_consumer_handler_timeouts_total",
        counter evictions: "actix_delivery_consumer_evictions_total",
        counter swept: "actix_delivery_consumer_swept_total",
        counter replaced_incarnations: "actix_delivery_consumer_replaced_incarnations_total",
        counter shared_id_messages: "actix_delivery_consumer_shared_id_messages_total",
        counter assembled: "actix_delivery_consumer_assembled_total",
        counter chunks_refused: "actix_delivery_consumer_chunks_refused_total",
        counter partial_messages_dropped: "actix_delivery_consumer_partial_messages_dropped_total",
        gauge tracked_producers: "actix_delivery_consumer_tracked_producers",
        gauge tracked_incarnations: "actix_delivery_consumer_tracked_incarnations",
        gauge waiting: "actix_delivery_consumer_waiting",
        gauge deferred: "actix_delivery_consumer_deferred",
        gauge partial_messages: "actix_delivery_consumer_partial_messages",
        gauge messages_waiting_for_room: "actix_delivery_consumer_messages_waiting_for_room",
        gauge reassembly_bytes: "actix_delivery_consumer_reassembly_bytes",
        histogram handler_seconds: "actix_delivery_consumer_handler_seconds",
    }
}

meter! {
    /// A persistent entity's metrics.
    PersistentMeter(crate::persistence::PersistentStats, "entity") {
        counter decided: "actix_delivery_persistent_decided_total",
        counter events: "actix_delivery_persistent_events_total",
        counter entries: "actix_delivery_persistent_entries_total",
        counter appends: "actix_delivery_persistent_appends_total",
        counter duplicates: "actix_delivery_persistent_duplicates_total",
        counter stale: "actix_delivery_persistent_stale_total",
        counter rejected: "actix_delivery_persistent_rejected_total",
        counter conflicts: "actix_delivery_persistent_conflicts_total",
        counter catch_ups: "actix_delivery_persistent_catch_ups_total",
        counter recoveries: "actix_delivery_persistent_recoveries_total",
        counter snapshots: "actix_delivery_persistent_snapshots_total",
        counter snapshot_failures: "actix_delivery_persistent_snapshot_failures_total",
        counter refused: "actix_delivery_persistent_refused_total",
        counter overloaded: "actix_delivery_persistent_overloaded_total",
    }
}

#[cfg(feature = "sqlite")]
meter! {
    /// A SQLite journal's metrics (published by its writer thread).
    SqliteMeter(crate::journal::SqliteStats, "journal") {
        counter appends: "actix_delivery_sqlite_appends_total",
        counter events: "actix_delivery_sqlite_events_total",
        counter transactions: "actix_delivery_sqlite_transactions_total",
        counter rejected: "actix_delivery_sqlite_rejected_total",
        counter folds: "actix_delivery_sqlite_folds_total",
        gauge queued: "actix_delivery_sqlite_queued",
        histogram commit_seconds: "actix_delivery_sqlite_commit_seconds",
        histogram commit_writes: "actix_delivery_sqlite_commit_writes",
    }
}

#[cfg(feature = "postgres")]
meter! {
    /// A PostgreSQL journal's metrics (published by its writer task).
    PostgresMeter(crate::journal::PostgresStats, "journal") {
        counter appends: "actix_delivery_postgres_appends_total",
        counter events: "actix_delivery_postgres_events_total",
        counter transactions: "actix_delivery_postgres_transactions_total",
        counter rejected: "actix_delivery_postgres_rejected_total",
        counter reconnects: "actix_delivery_postgres_reconnects_total",
        gauge queued: "actix_delivery_postgres_queued",
        histogram commit_seconds: "actix_delivery_postgres_commit_seconds",
        histogram commit_writes: "actix_delivery_postgres_commit_writes",
    }
}

meter! {
    /// A memory journal's metrics.
    MemoryMeter(crate::journal::MemoryStats, "journal") {
        counter appends: "actix_delivery_memory_journal_appends_total",
        counter commits: "actix_delivery_memory_journal_commits_total",
        counter events: "actix_delivery_memory_journal_events_total",
    }
}

meter! {
    /// A TCP node's metrics.
    NodeMeter(crate::remote::NodeStats, "node") {
        counter connections_opened: "actix_delivery_node_connections_opened_total",
        counter connections_accepted: "actix_delivery_node_connections_accepted_total",
        counter connect_failures: "actix_delivery_node_connect_failures_total",
        counter resolve_failures: "actix_delivery_node_resolve_failures_total",
        counter handshake_failures: "actix_delivery_node_handshake_failures_total",
        counter tls_failures: "actix_delivery_node_tls_failures_total",
        counter handshakes_timed_out: "actix_delivery_node_handshakes_timed_out_total",
        counter handshakes_evicted: "actix_delivery_node_handshakes_evicted_total",
        counter version_refusals: "actix_delivery_node_version_refusals_total",
        counter connections_refused: "actix_delivery_node_connections_refused_total",
        counter idle_timeouts: "actix_delivery_node_idle_timeouts_total",
        counter frames_in: "actix_delivery_node_frames_in_total",
        counter frames_out: "actix_delivery_node_frames_out_total",
        counter decode_failures: "actix_delivery_node_decode_failures_total",
        counter deliveries_out: "actix_delivery_node_deliveries_out_total",
        counter deliveries_in: "actix_delivery_node_deliveries_in_total",
        counter undecodable_bodies: "actix_delivery_node_undecodable_bodies_total",
        counter acks_out: "actix_delivery_node_acks_out_total",
        counter acks_in: "actix_delivery_node_acks_in_total",
        counter unknown_consumer: "actix_delivery_node_unknown_consumer_total",
        counter unauthorized_deliveries: "actix_delivery_node_unauthorized_deliveries_total",
        counter unroutable_acks: "actix_delivery_node_unroutable_acks_total",
        counter acks_dropped_busy: "actix_delivery_node_acks_dropped_busy_total",
        counter deliveries_dropped_full: "actix_delivery_node_deliveries_dropped_full_total",
        counter acks_dropped_full: "actix_delivery_node_acks_dropped_full_total",
        counter deliveries_waited: "actix_delivery_node_deliveries_waited_total",
        counter deliveries_dropped_disconnected:
            "actix_delivery_node_deliveries_dropped_disconnected_total",
        counter acks_dropped_disconnected: "actix_delivery_node_acks_dropped_disconnected_total",
        counter deliveries_unsendable: "actix_delivery_node_deliveries_unsendable_total",
        counter bodies_encoded: "actix_delivery_node_bodies_encoded_total",
        gauge connections_open: "actix_delivery_node_connections_open",
        gauge output_high_water: "actix_delivery_node_output_high_water_bytes",
        histogram write_frames: "actix_delivery_node_write_frames",
        histogram write_bytes: "actix_delivery_node_write_bytes",
    }
}

#[cfg(feature = "nats")]
meter! {
    /// A NATS carrier's metrics.
    NatsMeter(crate::nats::NatsStats, "carrier") {
        counter frames_in: "actix_delivery_nats_frames_in_total",
        counter frames_out: "actix_delivery_nats_frames_out_total",
        counter decode_failures: "actix_delivery_nats_decode_failures_total",
        counter version_refusals: "actix_delivery_nats_version_refusals_total",
        counter deliveries_out: "actix_delivery_nats_deliveries_out_total",
        counter deliveries_in: "actix_delivery_nats_deliveries_in_total",
        counter undecodable_bodies: "actix_delivery_nats_undecodable_bodies_total",
        counter deliveries_without_reply: "actix_delivery_nats_deliveries_without_reply_total",
        counter foreign_reply_subjects: "actix_delivery_nats_foreign_reply_subjects_total",
        counter deliveries_dropped_busy: "actix_delivery_nats_deliveries_dropped_busy_total",
        counter no_responders: "actix_delivery_nats_no_responders_total",
        counter forged_no_responders: "actix_delivery_nats_forged_no_responders_total",
        counter acks_out: "actix_delivery_nats_acks_out_total",
        counter acks_in: "actix_delivery_nats_acks_in_total",
        counter unroutable_acks: "actix_delivery_nats_unroutable_acks_total",
        counter acks_dropped_busy: "actix_delivery_nats_acks_dropped_busy_total",
        counter deliveries_dropped_full: "actix_delivery_nats_deliveries_dropped_full_total",
        counter acks_dropped_full: "actix_delivery_nats_acks_dropped_full_total",
        counter deliveries_unsendable: "actix_delivery_nats_deliveries_unsendable_total",
        counter publish_failures: "actix_delivery_nats_publish_failures_total",
        counter bodies_encoded: "actix_delivery_nats_bodies_encoded_total",
        gauge output_high_water: "actix_delivery_nats_output_high_water_bytes",
    }
}

meter! {
    /// A projection's metrics.
    ProjectionMeter(crate::projection::ProjectionStats, "projection") {
        counter events: "actix_delivery_projection_events_total",
        counter entries: "actix_delivery_projection_entries_total",
        counter batches: "actix_delivery_projection_batches_total",
        counter retries: "actix_delivery_projection_retries_total",
        counter skipped: "actix_delivery_projection_skipped_total",
        counter offsets_saved: "actix_delivery_projection_offsets_saved_total",
        counter read_failures: "actix_delivery_projection_read_failures_total",
        counter store_failures: "actix_delivery_projection_store_failures_total",
        counter conflicts: "actix_delivery_projection_conflicts_total",
        gauge lag_ms: "actix_delivery_projection_lag_milliseconds",
    }
}

meter! {
    /// An entity host's metrics.
    EntityHostMeter(crate::sharding::HostStats, "entity_type") {
        counter activations: "actix_delivery_entity_host_activations_total",
        counter passivated_idle: "actix_delivery_entity_host_passivated_idle_total",
        counter passivated_over_limit: "actix_delivery_entity_host_passivated_over_limit_total",
        counter stopped_shard_left: "actix_delivery_entity_host_stopped_shard_left_total",
        counter stopped_unasked: "actix_delivery_entity_host_stopped_unasked_total",
        counter routed: "actix_delivery_entity_host_routed_total",
        counter waited: "actix_delivery_entity_host_waited_total",
        counter waited_for_room: "actix_delivery_entity_host_waited_for_room_total",
        counter refused_full: "actix_delivery_entity_host_refused_full_total",
        counter refused_not_hosted: "actix_delivery_entity_host_refused_not_hosted_total",
        counter already_processed: "actix_delivery_entity_host_already_processed_total",
        counter refused_malformed: "actix_delivery_entity_host_refused_malformed_total",
        counter refused_foreign: "actix_delivery_entity_host_refused_foreign_total",
        counter refused_shard_count: "actix_delivery_entity_host_refused_shard_count_total",
        gauge active: "actix_delivery_entity_host_active",
        gauge stopping: "actix_delivery_entity_host_stopping",
        gauge held: "actix_delivery_entity_host_held",
        gauge peak_active: "actix_delivery_entity_host_peak_active",
    }
}

meter! {
    /// A shard coordinator's metrics.
    CoordinatorMeter(crate::sharding::CoordinatorStats, "entity_type") {
        counter rounds: "actix_delivery_shard_coordinator_rounds_total",
        counter acquired: "actix_delivery_shard_coordinator_acquired_total",
        counter renewals: "actix_delivery_shard_coordinator_renewals_total",
        counter renew_failures: "actix_delivery_shard_coordinator_renew_failures_total",
        counter lost: "actix_delivery_shard_coordinator_lost_total",
        counter handoffs_started: "actix_delivery_shard_coordinator_handoffs_started_total",
        counter handoffs: "actix_delivery_shard_coordinator_handoffs_total",
        counter expose_failures: "actix_delivery_shard_coordinator_expose_failures_total",
        gauge shards_owned: "actix_delivery_shard_coordinator_shards_owned",
        gauge members: "actix_delivery_shard_coordinator_members",
    }
}

meter! {
    /// A sharded producer's entity streams' metrics.
    LanesMeter(crate::sharding::LaneStats, "producer") {
        counter opened: "actix_delivery_sharded_producer_opened_total",
        counter closed: "actix_delivery_sharded_producer_closed_total",
        counter routed: "actix_delivery_sharded_producer_routed_total",
        counter settled: "actix_delivery_sharded_producer_settled_total",
        counter evicted: "actix_delivery_sharded_producer_evicted_total",
        counter waited: "actix_delivery_sharded_producer_waited_total",
        counter retransmitted: "actix_delivery_sharded_producer_retransmitted_total",
        counter ignored_acks: "actix_delivery_sharded_producer_ignored_acks_total",
        gauge lanes: "actix_delivery_sharded_producer_lanes",
        gauge in_flight: "actix_delivery_sharded_producer_in_flight",
        gauge waiting: "actix_delivery_sharded_producer_waiting",
    }
}

/// The label a part gets when the application gave it none.
pub(crate) const DEFAULT_LABEL: &str = "default";

/// Checks an application's `metrics_label`: a label value must not be empty.
pub(crate) fn check_label(label: &str) -> Result<(), crate::error::OptionsError> {
    if label.is_empty() {
        return Err(crate::error::OptionsError::new(
            "metrics_label",
            "must not be empty (got \"\")",
        ));
    }
    Ok(())
}

/// Records a duration in seconds.
pub(crate) fn record_seconds(histogram: &Histogram, duration: Duration) {
    histogram.record(duration.as_secs_f64());
}

impl ProducerMeter {
    /// Records the send→confirm latency of a message confirmed `Ok` (settled `now`), the
    /// first of each batch of confirmations only: `None` once it recorded one, else `now`
    /// again for the next message of the batch.
    pub(crate) fn settled(
        &self,
        confirmation: &crate::Confirmation,
        result: &Result<(), crate::DeliveryError>,
        now: std::time::Instant,
    ) -> Option<std::time::Instant> {
        if let (Ok(()), Some(taken)) = (result, confirmation.taken()) {
            record_seconds(&self.confirm_seconds, now.saturating_duration_since(taken));
            return None;
        }
        Some(now)
    }
}

/// A journal writer's commit histograms (the journals of features `sqlite` and `postgres`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! journal_transaction {
    ($meter:ident, $stats:ty) => {
        impl $meter {
            /// After a transaction: records it if it committed (`writes` in it, taking
            /// `took`), and publishes the counters.
            #[allow(clippy::cast_precision_loss)]
            pub(crate) fn transaction(
                &mut self,
                committed: Option<(usize, Duration)>,
                stats: &$stats,
            ) {
                if let Some((writes, took)) = committed {
                    record_seconds(&self.commit_seconds, took);
                    self.commit_writes.record(writes as f64);
                }
                self.publish(stats);
            }
        }
    };
}

#[cfg(feature = "sqlite")]
journal_transaction!(SqliteMeter, crate::journal::SqliteStats);
#[cfg(feature = "postgres")]
journal_transaction!(PostgresMeter, crate::journal::PostgresStats);
