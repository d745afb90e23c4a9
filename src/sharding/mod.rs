//! Sharding: many persistent entities, hosted on demand, spread over nodes.

pub mod allocation;
mod coordinator;
mod coordinator_options;
mod entity_id;
mod envelope;
mod host;
pub mod host_core;
mod host_options;
pub mod lanes;
pub mod lease;
mod lease_store;
#[cfg(feature = "nats")]
mod nats_shards;
#[cfg(feature = "postgres")]
mod postgres_leases;
mod producer;
mod producer_options;
mod rooms;
mod router;

pub use self::coordinator::{
    CoordinatorStats, LocalFuture, NoTransport, ShardCoordinator, ShardTransport,
};
pub use self::coordinator_options::{
    CoordinatorConfig, CoordinatorOptions, CoordinatorOptionsBuilder, MAX_NODE_NAME,
};
pub use self::entity_id::{EntityId, EntityIdError, ShardId, MAX_ENTITY_ID};
pub use self::envelope::{EntityEnvelope, EntityMessage};
pub use self::host::{EntityHost, HostError};
pub use self::host_core::HostStats;
pub use self::host_options::{
    EntityHostConfig, EntityHostOptions, EntityHostOptionsBuilder, MAX_ENTITY_TYPE, MAX_SHARDS,
};
pub use self::lanes::LaneStats;
pub use self::lease_store::{
    Lease, LeaseError, LeaseFuture, LeaseStore, LeaseView, Member, MemoryLeaseStore,
};
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub use self::nats_shards::NatsShards;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres_leases::PostgresLeaseStore;
pub use self::producer::ShardedProducerHandle;
pub use self::producer_options::{
    ShardedProducerConfig, ShardedProducerOptions, ShardedProducerOptionsBuilder,
    MAX_SHARDED_PRODUCER_ID,
};
