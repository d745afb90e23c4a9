//! The reconnection backoff the shells wait by.

pub mod backoff;
