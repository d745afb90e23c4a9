//! The producers' and consumers' meters (feature `metrics`; the catalogue of names is in
//! `telemetry::metrics`).

use crate::delivery::confirmation::Confirmation;
use crate::error::DeliveryError;
use crate::protocol::consumer::ConsumerStats;
use crate::protocol::producer::ProducerStats;
use crate::runtime::alarm::now;
use crate::telemetry::metrics::{meter, record_seconds, Pace};

meter! {
    /// A producer's metrics.
    ProducerMeter(ProducerStats, "producer") {
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
    DurableProducerMeter(ProducerStats, "producer") {
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
    ChunkingProducerMeter(ProducerStats, "producer") {
        counter chunk_rounds: "actix_delivery_producer_chunk_rounds_total",
    }
}

/// A producer's meters: those of every producer, and those of what it is (durable,
/// chunking), so that it exports only what applies to it.
pub(crate) struct ProducerMeters {
    base: ProducerMeter,
    durable: Option<DurableProducerMeter>,
    chunking: Option<ChunkingProducerMeter>,
    /// Paces the confirmation latency's samples.
    latency_pace: Pace,
    /// The producer's last flush: whether a message taken now may be sampled is decided at
    /// that time, so that the clock is read only for the messages sampled.
    seen: std::time::Instant,
}

impl ProducerMeters {
    /// The meters of a producer labelled `label`, chunking or not.
    pub(crate) fn new(label: &str, chunking: bool) -> Self {
        Self {
            base: ProducerMeter::new(label),
            durable: None,
            chunking: chunking.then(|| ChunkingProducerMeter::new(label)),
            latency_pace: Pace::default(),
            seen: now(),
        }
    }

    /// The producer is durable.
    pub(crate) fn durable(&mut self, label: &str) {
        self.durable = Some(DurableProducerMeter::new(label));
    }

    /// Publishes what changed since the last call.
    pub(crate) fn publish(&mut self, stats: &ProducerStats) {
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
    ConsumerMeter(ConsumerStats, "consumer") {
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

impl ProducerMeters {
    /// The producer flushed at `now`.
    pub(crate) fn seen(&mut self, now: std::time::Instant) {
        self.seen = now;
    }

    /// Whether a message taken now should carry the time it was taken, to be sampled.
    pub(crate) fn wants_sample(&self) -> bool {
        self.latency_pace.is_due(self.seen)
    }

    /// Records the send→confirm latency of a message confirmed `Ok`, one per pace: the pace
    /// runs on the times the messages were taken, so that the clock is read only for a
    /// sample.
    pub(crate) fn settled(
        &mut self,
        confirmation: &Confirmation,
        result: &Result<(), DeliveryError>,
    ) {
        if let (Ok(()), Some(taken)) = (result, confirmation.taken())
            && self.latency_pace.is_due(taken)
        {
            self.latency_pace.done(taken);
            record_seconds(
                &self.base.confirm_seconds,
                now().saturating_duration_since(taken),
            );
        }
    }
}
