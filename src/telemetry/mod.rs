//! Telemetry glue, each part behind its feature.

#[cfg(feature = "tracing")]
pub mod spans;
