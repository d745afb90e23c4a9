//! Telemetry glue, each part behind its feature.

#[cfg(feature = "metrics")]
pub mod metrics;
