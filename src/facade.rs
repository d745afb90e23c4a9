//! `ReliableDelivery`: spawn a producer or a consumer in one call.

use actix::{Actor, ArbiterHandle};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::delivery::consumer::{start_consumer, ConsumerController, ConsumerHandle};
use crate::delivery::options::{ConsumerOptions, ProducerOptions};
use crate::delivery::producer::{start_producer, ProducerHandle};
use crate::durable::producer::start_durable_producer;
use crate::durable::DurableOptions;
use crate::error::OptionsError;
use crate::sharding::{EntityMessage, ShardedProducerHandle, ShardedProducerOptions};
use crate::work_pulling::{WorkPullingHandle, WorkPullingOptions};

/// The entry point: spawns controllers and returns their handles.
///
/// ```
/// use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let consumer = ReliableDelivery::consumer(
///     ConsumerOptions::builder(DeliveryHandler::from_fn(|n: u64| async move {
///         println!("handling {n}");
///         Ok::<(), String>(())
///     }))
///     .build()?,
/// );
/// let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
/// producer.send(42).await?; // resolves once the consumer's handler succeeded and ACKed
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ReliableDelivery;

impl ReliableDelivery {
    /// Starts a consumer on the current arbiter.
    pub fn consumer<T: Send + 'static>(options: ConsumerOptions<T>) -> ConsumerHandle<T> {
        start_consumer(options)
    }

    /// Starts a consumer on another arbiter (thread). The options are built there, by
    /// `options`, because a handler need not be `Send`: the one start function that places a
    /// part itself (a producer's options place it:
    /// [`arbiter`](crate::ProducerOptionsBuilder::arbiter)).
    pub fn consumer_in<T, F>(arbiter: &ArbiterHandle, options: F) -> ConsumerHandle<T>
    where
        T: Send + 'static,
        F: FnOnce() -> ConsumerOptions<T> + Send + 'static,
    {
        let addr = ConsumerController::start_in_arbiter(arbiter, move |_| {
            ConsumerController::new(options())
        });
        ConsumerHandle::new(addr)
    }

    /// Starts a producer on the current arbiter, or on the one its options name
    /// ([`arbiter`](crate::ProducerOptionsBuilder::arbiter)).
    pub fn producer<T: Clone + Send + 'static>(options: ProducerOptions<T>) -> ProducerHandle<T> {
        start_producer(options)
    }

    /// Starts a **durable** producer on the current arbiter (or the one its options name),
    /// under an Actix `Supervisor` (unless
    /// [`stop_on_journal_failure`](crate::durable::DurableOptions::stop_on_journal_failure)): it
    /// stores every message in `durable`'s journal stream before sending it, resumes the
    /// stream's life (incarnation, seq, unsettled messages) when it starts, and after a journal
    /// failure restarts on what the journal holds. [`ProducerHandle::stop`] stops it for good.
    /// See [`crate::durable`].
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid setting of `durable`, or `producer_id` if
    /// `options` fix another id than `durable`'s.
    pub fn durable_producer<T>(
        options: ProducerOptions<T>,
        durable: DurableOptions<T>,
    ) -> Result<ProducerHandle<T>, OptionsError>
    where
        T: Clone + Send + Serialize + DeserializeOwned + 'static,
    {
        start_durable_producer(options, durable)
    }

    /// Starts a **work-pulling** producer on the current arbiter: it sends each job to one of the
    /// workers registered in the options' [`WorkerRegistry`](crate::work_pulling::WorkerRegistry)
    /// that has demand, re-routes the jobs of a worker that leaves or fails them, and confirms a
    /// job once a worker confirmed it (or, with `give_up_after`, settles it given up). See
    /// [`crate::work_pulling`].
    pub fn work_pulling_producer<T: Clone + Send + 'static>(
        options: WorkPullingOptions<T>,
    ) -> WorkPullingHandle<T> {
        WorkPullingHandle::start(options)
    }

    /// Starts a **durable** work-pulling producer on the current arbiter: a
    /// [`durable_producer`](Self::durable_producer) stores each job before the pool routes
    /// it, and after a restart sends its unconfirmed jobs again, under their ids, to the
    /// workers present.
    ///
    /// # Errors
    /// As [`durable_producer`](Self::durable_producer); `producer_id` if the stream's id is
    /// longer than 239 bytes (it prefixes the worker streams' ids).
    pub fn durable_work_pulling_producer<T>(
        options: WorkPullingOptions<T>,
        durable: DurableOptions<T>,
    ) -> Result<WorkPullingHandle<T>, OptionsError>
    where
        T: Clone + Send + Serialize + DeserializeOwned + 'static,
    {
        WorkPullingHandle::start_durable(options, durable)
    }

    /// Starts a **sharded** producer on the current arbiter: it sends each message to the entity it
    /// names, over one reliable stream per entity, through the options' destination (an
    /// [`EntityHostHandle`](crate::sharding::EntityHostHandle)'s consumer, or one per shard), and
    /// confirms a message once its entity did. See [`crate::sharding`].
    pub fn sharded_producer<T: Clone + Send + 'static>(
        options: ShardedProducerOptions<T>,
    ) -> ShardedProducerHandle<T> {
        ShardedProducerHandle::start(options)
    }

    /// Starts a **durable** sharded producer on the current arbiter: one
    /// [`durable_producer`](Self::durable_producer) stream stores every message with the
    /// entity it is for; after a restart its unconfirmed messages are sent again, under their
    /// ids, and each entity recognises the ones it processed before.
    ///
    /// # Errors
    /// As [`durable_producer`](Self::durable_producer); `producer_id` if the stream's id is
    /// longer than 239 bytes (it prefixes the entity streams' ids).
    pub fn durable_sharded_producer<T>(
        options: ShardedProducerOptions<T>,
        durable: DurableOptions<EntityMessage<T>>,
    ) -> Result<ShardedProducerHandle<T>, OptionsError>
    where
        T: Clone + Send + Serialize + DeserializeOwned + 'static,
    {
        ShardedProducerHandle::start_durable(options, durable)
    }
}
