//! The router of a sharded producer: the consumer (in process) of its producer's messages. It
//! drives one reliable stream per destination entity ([`Lanes`]) inside itself, each a
//! [`ProducerCore`] (no actor per entity: an open lane costs its core and what is in flight on
//! it), and ACKs a message to the producer once the entity's stream confirmed it.
//!
//! Each lane's stream has id `<producer id>/<lane number, 16 hex digits>` and the token
//! [`sub_stream_token`] of the producer's token and the entity id, so that its messages'
//! origins ([`EntityEnvelope::origin`]: the producer's id, the public id of that token, the
//! message's seq at the producer) are bound to the deliveries that carry them (see
//! [`origin`](crate::protocol::origin)).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use actix::prelude::*;
use hashbrown::HashMap;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use crate::config::ProducerConfig;
use crate::delivery::message::{Acks, ConsumerRef, Deliveries, Delivery, ReplyTo, SingleAck};
use crate::protocol::envelope::{Ack, DeliveryInfo, Incarnation, IncarnationId, ProducerId};
use crate::protocol::intake::{Intake, Taken};
use crate::protocol::origin::{sub_stream_token, SubStreamIds};
use crate::protocol::producer::ProducerCore;
use crate::protocol::trace_context::TraceContext;
use crate::runtime::after_drain::after_each_drain;
use crate::runtime::alarm::{self, Alarm};
use crate::runtime::random::random_u64;
use crate::sharding::capacity;
use crate::sharding::entity_id::{EntityId, ShardId};
use crate::sharding::envelope::{EntityEnvelope, EntityMessage};
use crate::sharding::lanes::{LaneStats, Lanes, Routed};
use crate::sharding::producer_options::Destination;
use crate::sharding::rooms::Rooms;

/// The purpose a lane's token is derived for ([`sub_stream_token`]), with the entity id as key.
pub(crate) const LANE_TOKEN_PURPOSE: &str = "sharded producer entity lane";

/// Asks the router for its counters.
pub(crate) struct GetLaneStats;

impl Message for GetLaneStats {
    type Result = LaneStats;
}

/// Which producer message a lane's message is: what the router ACKs once it is confirmed.
struct Origin {
    /// The producer's token when it sent the message.
    token: Incarnation,
    seq: u64,
    trace_context: Option<TraceContext>,
}

/// A producer message waiting for a lane.
struct Held<T> {
    token: Incarnation,
    window_start: u64,
    trace_context: Option<TraceContext>,
    body: T,
}

/// One entity's stream.
struct Lane<T> {
    core: ProducerCore<EntityEnvelope<T>, Origin>,
    /// The public id of the lane's token: its messages' origins name it.
    origin_id: IncarnationId,
    shard: ShardId,
    /// The deadline this lane has in the router's heap (`None`: none).
    scheduled: Option<Instant>,
    /// Touched since the last flush.
    dirty: bool,
}

/// The router between a sharded producer and its entities.
pub(crate) struct ShardRouter<T: Clone + Send + 'static> {
    intake: Intake,
    lanes: Lanes<Lane<T>, Held<T>>,
    destination: Destination<T>,
    /// One reference per shard, made on the shard's first lane.
    by_shard: HashMap<ShardId, ConsumerRef<EntityEnvelope<T>>>,
    shards: u32,
    producer_id: ProducerId,
    /// The lanes' ids.
    lane_ids: SubStreamIds,
    entity_stream: ProducerConfig,
    /// Where the producer wants its ACKs (its deliveries say).
    reply_to: Option<ReplyTo>,
    /// Where the entities send the lanes' ACKs: this router.
    own_reply_to: Option<ReplyTo>,
    acks: Vec<Ack>,
    rooms: Arc<Rooms>,
    /// Lanes touched since the last flush, by number.
    dirty: Vec<u64>,
    /// Retransmission deadlines of the lanes, earliest first (an entry whose lane has another
    /// deadline by now is skipped).
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Deliveries of one flush, by shard.
    outgoing: HashMap<ShardId, Vec<Delivery<EntityEnvelope<T>>>>,
    /// Seeds the lanes' retransmission jitter.
    rng: SmallRng,
    alarm: Alarm,
    /// Resolves when the producer stopped: the router stops then.
    producer_stopped: Option<Pin<Box<dyn Future<Output = ()>>>>,
    #[cfg(feature = "metrics")]
    meter: crate::sharding::metrics::LanesMeter,
}

