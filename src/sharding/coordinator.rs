//! The shard coordinator: one per node and sharded type, the application's handle of the node's
//! [`EntityHostHandle`] and of its [leaseholder](crate::sharding::lease): the actor that keeps the
//! node's leases in a [`LeaseStore`], takes the shards the
//! [allocation](crate::sharding::allocation) gives it and hands off the others.

use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;

use crate::error::OptionsError;
use crate::journal::Journal;
use crate::persistence::EventSourced;
use crate::runtime::random::random_u64;
use crate::runtime::shutdown::{once_stopped, GracefulStop, StopFuture};
use crate::runtime::stop_signal::{wait_stopped, SubscribeStopped};
use crate::sharding::coordinator_options::CoordinatorOptions;
use crate::sharding::host::EntityHostHandle;
use crate::sharding::host_options::EntityHostOptions;
use crate::sharding::lease_store::{LeaseStore, Member};
use crate::sharding::leaseholder::{CoordinatorStats, GetCoordinatorStats, Leaseholder, Leave};
use crate::sharding::transport::ShardTransport;

/// A node of a sharded type: its [`EntityHostHandle`] runs the entities of the shards the node
/// owns, and its coordinator keeps those shards' leases in a [`LeaseStore`] (PostgreSQL for
/// several processes), takes free shards the allocation gives the node, hands off the others
/// (the old owner stops the shard's entities, then releases; the new owner acquires and its
/// entities recover on their next command), and exposes the owned shards on a
/// [`ShardTransport`]. A node that dies (SIGKILL) holds its shards until their leases expire
/// (`lease_ttl`); then the others take them. If two nodes act on a shard at once (a node
/// paused past its lease), the journal's fence keeps the entities' streams consistent: one
/// writer loses, catches up and decides again.
///
/// Cheap to clone. The node runs until [`stop`](Self::stop), which leaves the cluster
/// gracefully: the member is removed, every shard handed off, the host stopped (dropping the
/// handles does not stop it: a node leaves by handing its shards off).
pub struct ShardCoordinatorHandle<E: EventSourced> {
    host: EntityHostHandle<E>,
    addr: Addr<Leaseholder>,
    member: Arc<str>,
}

impl<E: EventSourced> Clone for ShardCoordinatorHandle<E> {
    fn clone(&self) -> Self {
        Self {
            host: self.host.clone(),
            addr: self.addr.clone(),
            member: self.member.clone(),
        }
    }
}

impl<E: EventSourced> ShardCoordinatorHandle<E> {
    /// Starts a node of the type `host` describes, on the current arbiter: a host of no shard
    /// yet over `journal`, its coordinator over `leases`, and the transport `transport` makes
    /// from the host (a NATS exposure of the host's consumer, say).
    ///
    /// # Errors
    /// [`OptionsError`] if the entity type's versions are invalid.
    pub fn start<T: ShardTransport>(
        journal: Arc<dyn Journal>,
        host: EntityHostOptions,
        leases: Arc<dyn LeaseStore>,
        options: CoordinatorOptions,
        transport: impl FnOnce(&EntityHostHandle<E>) -> T,
    ) -> Result<Self, OptionsError> {
        let host = EntityHostHandle::<E>::start_hosting(journal, host, false)?;
        let transport = transport(&host);
        let member = Member {
            id: format!("{}#{:016x}", options.node_name, random_u64()),
            address: options.address,
        };
        let leaseholder = Leaseholder::new(
            &host,
            member.clone(),
            options.config,
            leases,
            Box::new(transport),
        );
        Ok(Self {
            host,
            addr: leaseholder.start(),
            member: member.id.into(),
        })
    }

    /// The node's host: ask its entities directly (commands for shards the node does not own
    /// are refused, [`HostError::NotHosted`](crate::sharding::HostError::NotHosted)).
    pub fn host(&self) -> &EntityHostHandle<E> {
        &self.host
    }

    /// The node's member id in the lease store.
    pub fn member(&self) -> &str {
        &self.member
    }

    /// The coordinator's counters.
    ///
    /// # Errors
    /// [`MailboxError`] if it has stopped.
    pub async fn stats(&self) -> Result<CoordinatorStats, MailboxError> {
        self.addr.send(GetCoordinatorStats).await
    }

    /// Leaves the cluster gracefully: hands off every shard (its entities stop, what they
    /// decided stored; then its lease is released for the next owner), removes the member,
    /// stops the host.
    pub fn stop(&self) {
        self.addr.do_send(Leave);
    }

    /// Resolves once the node has left and its host has stopped. A coordinator opens nothing
    /// that can fail for good when it starts, so it has no `opened()` and stops only when
    /// asked to: a lease store it cannot reach is tried again every round (its failed
    /// renewals counted in [`CoordinatorStats::renew_failures`]).
    pub fn stopped(&self) -> impl Future<Output = ()> + 'static + use<E> {
        wait_stopped(self.addr.send(SubscribeStopped))
    }
}

impl<E: EventSourced> std::fmt::Debug for ShardCoordinatorHandle<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardCoordinatorHandle")
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

impl<E: EventSourced> GracefulStop for ShardCoordinatorHandle<E> {
    /// [`stop`](Self::stop) (its shards handed off), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        once_stopped(self.stopped())
    }
}
