//! The cores of sharding: entity ids and shards, shard allocation, leases, the producer's
//! lanes, the entity host's core and its table's capacity rule.

pub mod allocation;
pub mod capacity;
pub mod entity_id;
pub mod host_core;
pub mod lanes;
pub mod lease;