impl<T: Clone + Send + 'static> ShardRouter<T> {
    pub(crate) fn new(
        producer_id: ProducerId,
        options: RouterOptions<T>,
        producer_stopped: impl Future<Output = ()> + 'static,
    ) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            meter: crate::sharding::metrics::LanesMeter::new(
                options
                    .label
                    .as_deref()
                    .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
            ),
            intake: Intake::default(),
            // Numbered from a random start: lane ids of two lives never meet.
            lanes: Lanes::new(options.max_lanes, options.cleanup_after, random_u64()),
            destination: options.destination,
            by_shard: HashMap::new(),
            shards: options.shards,
            lane_ids: SubStreamIds::new(&producer_id),
            producer_id,
            entity_stream: options.entity_stream,
            reply_to: None,
            own_reply_to: None,
            acks: Vec::new(),
            rooms: options.rooms,
            dirty: Vec::new(),
            deadlines: BinaryHeap::new(),
            outgoing: HashMap::new(),
            rng: SmallRng::seed_from_u64(random_u64()),
            alarm: Alarm::default(),
            producer_stopped: Some(Box::pin(producer_stopped)),
        }
    }

    /// The router's consumer ref, for its producer.
    pub(crate) fn consumer_ref(addr: &Addr<Self>) -> ConsumerRef<EntityMessage<T>> {
        ConsumerRef::batching(addr.clone().recipient(), addr.clone().recipient())
    }

    /// Takes a message from the producer (a copy of a held one changes nothing) and hands it
    /// to its entity's lane, or lets it wait for one.
    fn take(&mut self, delivery: Delivery<EntityMessage<T>>) {
        let (token, seq) = (delivery.incarnation, delivery.seq);
        self.reply_to = delivery.reply_to.or(self.reply_to.take());
        match self.intake.take(token, seq, delivery.window_start) {
            Taken::New { restarted, .. } => {
                if restarted {
                    self.restart();
                }
            }
            Taken::Copy => return,
            Taken::AckAgain => {
                self.acks.push(self.ack(token, seq));
                return;
            }
        }
        self.intake.hold(seq);
        let EntityMessage { entity_id, body } = delivery.body;
        let held = Held {
            token,
            window_start: delivery.window_start,
            trace_context: delivery.trace_context,
            body,
        };
        let Self {
            lanes,
            lane_ids,
            entity_stream,
            rng,
            shards,
            producer_id,
            dirty,
            ..
        } = self;
        let open = |number, entity: &EntityId, held: &Held<T>| {
            open_lane(
                lane_ids,
                entity_stream,
                rng,
                *shards,
                held.token,
                entity,
                number,
            )
        };
        if let Some(routed) = lanes.route(entity_id, seq, held, open) {
            Self::hand_to_lane(producer_id, *shards, dirty, routed);
        }
    }

    /// Puts a routed message on its lane.
    fn hand_to_lane(
        producer_id: &ProducerId,
        shards: u32,
        dirty: &mut Vec<u64>,
        routed: Routed<'_, Lane<T>, Held<T>>,
    ) {
        let Routed {
            number,
            stream: lane,
            previous,
            seq,
            entity,
            message,
        } = routed;
        let origin = DeliveryInfo {
            producer_id: producer_id.clone(),
            incarnation: lane.origin_id,
            seq,
            window_start: message.window_start,
            trace_context: message.trace_context.clone(),
            first_seq: None,
        };
        let envelope = EntityEnvelope {
            entity_id: entity,
            origin,
            previous,
            body: message.body,
            shards,
        };
        let confirm = Origin {
            token: message.token,
            seq,
            trace_context: message.trace_context,
        };
        // A lane's queue holds the producer's whole window: it never refuses.
        let _ = lane.core.handle_send(envelope, confirm);
        if !std::mem::replace(&mut lane.dirty, true) {
            dirty.push(number);
        }
    }

    /// The producer started a new life: the lanes and waiting messages of the previous one
    /// go (the producer settled their messages itself; their callers give their room back).
    fn restart(&mut self) {
        let (streams, waiting) = self.lanes.restart();
        drop((streams, waiting));
        self.dirty.clear();
        self.deadlines.clear();
    }

    fn ack(&self, token: Incarnation, seq: u64) -> Ack {
        Ack {
            producer_id: self.producer_id.clone(),
            incarnation: token,
            seq,
        }
    }

    /// An ACK from an entity's host for one of the lanes.
    fn handle_ack(&mut self, ack: &Ack) {
        let number = self.lane_ids.number(&ack.producer_id);
        let acted = number.and_then(|number| {
            let lane = self.lanes.get_mut(number)?;
            lane.core
                .handle_ack(ack)
                .then(|| !std::mem::replace(&mut lane.dirty, true))
                .map(|newly_dirty| (number, newly_dirty))
        });
        match acted {
            Some((number, true)) => self.dirty.push(number),
            Some((_, false)) => {}
            None => self.lanes.count(0, 1),
        }
    }

    /// Settles, routes waiting messages, transmits, ACKs to the producer, closes unused
    /// lanes and arms the timer: after each mailbox drain and timer.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        let now = alarm::now();
        self.settle_dirty(now);
        self.route_waiting();
        self.transmit(now);
        if let Some(reply_to) = &self.reply_to
            && !self.acks.is_empty()
        {
            reply_to.do_send_all(self.acks.drain(..));
        }
        while self.lanes.poll_unused(now).is_some() {}
        let next = [
            self.lanes.next_deadline(),
            self.deadlines.peek().map(|Reverse((at, _))| *at),
        ]
        .into_iter()
        .flatten()
        .min();
        self.alarm.arm(next, ctx, |act, ctx| {
            act.alarm.fired();
            act.handle_timeouts(alarm::now());
            act.flush(ctx);
        });
        #[cfg(feature = "metrics")]
        self.meter.publish(&self.lanes.stats());
    }

    /// What the dirty lanes settled: each confirmed message is ACKed to the producer and
    /// gives its entity's room back.
    fn settle_dirty(&mut self, now: Instant) {
        for index in 0..self.dirty.len() {
            let number = self.dirty[index];
            let Some(lane) = self.lanes.get_mut(number) else {
                continue;
            };
            let mut settled = 0;
            while let Some((origin, result)) = lane.core.poll_settled() {
                // Only a stopped lane fails a message (its attempts are unbounded), and lanes
                // stop only with the router.
                if result.is_ok() && self.intake.confirm(origin.token, origin.seq) {
                    self.acks.push(Ack {
                        producer_id: self.producer_id.clone(),
                        incarnation: origin.token,
                        seq: origin.seq,
                    });
                }
                settled += 1;
            }
            if settled > 0 && lane.core.is_idle() {
                // An idle lane costs its core, not the queues of its busiest moment.
                lane.core.shrink_to_fit();
            }
            for _ in 0..settled {
                if let Some(entity) = self.lanes.settled(number, now) {
                    self.rooms.release(&entity);
                }
            }
        }
    }

    /// Gives waiting messages the lanes that are free now.
    fn route_waiting(&mut self) {
        loop {
            let Self {
                lanes,
                lane_ids,
                entity_stream,
                rng,
                shards,
                producer_id,
                dirty,
                ..
            } = self;
            let open = |number, entity: &EntityId, held: &Held<T>| {
                open_lane(
                    lane_ids,
                    entity_stream,
                    rng,
                    *shards,
                    held.token,
                    entity,
                    number,
                )
            };
            let Some(routed) = lanes.poll_waiting(open) else {
                break;
            };
            Self::hand_to_lane(producer_id, *shards, dirty, routed);
        }
    }

    /// Sends what the dirty lanes transmit, batched per shard, and schedules their deadlines.
    fn transmit(&mut self, now: Instant) {
        let Some(reply_to) = self.own_reply_to.clone() else {
            return;
        };
        let mut retransmitted = 0;
        for number in self.dirty.drain(..) {
            let Some(lane) = self.lanes.get_mut(number) else {
                continue;
            };
            lane.dirty = false;
            let batch = self.outgoing.entry(lane.shard).or_default();
            while let Some(transmission) = lane
                .core
                .poll_transmit_with(now, |origin| origin.trace_context.clone())
            {
                if transmission.attempt > 1 {
                    retransmitted += 1;
                }
                batch.push(Delivery::from_transmission(transmission, reply_to.clone()));
            }
            if let Some(deadline) = lane.core.next_deadline()
                && lane.scheduled.is_none_or(|scheduled| deadline < scheduled)
            {
                lane.scheduled = Some(deadline);
                self.deadlines.push(Reverse((deadline, number)));
            }
        }
        self.lanes.count(retransmitted, 0);
        for (shard, batch) in &mut self.outgoing {
            if batch.is_empty() {
                continue;
            }
            let destination = &self.destination;
            let target = self
                .by_shard
                .entry(*shard)
                .or_insert_with(|| destination(*shard));
            target.do_send_all(batch.drain(..));
        }
        capacity::shrink_map(&mut self.outgoing);
    }

    /// Lets the lanes whose deadline passed retransmit.
    fn handle_timeouts(&mut self, now: Instant) {
        while let Some(&Reverse((at, number))) = self.deadlines.peek() {
            if at > now {
                break;
            }
            self.deadlines.pop();
            let Some(lane) = self.lanes.get_mut(number) else {
                continue; // closed since
            };
            if lane.scheduled != Some(at) {
                continue; // an earlier entry of this lane was handled
            }
            lane.scheduled = None;
            lane.core.handle_timeout(now);
            if !std::mem::replace(&mut lane.dirty, true) {
                self.dirty.push(number);
            }
        }
    }
}

