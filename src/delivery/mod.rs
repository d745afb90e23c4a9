//! In-process reliable delivery: the producer and consumer actors (the shells around the
//! protocol cores of [`crate::protocol`]), their handles, options, messages, confirmations and
//! dead letters. Every subsystem above (journals excepted) builds on these; they import only
//! the core, telemetry and [`runtime`](crate::runtime) plumbing.

pub(crate) mod confirmation;
pub(crate) mod consumer;
pub(crate) mod dead_letter;
pub(crate) use actix_delivery_proto::delivery::{
    dead_letter_book, dead_letter_sampler, dead_letters,
};
pub(crate) mod dead_letter_handle;
pub(crate) mod dead_letter_store;
pub(crate) mod handler;
pub(crate) mod inbox;
pub mod message;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
pub(crate) mod options;
pub(crate) mod producer;
pub(crate) mod producer_core;
pub(crate) mod storage;
pub(crate) mod stored;
