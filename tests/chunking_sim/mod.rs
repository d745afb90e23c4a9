//! The chunking simulator's parts (see `tests/chunking_sim.rs`).

pub mod scenario;
pub mod world;
