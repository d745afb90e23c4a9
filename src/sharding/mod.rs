//! Sharding: many persistent entities, hosted on demand, spread over nodes.

mod entity_id;
mod envelope;
mod host;
pub mod host_core;
mod host_options;

pub use self::entity_id::{EntityId, EntityIdError, ShardId, MAX_ENTITY_ID};
pub use self::envelope::EntityEnvelope;
pub use self::host::{EntityHost, HostError};
pub use self::host_core::HostStats;
pub use self::host_options::{
    EntityHostConfig, EntityHostOptions, EntityHostOptionsBuilder, MAX_ENTITY_TYPE, MAX_SHARDS,
};
