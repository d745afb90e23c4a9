//! The application's side of a sharded producer: messages addressed to entities by id.

use std::future::Future;
use std::sync::Arc;

use actix::prelude::*;
use futures_util::future::Either;
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::delivery::confirmation::Confirmation;
use crate::delivery::options::ProducerOptions;
use crate::delivery::producer::start_producer;
use crate::delivery::producer::ProducerHandle;
use crate::delivery::stored::Stored;
use crate::durable::producer::start_durable_producer;
use crate::durable::DurableOptions;
use crate::error::{DeliveryError, Failure, OptionsError, StartError, TellError};
use crate::runtime::shutdown::{once_stopped_or, GracefulStop, StopFuture};
use crate::sharding::entity_id::EntityId;
use crate::sharding::envelope::EntityMessage;
use crate::sharding::lanes::LaneStats;
use crate::sharding::producer_options::{check_sharded_producer_id, ShardedProducerOptions};
use crate::sharding::rooms::Rooms;
use crate::sharding::router::{GetLaneStats, RouterOptions, ShardRouter};

/// A sharded producer: sends messages to entities by id, over one reliable stream per
/// destination entity (so that a slow entity does not hold the others back, and each entity
/// sees one gapless stream per producer), and confirms a message once its entity did.
/// Cheap to clone; when the last clone is dropped, the producer finishes what it holds and
/// stops, and its streams with it.
///
/// Inside, an ordinary producer (plain, or [durable](crate::durable)) numbers the messages
/// and holds them (`window_size`, then `max_pending`), and its router, in process, drives a
/// stream per entity (a protocol core, not an actor: about 1 KiB while nothing is in flight),
/// opened on the entity's first message and closed after `cleanup_unused_after` without one
/// in flight; at most `max_open_lanes` are open (see
/// [`ShardedProducerConfig::max_open_lanes`](crate::sharding::ShardedProducerConfig)). A
/// stream's id is `<producer id>/<lane number>`, and its token is derived from the producer's
/// and the entity id ([`sub_stream_token`](crate::protocol::origin::sub_stream_token)). Each
/// message carries its stable id at the producer
/// ([`EntityEnvelope::origin`](crate::sharding::EntityEnvelope)), bound to that token, which
/// the entity records as processed, and its predecessor to the same entity (for
/// `must_follow`). Its metrics are one set of series under the producer's fixed id (or
/// `"default"`), whatever the number of entities.
pub struct ShardedProducerHandle<T: Clone + Send + 'static> {
    producer: ProducerHandle<EntityMessage<T>>,
    router: Addr<ShardRouter<T>>,
    rooms: Arc<Rooms>,
}

