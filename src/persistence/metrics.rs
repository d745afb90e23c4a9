//! A persistent entity's meter (feature `metrics`; the catalogue of names is in
//! `telemetry::metrics`).

use crate::persistence::core::PersistentStats;
use crate::telemetry::metrics::meter;

meter! {
    /// A persistent entity's metrics.
    PersistentMeter(PersistentStats, "entity") {
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
