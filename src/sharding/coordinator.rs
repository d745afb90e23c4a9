//! The shard coordinator: one per node and sharded type. It keeps the node's leases in a
//! [`LeaseStore`], takes the shards the [allocation](crate::sharding::allocation) gives it,
//! hands off the others, and tells its [`EntityHost`] and its transport which shards are
//! the node's. The decisions are pure ([`LeaseBook`], [`plan`]); this actor does the I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::alarm::{self, Alarm};
use crate::error::OptionsError;
use crate::journal::Journal;
use crate::persistence::EventSourced;
use crate::protocol::envelope::random_u64;
use crate::sharding::allocation::plan;
use crate::sharding::coordinator_options::CoordinatorOptions;
use crate::sharding::entity_id::ShardId;
use crate::sharding::host::EntityHost;
use crate::sharding::host_options::EntityHostOptions;
use crate::sharding::lease::LeaseBook;
use crate::sharding::lease_store::{LeaseStore, LeaseView, Member};
use crate::stop_signal::{wait_stopped, StopSignal, SubscribeStopped};

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

/// A transport that does nothing: for hosts asked directly ([`EntityHost::ask`]), or whose
/// senders look the owner up themselves.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTransport;

impl ShardTransport for NoTransport {
    fn expose(&self, _: ShardId) -> LocalFuture<Result<(), String>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn unexpose(&self, _: ShardId) {}
}

/// What the coordinator needs of its host.
trait HostShards: 'static {
    fn host(&self, shard: ShardId);
    fn release(&self, shard: ShardId) -> LocalFuture<()>;
    fn stop(&self) -> LocalFuture<()>;
}

impl<E: EventSourced> HostShards for EntityHost<E> {
    fn host(&self, shard: ShardId) {
        self.host_shard(shard);
    }

    fn release(&self, shard: ShardId) -> LocalFuture<()> {
        Box::pin(self.release_shard(shard))
    }

    fn stop(&self) -> LocalFuture<()> {
        EntityHost::stop(self);
        Box::pin(self.stopped())
    }
}

/// Counters and gauges of a shard coordinator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CoordinatorStats {
    /// Shards whose lease the node holds now (handoffs in progress included).
    pub shards_owned: u64,
    /// Live members the last look at the table saw.
    pub members: u64,
    /// Rounds (renewal, heartbeat, look at the table) finished.
    pub rounds: u64,
    /// Leases acquired.
    pub acquired: u64,
    /// Leases renewed (one per shard and renewal).
    pub renewals: u64,
    /// Rounds whose renewal failed (the store could not be reached).
    pub renew_failures: u64,
    /// Leases lost: a renewal did not return them, or they ran out before one returned.
    pub lost: u64,
    /// Handoffs started (a shard given up to its desired owner, or on leaving).
    pub handoffs_started: u64,
    /// Handoffs finished: the shard's entities stopped and its lease released (rebalances).
    pub handoffs: u64,
    /// Shards the transport could not expose (given up again).
    pub expose_failures: u64,
}

/// A node of a sharded type: its [`EntityHost`] runs the entities of the shards the node
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
pub struct ShardCoordinator<E: EventSourced> {
    host: EntityHost<E>,
    addr: Addr<Coordinator>,
    member: Arc<str>,
}

impl<E: EventSourced> Clone for ShardCoordinator<E> {
    fn clone(&self) -> Self {
        Self {
            host: self.host.clone(),
            addr: self.addr.clone(),
            member: self.member.clone(),
        }
    }
}

