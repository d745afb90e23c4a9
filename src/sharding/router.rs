//! The router of a sharded producer: the consumer (in process) of its producer's messages,
//! it keeps one reliable stream per destination entity ([`Lanes`]) and ACKs a message to the
//! producer once the entity's stream confirmed it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use actix::prelude::*;

use crate::after_drain::after_each_drain;
use crate::alarm::{self, Alarm};
use crate::config::ProducerConfig;
use crate::error::DeliveryError;
use crate::facade::ReliableDelivery;
use crate::message::{ConsumerRef, Deliveries, Delivery, ReplyTo};
use crate::options::ProducerOptions;
use crate::producer::ProducerHandle;
use crate::protocol::envelope::{Ack, DeliveryInfo, Incarnation, ProducerId};
use crate::protocol::intake::{Intake, Taken};
use crate::settlements::{Settlements, TakeSettlements};
use crate::sharding::entity_id::{EntityId, ShardId};
use crate::sharding::envelope::{EntityEnvelope, EntityMessage};
use crate::sharding::lanes::{LaneStats, Lanes};
use crate::sharding::producer_options::Destination;
use crate::sharding::rooms::Rooms;

/// A message's outcome on its entity's stream.
struct LaneSettled {
    entity: EntityId,
    incarnation: Incarnation,
    seq: u64,
    result: Result<(), DeliveryError>,
}

/// Asks the router for its counters.
pub(crate) struct GetLaneStats;

impl Message for GetLaneStats {
    type Result = LaneStats;
}

type Stream<T> = ProducerHandle<EntityEnvelope<T>>;

/// The router between a sharded producer and its entities' streams.
pub(crate) struct ShardRouter<T: Clone + Send + 'static> {
    intake: Intake<()>,
    lanes: Lanes<Stream<T>>,
    destination: Destination<T>,
    /// One reference per shard, made on the shard's first stream.
    by_shard: HashMap<ShardId, ConsumerRef<EntityEnvelope<T>>>,
    shards: u32,
    producer_id: ProducerId,
    entity_stream: ProducerConfig,
    /// Where the producer wants its ACKs (its deliveries say).
    reply_to: Option<ReplyTo>,
    acks: Vec<Ack>,
    rooms: Arc<Rooms>,
    settlements: Arc<Settlements<LaneSettled>>,
    taken: Vec<LaneSettled>,
    alarm: Alarm,
    /// Resolves when the producer stopped: the router stops then.
    producer_stopped: Option<Pin<Box<dyn Future<Output = ()>>>>,
    #[cfg(feature = "metrics")]
    meter: crate::telemetry::metrics::LanesMeter,
}

