//! The pure protocol core: the producer and consumer state machines, with no Actix or Tokio in
//! them. Time is an argument; nothing here sleeps, spawns or does I/O.
//!
//! The actors of this crate are thin shells over these types. They are public so that custom
//! transports, simulations and tests can drive the exact same logic.

pub mod chunk;
pub mod consumer;
pub mod dedup;
pub mod envelope;
pub mod intake;
pub(crate) mod keyed_ring;
pub mod origin;
pub mod producer;
pub mod rate_limit;
pub mod trace_context;