impl<E: EventSourced> ShardCoordinator<E> {
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
        transport: impl FnOnce(&EntityHost<E>) -> T,
    ) -> Result<Self, OptionsError> {
        let host = EntityHost::<E>::start_hosting(journal, host, false)?;
        let transport = transport(&host);
        let member = Member {
            id: format!("{}#{:016x}", options.node_name, random_u64()),
            address: options.address,
        };
        let coordinator = Coordinator {
            namespace: host.entity_type().to_owned(),
            shards: host.shards(),
            member: member.clone(),
            config: options.config.clone(),
            book: LeaseBook::new(options.config.lease_ttl),
            store: leases,
            host: Box::new(host.clone()),
            transport: Box::new(transport),
            in_round: false,
            leaving: false,
            alarm: Alarm::default(),
            stop: StopSignal::default(),
            stats: CoordinatorStats::default(),
            #[cfg(feature = "metrics")]
            meter: crate::telemetry::metrics::CoordinatorMeter::new(host.entity_type()),
        };
        Ok(Self {
            host,
            addr: coordinator.start(),
            member: member.id.into(),
        })
    }

    /// The node's host: ask its entities directly (commands for shards the node does not own
    /// are refused, [`HostError::NotHosted`](crate::sharding::HostError::NotHosted)).
    pub fn host(&self) -> &EntityHost<E> {
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

    /// Resolves once the node has left and its host has stopped.
    pub fn stopped(&self) -> impl Future<Output = ()> + 'static {
        wait_stopped(self.addr.send(SubscribeStopped))
    }
}

impl<E: EventSourced> std::fmt::Debug for ShardCoordinator<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardCoordinator")
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

/// The coordinator's actor.
struct Coordinator {
    namespace: String,
    shards: u32,
    member: Member,
    config: crate::sharding::coordinator_options::CoordinatorConfig,
    book: LeaseBook,
    store: Arc<dyn LeaseStore>,
    host: Box<dyn HostShards>,
    transport: Box<dyn ShardTransport>,
    in_round: bool,
    leaving: bool,
    /// Fires when the first lease runs out unless renewed.
    alarm: Alarm,
    stop: StopSignal,
    stats: CoordinatorStats,
    #[cfg(feature = "metrics")]
    meter: crate::telemetry::metrics::CoordinatorMeter,
}

/// What one round read from the store.
struct Read {
    asked: Vec<(ShardId, u64)>,
    renewed: Result<Vec<ShardId>, crate::sharding::lease_store::LeaseError>,
    view: Option<LeaseView>,
}

impl Coordinator {
    /// Renews, heartbeats and looks at the table; then drops what was lost, hands off and
    /// acquires as the plan says.
    fn round(&mut self, ctx: &mut Context<Self>) {
        if std::mem::replace(&mut self.in_round, true) {
            return;
        }
        let sent_at = alarm::now();
        let asked = self.book.renewals();
        let (store, namespace, member) = (
            self.store.clone(),
            self.namespace.clone(),
            self.member.clone(),
        );
        let ttl = self.config.lease_ttl;
        let leaving = self.leaving;
        let read = async move {
            let heartbeat = if leaving {
                Ok(())
            } else {
                store.heartbeat(&namespace, &member, ttl).await
            };
            let renewed = store.renew(&namespace, &asked, &member.id, ttl).await;
            let view = match heartbeat {
                Ok(()) => store.view(&namespace).await.ok(),
                Err(error) => {
                    log::warn!("sharding `{namespace}`: heartbeat failed: {error}");
                    None
                }
            };
            Read {
                asked,
                renewed,
                view,
            }
        };
        ctx.spawn(read.into_actor(self).map(move |read, act, ctx| {
            act.stats.rounds += 1;
            act.after_read(read, sent_at, ctx);
            #[cfg(feature = "metrics")]
            act.meter.publish(&act.stats());
        }));
    }

