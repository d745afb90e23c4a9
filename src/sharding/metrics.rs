//! The meters of entity hosts and sharded producers (a coordinator's is beside its stats, in
//! `leaseholder.rs`) (feature `metrics`;
//! the catalogue of names is in `telemetry::metrics`).

use crate::sharding::host_core::HostStats;
use crate::sharding::lanes::LaneStats;
use crate::telemetry::metrics::meter;

meter! {
    /// An entity host's metrics.
    EntityHostMeter(HostStats, "entity_type") {
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
    /// A sharded producer's entity streams' metrics.
    LanesMeter(LaneStats, "producer") {
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