/// A new lane for `entity`, numbered `number`: its core, under the token derived from the
/// producer's `token` and the entity id.
fn open_lane<T: Clone>(
    lane_ids: &SubStreamIds,
    entity_stream: &ProducerConfig,
    rng: &mut SmallRng,
    shards: u32,
    token: Incarnation,
    entity: &EntityId,
    number: u64,
) -> Lane<T> {
    let lane_token = sub_stream_token(token, LANE_TOKEN_PURPOSE, entity.as_str().as_bytes());
    let config = ProducerConfig {
        producer_id: Some(lane_ids.id(number)),
        ..entity_stream.clone()
    };
    Lane {
        core: ProducerCore::seeded(&config, lane_token, random_u64)
            .with_jitter_seed(rng.next_u64()),
        origin_id: lane_token.id(),
        shard: entity.shard(shards),
        scheduled: None,
        dirty: false,
    }
}

/// What a router is made of, besides its producer.
pub(crate) struct RouterOptions<T: Send + 'static> {
    pub(crate) destination: Destination<T>,
    pub(crate) shards: u32,
    pub(crate) max_lanes: usize,
    pub(crate) cleanup_after: std::time::Duration,
    pub(crate) entity_stream: ProducerConfig,
    pub(crate) rooms: Arc<Rooms>,
    /// The label of its metrics: the producer's fixed id.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) label: Option<String>,
}

