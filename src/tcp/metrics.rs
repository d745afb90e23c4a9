//! A TCP node's meter (feature `metrics`; the catalogue of names is in `telemetry::metrics`).

use crate::tcp::stats::NodeStats;
use crate::telemetry::metrics::meter;

meter! {
    /// A TCP node's metrics.
    NodeMeter(NodeStats, "node") {
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
        counter chunks_held_for_version: "actix_delivery_node_chunks_held_for_version_total",
        counter bodies_encoded: "actix_delivery_node_bodies_encoded_total",
        gauge connections_open: "actix_delivery_node_connections_open",
        gauge output_high_water: "actix_delivery_node_output_high_water_bytes",
        histogram write_frames: "actix_delivery_node_write_frames",
        histogram write_bytes: "actix_delivery_node_write_bytes",
    }
}
