//! Sharding: many persistent entities, hosted on demand, spread over nodes.

mod entity_id;
mod envelope;
mod host;
pub mod host_core;
mod host_options;
pub mod lanes;
mod producer;
mod producer_options;
mod rooms;
mod router;

pub use self::entity_id::{EntityId, EntityIdError, ShardId, MAX_ENTITY_ID};
pub use self::envelope::{EntityEnvelope, EntityMessage};
pub use self::host::{EntityHost, HostError};
pub use self::host_core::HostStats;
pub use self::host_options::{
    EntityHostConfig, EntityHostOptions, EntityHostOptionsBuilder, MAX_ENTITY_TYPE, MAX_SHARDS,
};
pub use self::lanes::LaneStats;
pub use self::producer::ShardedProducerHandle;
pub use self::producer_options::{
    ShardedProducerConfig, ShardedProducerOptions, ShardedProducerOptionsBuilder,
    MAX_SHARDED_PRODUCER_ID,
};
