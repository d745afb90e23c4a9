//! The leaseholder: the actor of a
//! [`ShardCoordinatorHandle`](crate::sharding::ShardCoordinatorHandle). Every `renew_interval` it
//! renews the node's leases and heartbeat and looks at the table; then it drops what it lost, hands
//! off and acquires as the pure [`plan`] says, keeps the node's [`LeaseBook`], and tells the host
//! and the transport which shards are the node's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::prelude::*;

use serde::{Deserialize, Serialize};

use crate::persistence::EventSourced;
use crate::runtime::alarm::{self, Alarm};
use crate::runtime::stop_signal::{StopSignal, SubscribeStopped};
use crate::sharding::allocation::plan;
use crate::sharding::coordinator_options::CoordinatorConfig;
use crate::sharding::entity_id::ShardId;
use crate::sharding::host::EntityHostHandle;
use crate::sharding::lease::LeaseBook;
use crate::sharding::lease_store::{LeaseStore, LeaseView, Member};
use crate::sharding::transport::{LocalFuture, ShardTransport};

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

/// What the coordinator needs of its host.
trait HostShards: 'static {
    fn host(&self, shard: ShardId);
    fn release(&self, shard: ShardId) -> LocalFuture<()>;
    fn stop(&self) -> LocalFuture<()>;
}

impl<E: EventSourced> HostShards for EntityHostHandle<E> {
    fn host(&self, shard: ShardId) {
        self.host_shard(shard);
    }

    fn release(&self, shard: ShardId) -> LocalFuture<()> {
        Box::pin(self.release_shard(shard))
    }

    fn stop(&self) -> LocalFuture<()> {
        EntityHostHandle::stop(self);
        Box::pin(self.stopped())
    }
}

/// The coordinator's actor: it holds the node's leases.
pub(super) struct Leaseholder {
    namespace: String,
    shards: u32,
    member: Member,
    config: CoordinatorConfig,
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
    meter: CoordinatorMeter,
}

/// What one round read from the store.
struct Read {
    asked: Vec<(ShardId, u64)>,
    renewed: Result<Vec<ShardId>, crate::sharding::lease_store::LeaseError>,
    view: Option<LeaseView>,
}

impl Leaseholder {
    /// The leaseholder of node `member` for `host`'s type.
    pub(super) fn new<E: EventSourced>(
        host: &EntityHostHandle<E>,
        member: Member,
        config: CoordinatorConfig,
        store: Arc<dyn LeaseStore>,
        transport: Box<dyn ShardTransport>,
    ) -> Self {
        Self {
            namespace: host.entity_type().to_owned(),
            shards: host.shards(),
            member,
            book: LeaseBook::new(config.lease_ttl),
            config,
            store,
            host: Box::new(host.clone()),
            transport,
            in_round: false,
            leaving: false,
            alarm: Alarm::default(),
            stop: StopSignal::default(),
            stats: CoordinatorStats::default(),
            #[cfg(feature = "metrics")]
            meter: CoordinatorMeter::new(host.entity_type()),
        }
    }

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
            // Leaving, it renews what it still holds, and neither announces itself nor
            // looks for shards to take.
            let heartbeat = if leaving {
                None
            } else {
                Some(store.heartbeat(&namespace, &member, ttl).await)
            };
            let renewed = store.renew(&namespace, &asked, &member.id, ttl).await;
            let view = match heartbeat {
                Some(Ok(())) => store.view(&namespace).await.ok(),
                Some(Err(error)) => {
                    log::warn!("sharding `{namespace}`: heartbeat failed: {error}");
                    None
                }
                None => None,
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

impl Leaseholder {
    fn stats(&self) -> CoordinatorStats {
        CoordinatorStats {
            shards_owned: self.book.len() as u64,
            ..self.stats
        }
    }
}

impl Actor for Leaseholder {
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
pub(super) struct GetCoordinatorStats;

impl Message for GetCoordinatorStats {
    type Result = CoordinatorStats;
}

impl Handler<GetCoordinatorStats> for Leaseholder {
    type Result = MessageResult<GetCoordinatorStats>;

    fn handle(&mut self, _: GetCoordinatorStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stats())
    }
}

/// Leaves the cluster.
pub(super) struct Leave;

impl Message for Leave {
    type Result = ();
}

impl Handler<Leave> for Leaseholder {
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

impl Handler<SubscribeStopped> for Leaseholder {
    type Result = MessageResult<SubscribeStopped>;

    fn handle(&mut self, _: SubscribeStopped, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.stop.subscribe())
    }
}

#[cfg(feature = "metrics")]
crate::telemetry::metrics::meter! {
    /// A shard coordinator's metrics.
    CoordinatorMeter(CoordinatorStats, "entity_type") {
        counter rounds: "actix_delivery_shard_coordinator_rounds_total",
        counter acquired: "actix_delivery_shard_coordinator_acquired_total",
        counter renewals: "actix_delivery_shard_coordinator_renewals_total",
        counter renew_failures: "actix_delivery_shard_coordinator_renew_failures_total",
        counter lost: "actix_delivery_shard_coordinator_lost_total",
        counter handoffs_started: "actix_delivery_shard_coordinator_handoffs_started_total",
        counter handoffs: "actix_delivery_shard_coordinator_handoffs_total",
        counter expose_failures: "actix_delivery_shard_coordinator_expose_failures_total",
        gauge shards_owned: "actix_delivery_shard_coordinator_shards_owned",
        gauge members: "actix_delivery_shard_coordinator_members",
    }
}
