//! The sans-IO core of [actix-delivery](https://docs.rs/actix-delivery): what decides, and
//! nothing that acts. The delivery protocol's producer and consumer cores, deduplication,
//! chunking and reassembly, settings and their serde rules, body codecs and schemas, the
//! journal's data types, the cores of persistent entities, durable producers, work pulling,
//! projections and sharding, the TCP transport's frames and handshake, NATS subjects.
//!
//! Nothing here does I/O, reads the clock or draws from the OS: every method that needs time
//! takes `now`, every random choice is drawn by the caller and passed in. `actix-delivery`
//! drives these cores from its actors, tasks, sockets and databases; an application uses
//! `actix-delivery`, which re-exports what it needs of this crate. Depend on this crate
//! directly to test a rule in isolation or to drive a core from another runtime.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// Tests may read the clock (`clippy.toml` refuses it to the core itself).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod codec;
pub mod config;
pub mod delivery;
pub mod durable;
pub mod error;
pub mod journal;
pub mod nats;
pub mod persistence;
pub mod projection;
pub mod protocol;
pub mod runtime;
pub mod sharding;
pub mod tcp;
pub mod work_pulling;
