//! The NATS transport's subjects and the carrier's notices.

pub mod notices;
pub mod subject;