// The router is never structurally pinned: a body type that is not `Unpin` is fine.
impl<T: Clone + Send + 'static> Unpin for ShardRouter<T> {}

impl<T: Clone + Send + 'static> Actor for ShardRouter<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        self.own_reply_to = Some(ReplyTo::batching(
            addr.clone().recipient(),
            addr.recipient(),
        ));
        if let Some(stopped) = self.producer_stopped.take() {
            ctx.spawn(stopped.into_actor(self).map(|_, _, ctx| ctx.stop()));
        }
        after_each_drain(ctx, |act, ctx, _| {
            act.flush(ctx);
            Poll::Pending
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // The lanes end with the router; the producer settles its messages itself.
        self.own_reply_to = None;
    }
}

impl<T: Clone + Send + 'static> Handler<Delivery<EntityMessage<T>>> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, delivery: Delivery<EntityMessage<T>>, _: &mut Context<Self>) {
        self.take(delivery);
    }
}

impl<T: Clone + Send + 'static> Handler<Deliveries<EntityMessage<T>>> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, deliveries: Deliveries<EntityMessage<T>>, _: &mut Context<Self>) {
        for delivery in deliveries.0 {
            self.take(delivery);
        }
    }
}

impl<T: Clone + Send + 'static> Handler<SingleAck> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
        self.handle_ack(&ack);
    }
}

impl<T: Clone + Send + 'static> Handler<Acks> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, Acks(acks): Acks, _: &mut Context<Self>) {
        for ack in &acks {
            self.handle_ack(ack);
        }
    }
}

impl<T: Clone + Send + 'static> Handler<GetLaneStats> for ShardRouter<T> {
    type Result = MessageResult<GetLaneStats>;

    fn handle(&mut self, _: GetLaneStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.lanes.stats())
    }
}