    fn after_read(&mut self, read: Read, sent_at: std::time::Instant, ctx: &mut Context<Self>) {
        match read.renewed {
            Ok(renewed) => {
                self.stats.renewals += renewed.len() as u64;
                let lost = self.book.handle_renewed(&read.asked, &renewed, sent_at);
                self.drop_lost(lost, ctx);
            }
            Err(error) => {
                self.stats.renew_failures += 1;
                log::warn!(
                    "sharding `{}`: renewing leases failed: {error}",
                    self.namespace
                );
            }
        }
        self.drop_expired(ctx);
        self.arm_expiry(ctx);
        let Some(view) = read.view.filter(|_| !self.leaving) else {
            self.in_round = false;
            return;
        };
        let members: BTreeSet<String> = view.members.into_iter().map(|m| m.id).collect();
        let owners: BTreeMap<ShardId, String> = view
            .leases
            .into_iter()
            .map(|(shard, lease)| (shard, lease.owner))
            .collect();
        self.stats.members = members.len() as u64;
        let mine: BTreeSet<ShardId> = self.book.shards().collect();
        let plan = plan(
            &self.member.id,
            &members,
            &owners,
            &mine,
            self.book.handing_off(),
            self.shards,
            self.config.max_handoffs,
        );
        for shard in plan.hand_off {
            self.hand_off(shard, ctx);
        }
        if plan.acquire.is_empty() {
            self.in_round = false;
            return;
        }
        let sent_at = alarm::now();
        let (store, namespace, owner) = (
            self.store.clone(),
            self.namespace.clone(),
            self.member.id.clone(),
        );
        let ttl = self.config.lease_ttl;
        let acquire = async move { store.acquire(&namespace, &plan.acquire, &owner, ttl).await };
        ctx.spawn(acquire.into_actor(self).map(move |acquired, act, ctx| {
            act.in_round = false;
            match acquired {
                Ok(acquired) => {
                    for (shard, token) in acquired {
                        act.acquired(shard, token, sent_at, ctx);
                        if act.leaving {
                            act.hand_off(shard, ctx); // acquired as the node began to leave
                        }
                    }
                }
                Err(error) => log::warn!("sharding `{}`: acquiring failed: {error}", act.namespace),
            }
            act.arm_expiry(ctx);
        }));
    }

    fn acquired(
        &mut self,
        shard: ShardId,
        token: u64,
        sent_at: std::time::Instant,
        ctx: &mut Context<Self>,
    ) {
        self.stats.acquired += 1;
        self.book.handle_acquired(shard, token, sent_at);
        self.host.host(shard);
        let exposed = self.transport.expose(shard);
        ctx.spawn(exposed.into_actor(self).map(move |exposed, act, ctx| {
            let held = act.book.get(shard).is_some_and(|h| h.token == token);
            match exposed {
                Ok(()) if held => {}
                // Lost or given up meanwhile: it must not be received here.
                Ok(()) => act.transport.unexpose(shard),
                Err(error) => {
                    act.stats.expose_failures += 1;
                    log::warn!(
                        "sharding `{}`: shard {shard} cannot be exposed, giving it up: {error}",
                        act.namespace
                    );
                    if held {
                        act.hand_off(shard, ctx);
                    }
                }
            }
        }));
    }

    /// Gives `shard` up to its next owner: stop receiving, stop its entities, release.
    fn hand_off(&mut self, shard: ShardId, ctx: &mut Context<Self>) {
        if !self.book.begin_handoff(shard) {
            return;
        }
        self.stats.handoffs_started += 1;
        self.transport.unexpose(shard);
        let released = self.host.release(shard);
        ctx.spawn(released.into_actor(self).map(move |(), act, ctx| {
            if let Some(token) = act.book.release(shard) {
                act.stats.handoffs += 1;
                act.release_in_store(vec![(shard, token)], ctx);
            }
            act.leave_if_done(ctx);
        }));
    }

    /// Leases lost: stop acting on their shards at once (their entities stop; their commands
    /// in flight may still be stored, and the journal's fence sorts that out with the new
    /// owner).
    fn drop_lost(&mut self, lost: Vec<(ShardId, u64)>, ctx: &mut Context<Self>) {
        if lost.is_empty() {
            return;
        }
        for &(shard, _) in &lost {
            self.stats.lost += 1;
            log::warn!("sharding `{}`: lease of shard {shard} lost", self.namespace);
            self.transport.unexpose(shard);
            let released = self.host.release(shard);
            ctx.spawn(
                released
                    .into_actor(self)
                    .map(|(), act, ctx| act.leave_if_done(ctx)),
            );
        }
        // A renewal that landed after the lease ran out here would hold the shard for
        // nobody: release it (a lease taken by another node has another token: untouched).
        self.release_in_store(lost, ctx);
    }

