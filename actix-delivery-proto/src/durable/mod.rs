//! The durable producer's log: what it stores in its journal stream, and how it resumes.

pub mod inspect;
pub mod log;
