//! A projection's meter (feature `metrics`; the catalogue of names is in `telemetry::metrics`).

use crate::projection::core::ProjectionStats;
use crate::telemetry::metrics::meter;

meter! {
    /// A projection's metrics.
    ProjectionMeter(ProjectionStats, "projection") {
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