impl<T: Clone + Send + 'static> ShardRouter<T> {
    pub(crate) fn new(
        producer_id: ProducerId,
        options: RouterOptions<T>,
        producer_stopped: impl Future<Output = ()> + 'static,
    ) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            meter: crate::telemetry::metrics::LanesMeter::new(
                options
                    .label
                    .as_deref()
                    .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
            ),
            intake: Intake::default(),
            lanes: Lanes::new(options.cleanup_after),
            destination: options.destination,
            by_shard: HashMap::new(),
            shards: options.shards,
            producer_id,
            entity_stream: options.entity_stream,
            reply_to: None,
            acks: Vec::new(),
            rooms: options.rooms,
            settlements: Arc::default(),
            taken: Vec::new(),
            alarm: Alarm::default(),
            producer_stopped: Some(Box::pin(producer_stopped)),
        }
    }

    /// The router's consumer ref, for its producer.
    pub(crate) fn consumer_ref(addr: &Addr<Self>) -> ConsumerRef<EntityMessage<T>> {
        ConsumerRef::batching(addr.clone().recipient(), addr.clone().recipient())
    }

    /// Takes a message from the producer (a copy of a held one changes nothing) and hands it
    /// to its entity's stream.
    fn take(&mut self, delivery: Delivery<EntityMessage<T>>, router: &Addr<Self>) {
        let (incarnation, seq) = (delivery.incarnation, delivery.seq);
        self.reply_to = delivery.reply_to.or(self.reply_to.take());
        let id = match self.intake.take(incarnation, seq, delivery.window_start) {
            Taken::New {
                incarnation,
                restarted,
            } => {
                if restarted {
                    self.lanes.restart();
                }
                incarnation
            }
            Taken::Copy => return,
            Taken::AckAgain => {
                self.acks.push(self.ack(incarnation, seq));
                return;
            }
        };
        let EntityMessage { entity_id, body } = delivery.body;
        let origin = DeliveryInfo {
            producer_id: delivery.producer_id,
            incarnation: id,
            seq,
            window_start: delivery.window_start,
            trace_context: delivery.trace_context,
            first_seq: None,
        };
        let Self {
            lanes,
            destination,
            by_shard,
            shards,
            producer_id,
            entity_stream,
            ..
        } = self;
        let open = || {
            let shard = entity_id.shard(*shards);
            let target = by_shard
                .entry(shard)
                .or_insert_with(|| destination(shard))
                .clone();
            let config = ProducerConfig {
                producer_id: Some(format!("{producer_id}/{entity_id}")),
                ..entity_stream.clone()
            };
            let options = ProducerOptions::new(target, config)
                .expect("the id's length and the settings were checked with the options");
            ReliableDelivery::producer(options)
        };
        let (stream, previous) = lanes.route(&entity_id, seq, open);
        let settlements = self.settlements.clone();
        let router = router.clone();
        let entity = entity_id.clone();
        let confirm = move |result| {
            let settled = LaneSettled {
                entity,
                incarnation,
                seq,
                result,
            };
            if settlements.push(settled) {
                router.do_send(TakeSettlements);
            }
        };
        let envelope = EntityEnvelope {
            entity_id,
            origin,
            previous,
            body,
        };
        // Its queue holds the producer's whole window: only a stopped stream refuses, and
        // then the router is stopping (the refusal settles the message as failed).
        let _ = stream.tell(envelope, confirm);
        self.intake.hold(seq, ());
    }

    fn ack(&self, incarnation: Incarnation, seq: u64) -> Ack {
        Ack {
            producer_id: self.producer_id.clone(),
            incarnation,
            seq,
        }
    }

    fn settle(&mut self, settled: LaneSettled) {
        let LaneSettled {
            entity,
            incarnation,
            seq,
            result,
        } = settled;
        self.lanes.settled(&entity, alarm::now());
        // Only a stopped stream fails a message (its attempts are unbounded): the router
        // is stopping, and the producer settles the message itself.
        if result.is_ok() {
            self.intake.confirm(incarnation, seq);
            self.acks.push(self.ack(incarnation, seq));
            self.rooms.release(&entity);
        }
    }

    /// Sends the ACKs of confirmed messages, closes unused streams and arms the timer.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if let Some(reply_to) = &self.reply_to {
            if !self.acks.is_empty() {
                reply_to.do_send_all(self.acks.drain(..));
            }
        }
        let now = alarm::now();
        while let Some((_, stream)) = self.lanes.poll_unused(now) {
            stream.stop();
        }
        self.alarm.arm(self.lanes.next_deadline(), ctx, |act, ctx| {
            act.alarm.fired();
            act.flush(ctx);
        });
        #[cfg(feature = "metrics")]
        self.meter.publish(&self.lanes.stats());
    }
}

/// What a router is made of, besides its producer.
pub(crate) struct RouterOptions<T: Send + 'static> {
    pub(crate) destination: Destination<T>,
    pub(crate) shards: u32,
    pub(crate) cleanup_after: std::time::Duration,
    pub(crate) entity_stream: ProducerConfig,
    pub(crate) rooms: Arc<Rooms>,
    /// The label of its metrics: the producer's fixed id.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) label: Option<String>,
}

impl<T: Clone + Send + 'static> Actor for ShardRouter<T> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(stopped) = self.producer_stopped.take() {
            ctx.spawn(stopped.into_actor(self).map(|_, _, ctx| ctx.stop()));
        }
        after_each_drain(ctx, |act, ctx, _| {
            act.flush(ctx);
            Poll::Pending
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        for stream in self.lanes.drain() {
            stream.stop();
        }
    }
}

impl<T: Clone + Send + 'static> Handler<Delivery<EntityMessage<T>>> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, delivery: Delivery<EntityMessage<T>>, ctx: &mut Context<Self>) {
        self.take(delivery, &ctx.address());
    }
}

impl<T: Clone + Send + 'static> Handler<Deliveries<EntityMessage<T>>> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, deliveries: Deliveries<EntityMessage<T>>, ctx: &mut Context<Self>) {
        let router = ctx.address();
        for delivery in deliveries.0 {
            self.take(delivery, &router);
        }
    }
}

impl<T: Clone + Send + 'static> Handler<TakeSettlements> for ShardRouter<T> {
    type Result = ();

    fn handle(&mut self, _: TakeSettlements, _: &mut Context<Self>) {
        let mut taken = std::mem::take(&mut self.taken);
        self.settlements.take(&mut taken);
        for settled in taken.drain(..) {
            self.settle(settled);
        }
        self.taken = taken;
    }
}

impl<T: Clone + Send + 'static> Handler<GetLaneStats> for ShardRouter<T> {
    type Result = MessageResult<GetLaneStats>;

    fn handle(&mut self, _: GetLaneStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.lanes.stats())
    }
}
