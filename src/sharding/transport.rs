//! How a shard's deliveries reach its owner: the [`ShardTransport`] a coordinator drives.

use std::future::Future;
use std::pin::Pin;

use crate::sharding::entity_id::ShardId;

/// A future the coordinator runs on its arbiter.
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// How a shard's deliveries reach its owner: the coordinator calls
/// [`expose`](Self::expose) once the node owns a shard and [`unexpose`](Self::unexpose) when
/// it gives it up (before its entities stop). Over NATS, a subject per shard subscribed by
/// its owner (`NatsShards`, feature `nats`); a transport whose senders find the owner
/// themselves (in the lease table) does nothing here.
pub trait ShardTransport: 'static {
    /// Starts receiving `shard`'s deliveries; resolves once they are received (or with why
    /// not: the coordinator then gives the shard up).
    fn expose(&self, shard: ShardId) -> LocalFuture<Result<(), String>>;

    /// Stops receiving `shard`'s deliveries.
    fn unexpose(&self, shard: ShardId);
}

/// A transport that does nothing: for hosts asked directly
/// ([`EntityHostHandle::ask`](crate::sharding::EntityHostHandle::ask)), or whose senders look the
/// owner up themselves.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTransport;

impl ShardTransport for NoTransport {
    fn expose(&self, _: ShardId) -> LocalFuture<Result<(), String>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn unexpose(&self, _: ShardId) {}
}
