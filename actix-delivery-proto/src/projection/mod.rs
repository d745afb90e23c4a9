//! The core of projections: its settings, the batches and envelopes it hands to handlers,
//! its errors, and the state machine that reads, handles and stores offsets.

pub mod batch;
pub mod core;
pub mod envelope;
pub mod error;
pub mod options;
