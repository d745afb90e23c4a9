//! The NATS transport's subjects, the carrier's notices, and the version byte of its messages.

pub mod notices;
pub mod subject;
pub mod version;