    fn drop_expired(&mut self, ctx: &mut Context<Self>) {
        let expired = self.book.poll_expired(alarm::now());
        self.drop_lost(expired, ctx);
    }

    fn arm_expiry(&mut self, ctx: &mut Context<Self>) {
        self.alarm.arm(self.book.next_expiry(), ctx, |act, ctx| {
            act.alarm.fired();
            act.drop_expired(ctx);
            act.arm_expiry(ctx);
        });
    }

    fn release_in_store(&mut self, leases: Vec<(ShardId, u64)>, ctx: &mut Context<Self>) {
        let (store, namespace, owner) = (
            self.store.clone(),
            self.namespace.clone(),
            self.member.id.clone(),
        );
        let release = async move { store.release(&namespace, &leases, &owner).await };
        ctx.spawn(release.into_actor(self).map(|released, act, _| {
            if let Err(error) = released {
                log::warn!(
                    "sharding `{}`: releasing leases failed (they expire instead): {error}",
                    act.namespace
                );
            }
        }));
    }

    /// Once leaving and every shard is handed off: remove the member, stop the host, stop.
    fn leave_if_done(&mut self, ctx: &mut Context<Self>) {
        if !self.leaving || !self.book.is_empty() || self.stop.is_final() {
            return;
        }
        self.stop.make_final();
        let (store, namespace, member) = (
            self.store.clone(),
            self.namespace.clone(),
            self.member.id.clone(),
        );
        let host_stopped = self.host.stop();
        let left = async move {
            if let Err(error) = store.leave(&namespace, &member).await {
                log::warn!(
                    "sharding `{namespace}`: leaving failed (the member expires instead): {error}"
                );
            }
            host_stopped.await;
        };
        ctx.spawn(left.into_actor(self).map(|(), _, ctx| ctx.stop()));
    }
}

impl Coordinator {
    fn stats(&self) -> CoordinatorStats {
        CoordinatorStats {
            shards_owned: self.book.len() as u64,
            ..self.stats
        }
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.round(ctx);
        ctx.run_interval(self.config.renew_interval, |act, ctx| act.round(ctx));
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        #[cfg(feature = "metrics")]
        self.meter.publish(&self.stats());
        self.stop.announce_if_final();
    }
}

/// Asks the coordinator for its counters.
struct GetCoordinatorStats;

impl Message for GetCoordinatorStats {
    type Result = CoordinatorStats;
}

impl Handler<GetCoordinatorStats> for Coordinator {
    type Result = MessageResult<GetCoordinatorStats>;

    fn handle(&mut self, _: GetCoordinatorStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}

/// Leaves the cluster.
struct Leave;

impl Message for Leave {
    type Result = ();
}

impl Handler<Leave> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Leave, ctx: &mut Context<Self>) {
        if std::mem::replace(&mut self.leaving, true) {
            return;
        }
        // Out of the members first, so that the others plan without this node and take each
        // shard as soon as it is released (its leases are still renewed meanwhile).
        let (store, namespace, member) = (
            self.store.clone(),
            self.namespace.clone(),
            self.member.id.clone(),
        );
        let left = async move { store.leave(&namespace, &member).await };
        ctx.spawn(left.into_actor(self).map(|left, act, _| {
            if let Err(error) = left {
                log::warn!(
                    "sharding `{}`: leaving failed (retried at the end): {error}",
                    act.namespace
                );
            }
        }));
        let shards: Vec<ShardId> = self.book.shards().collect();
        for shard in shards {
            self.hand_off(shard, ctx);
        }
        self.leave_if_done(ctx);
    }
}

impl Handler<SubscribeStopped> for Coordinator {
    type Result = MessageResult<SubscribeStopped>;

    fn handle(&mut self, _: SubscribeStopped, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stop.subscribe())
    }
}
