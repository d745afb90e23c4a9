//! A NATS carrier's meter (feature `metrics`; the catalogue of names is in
//! `telemetry::metrics`).

use crate::nats::stats::NatsStats;
use crate::telemetry::metrics::meter;

meter! {
    /// A NATS carrier's metrics.
    NatsMeter(NatsStats, "carrier") {
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
        counter chunks_held_for_version: "actix_delivery_nats_chunks_held_for_version_total",
        counter publish_failures: "actix_delivery_nats_publish_failures_total",
        counter bodies_encoded: "actix_delivery_nats_bodies_encoded_total",
        gauge output_high_water: "actix_delivery_nats_output_high_water_bytes",
    }
}