impl<T: Clone + Send + 'static> ShardedProducerHandle<T> {
    pub(crate) fn start(options: ShardedProducerOptions<T>) -> Self {
        let (ctx, front) = Self::front(&options);
        let producer = start_producer(front);
        Self::run(ctx, producer, options)
    }

    pub(crate) fn start_durable(
        options: ShardedProducerOptions<T>,
        durable: DurableOptions<EntityMessage<T>>,
    ) -> Result<Self, OptionsError>
    where
        T: Serialize + DeserializeOwned,
    {
        check_sharded_producer_id(durable.producer_id.as_str())?;
        let (ctx, front) = Self::front(&options);
        let producer = start_durable_producer(front, durable)?;
        Ok(Self::run(ctx, producer, options))
    }

    /// The router's context (not started yet: its producer needs its address first) and the
    /// options of the producer that feeds it.
    fn front(
        options: &ShardedProducerOptions<T>,
    ) -> (Context<ShardRouter<T>>, ProducerOptions<EntityMessage<T>>) {
        let ctx = Context::new();
        let consumer = ShardRouter::consumer_ref(&ctx.address());
        let front = ProducerOptions::from_config(consumer, options.producer.clone())
            .expect("the producer settings were validated when the options were built");
        (ctx, front)
    }

    fn run(
        ctx: Context<ShardRouter<T>>,
        producer: ProducerHandle<EntityMessage<T>>,
        options: ShardedProducerOptions<T>,
    ) -> Self {
        let rooms = Arc::new(Rooms::new(options.config.max_pending_per_entity));
        let router_options = RouterOptions {
            destination: options.destination,
            shards: options.config.shards,
            max_lanes: options.config.max_open_lanes,
            cleanup_after: options.config.cleanup_unused_after,
            entity_stream: options.entity_stream,
            rooms: rooms.clone(),
            label: options.producer.producer_id.clone(),
        };
        let router = ShardRouter::new(
            producer.producer_id().clone(),
            router_options,
            FutureExt::map(producer.stopped(), drop), // how it ended is the handle's to tell
        );
        let router = ctx.run(router);
        Self {
            producer,
            router,
            rooms,
        }
    }

    /// Hands `body` for `entity` over without waiting; `confirm` fires exactly once with the
    /// outcome (`Ok` once the entity confirmed it).
    ///
    /// # Errors
    /// [`TellError::QueueFull`] when `entity` has `max_pending_per_entity` unconfirmed
    /// messages, or the producer `max_pending` queued ones; [`TellError::Stopped`] when the
    /// producer has stopped. Both hand the body back, and `confirm` fires with the matching
    /// [`DeliveryError`].
    pub fn tell(
        &self,
        entity: EntityId,
        body: T,
        confirm: impl Into<Confirmation>,
    ) -> Result<(), TellError<T>> {
        let confirm = confirm.into();
        if !self.rooms.try_reserve(&entity) {
            confirm.settle(Err(DeliveryError::QueueFull));
            return Err(TellError::QueueFull(body));
        }
        let message = EntityMessage {
            entity_id: entity.clone(),
            body,
        };
        self.producer.tell(message, confirm).map_err(|refused| {
            self.rooms.release(&entity);
            refused.map(|message| message.body)
        })
    }

    /// Sends `body` to `entity` and resolves once the entity confirmed it. The message is
    /// queued when this is called if `entity` has room; otherwise the future waits for room
    /// for that entity (others are not held back), then for the producer's.
    ///
    /// # Errors
    /// The [`DeliveryError`] that settled the message (the producer stopped).
    pub fn send(
        &self,
        entity: EntityId,
        body: T,
    ) -> impl Future<Output = Result<(), DeliveryError>> + 'static + use<T> {
        let message = EntityMessage {
            entity_id: entity.clone(),
            body,
        };
        let now = if self.rooms.try_reserve(&entity) {
            Either::Left(self.producer.send(message))
        } else {
            Either::Right((self.clone(), message))
        };
        let rooms = self.rooms.clone();
        async move {
            let result = match now {
                Either::Left(sent) => sent.await,
                Either::Right((handle, message)) => {
                    rooms.reserve(&entity).await;
                    handle.producer.send(message).await
                }
            };
            if result.is_err() {
                rooms.release(&entity);
            }
            result
        }
    }

    /// Hands `body` for `entity` to a durable producer and resolves once it is stored (from
    /// then on the producer owns it, across crashes); [`Stored::confirmed`] waits for the
    /// entity. Waits for room like [`send`](Self::send).
    ///
    /// # Errors
    /// [`DeliveryError::NotDurable`] for a producer without a journal; the producer stopped,
    /// or its journal failed before the message was stored.
    pub fn store(
        &self,
        entity: EntityId,
        body: T,
    ) -> impl Future<Output = Result<Stored, DeliveryError>> + 'static + use<T> {
        let handle = self.clone();
        async move {
            handle.rooms.reserve(&entity).await;
            let message = EntityMessage {
                entity_id: entity.clone(),
                body,
            };
            let stored = handle.producer.store(message).await;
            if stored.is_err() {
                handle.rooms.release(&entity);
            }
            stored
        }
    }

    /// Resolves once every message handed over so far is settled.
    pub fn idle(&self) -> impl Future<Output = ()> + 'static + use<T> {
        self.producer.idle()
    }

    /// Stops the producer (a durable one gracefully, see [`ProducerHandle::stop`]) and its
    /// entity streams.
    pub fn stop(&self) {
        self.producer.stop();
    }

    /// Resolves once the producer has opened (a durable one: its stream); see
    /// [`ProducerHandle::opened`].
    ///
    /// # Errors
    /// As [`ProducerHandle::opened`].
    pub fn opened(&self) -> impl Future<Output = Result<(), StartError>> + 'static + use<T> {
        self.producer.opened()
    }

    /// Resolves once the producer has stopped for good; see [`ProducerHandle::stopped`].
    ///
    /// # Errors
    /// As [`ProducerHandle::stopped`]: the failure that stopped it, if it was not asked to.
    pub fn stopped(&self) -> impl Future<Output = Result<(), Failure>> + 'static + use<T> {
        self.producer.stopped()
    }

    /// The producer that numbers and holds the messages (its stats, its id).
    pub fn producer(&self) -> &ProducerHandle<EntityMessage<T>> {
        &self.producer
    }

    /// The counters of the entity streams: open now, opened, closed, in flight.
    ///
    /// # Errors
    /// [`MailboxError`] if the producer has stopped.
    pub async fn lane_stats(&self) -> Result<LaneStats, MailboxError> {
        self.router.send(GetLaneStats).await
    }
}

impl<T: Clone + Send + 'static> Clone for ShardedProducerHandle<T> {
    fn clone(&self) -> Self {
        Self {
            producer: self.producer.clone(),
            router: self.router.clone(),
            rooms: self.rooms.clone(),
        }
    }
}

impl<T: Clone + Send + 'static> std::fmt::Debug for ShardedProducerHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedProducerHandle")
            .field("producer_id", self.producer.producer_id())
            .finish_non_exhaustive()
    }
}

impl<T: Clone + Send + 'static> GracefulStop for ShardedProducerHandle<T> {
    /// [`stop`](Self::stop), then [`stopped`](Self::stopped).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        once_stopped_or(self.stopped())
    }
}
