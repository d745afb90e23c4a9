//! The carrier: one NATS client, the consumers exposed on subjects, the references that
//! publish to subjects, and the ACK inbox that routes ACKs back to their producers.

use std::sync::{Arc, Mutex};

use async_nats::{Client, Subject};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::codec::schema::{BodySchema, Schemas};
use crate::codec::MAX_ENCODED_BYTES;
use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::message::{ConsumerRef, Delivery};
use crate::runtime::error_chain::ErrorChain;
use crate::runtime::random::random_u64;
use crate::runtime::shutdown::{GracefulStop, StopFuture};
use crate::tcp::frame::CHUNK_FRAME_OVERHEAD;
use crate::tcp::inbound::ExposedConsumer;
use crate::tcp::routes::Routes;
use crate::tcp::stats::Warnings;

use super::inbound::serve;
use super::options::NatsOptions;
use super::publisher::Publisher;
use super::shared::{Destination, Sending, Serving, Shared};
use super::stats::{Counters, NatsStats};
use super::subject::{check_group, check_subject, SubjectError};

/// Why the carrier could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// Connecting to the server failed (the client's error, with its causes in the message).
    #[error("cannot connect to NATS: {}", ErrorChain(&**.0))]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The server refused a subscription, or did not confirm it (the client's error, with its
    /// causes in the message).
    #[error("cannot subscribe to {subject:?}: {}", ErrorChain(&**.source))]
    Subscribe {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A subject this carrier cannot use.
    #[error("invalid subject {subject:?}: {why}")]
    InvalidSubject {
        /// The subject.
        subject: String,
        /// What is wrong with it.
        why: SubjectError,
    },
    /// A queue group name this carrier cannot use.
    #[error("invalid queue group {group:?}: {why}")]
    InvalidGroup {
        /// The name.
        group: String,
        /// What is wrong with it.
        why: SubjectError,
    },
    /// A consumer is exposed on this subject by this carrier already.
    #[error("a consumer is exposed on {0:?} already")]
    Taken(String),
    /// The carrier was stopped.
    #[error("the NATS carrier was stopped")]
    Stopped,
}

/// A destination while a reference to it lives.
struct Reference {
    owner: Arc<Owner>,
    destination: Arc<Destination>,
}

impl Drop for Reference {
    fn drop(&mut self) {
        let reply = self.destination.reply.as_str();
        self.owner.0.destinations().remove(reply);
    }
}

/// What the carrier's handles share: when the last handle, and the last reference from
/// [`NatsCarrierHandle::consumer_ref`], is dropped, the carrier stops.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.cancel.cancel();
    }
}

/// A process's endpoint for reliable delivery over NATS. Cheap to clone.
///
/// It runs until [`stop`](NatsCarrierHandle::stop), until the arbiter that started it stops, or
/// until its last handle is dropped: its clones and the [`ConsumerRef`]s from
/// [`consumer_ref`](NatsCarrierHandle::consumer_ref). Consumers exposed on it do not keep it
/// running.
///
/// ```no_run
/// use actix_delivery::nats::{NatsCarrierHandle, NatsOptions};
/// use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // On every machine, one carrier per process:
/// let carrier = NatsCarrierHandle::connect("nats://127.0.0.1:4222", NatsOptions::default()).await?;
///
/// // Where orders are handled (any number of processes, one queue group):
/// let consumer = ReliableDelivery::consumer(
///     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
///         println!("{order}");
///         Ok::<(), std::io::Error>(())
///     }))
///     .build()?,
/// );
/// carrier.expose_in_group("shop.orders", "order-workers", &consumer).await?;
///
/// // Where orders come from:
/// let orders = carrier.consumer_ref::<String>("shop.orders")?;
/// let producer = ReliableDelivery::producer(ProducerOptions::builder(orders).build()?);
/// producer.send("espresso".to_string()).await?; // confirmed by a consumer of the group
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsCarrierHandle(Arc<Owner>);

impl NatsCarrierHandle {
    /// Connects to the server(s) at `url` (e.g. `nats://127.0.0.1:4222`, or several,
    /// comma-separated) without credentials, and starts the carrier on the current arbiter.
    /// For credentials, TLS or other client settings use [`with_client`](Self::with_client).
    ///
    /// # Errors
    /// [`NatsError::Connect`], or [`NatsError::Subscribe`] if the ACK inbox cannot be
    /// subscribed.
    ///
    /// # Panics
    /// Outside a running Actix system (or arbiter).
    pub async fn connect(url: &str, options: NatsOptions) -> Result<Self, NatsError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|err| NatsError::Connect(Box::new(err)))?;
        Self::with_client(client, options).await
    }

    /// Starts the carrier on the current arbiter over a client the application connected
    /// (`async_nats::ConnectOptions`: user and password, token, NKey, credentials file, TLS).
    /// The client's reconnection is the carrier's: while the server is away, deliveries and
    /// ACKs are dropped once the client's and the carrier's buffers are full, and the
    /// producers' retransmission covers the gap.
    ///
    /// # Errors
    /// [`NatsError::Subscribe`] if the ACK inbox cannot be subscribed.
    ///
    /// # Panics
    /// Outside a running Actix system (or arbiter).
    pub async fn with_client(client: Client, options: NatsOptions) -> Result<Self, NatsError> {
        let inbox = Subject::from(client.new_inbox());
        let acks = subscribe(&client, &Subject::from(format!("{inbox}.*")), None).await?;
        let server_max = match client.server_info().max_payload {
            0 => MAX_ENCODED_BYTES as usize, // not announced
            max => max,
        };
        if !inbox.as_str().starts_with(&options.config.reply_prefix) {
            log::warn!(
                "this carrier's inbox {inbox} is not under its reply_prefix {:?}: carriers \
                 with that prefix refuse its deliveries",
                options.config.reply_prefix
            );
        }
        #[cfg(feature = "metrics")]
        let meter = crate::nats::metrics::NatsMeter::new(
            options
                .metrics_label
                .as_deref()
                .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
        );
        let max_published = options.config.max_frame_length.min(server_max);
        let shared = Arc::new(Shared {
            publisher: Publisher::new(
                options.config.max_output_bytes,
                max_published,
                options.config.wire_version,
            ),
            max_received: server_max,
            max_published,
            sending: Mutex::new(Sending {
                routes: Routes::new(options.config.max_routes),
                scratch: Vec::new(),
            }),
            client,
            options,
            counters: Counters::default(),
            #[cfg(feature = "metrics")]
            meter: Mutex::new(meter),
            warnings: Warnings::default(),
            cancel: CancellationToken::new(),
            arbiter: actix::Arbiter::current(),
            inbox,
            probe_key: random_u64(),
            destinations: Mutex::default(),
            exposed: Mutex::default(),
            schemas: Schemas::default(),
        });
        let publisher = shared.clone();
        shared.arbiter.spawn(async move {
            let shared = &publisher;
            let client = shared.client.clone();
            shared
                .publisher
                .run(
                    client,
                    &shared.counters,
                    &shared.cancel,
                    #[cfg(feature = "metrics")]
                    &|| shared.publish(),
                )
                .await;
        });
        shared
            .arbiter
            .spawn(super::acks::receive(shared.clone(), acks));
        Ok(Self(Arc::new(Owner(shared))))
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.0 .0
    }

    /// Makes `consumer` receive the deliveries published to `subject`. Bodies arrive encoded
    /// and are read as `T` as its [`body_schema`](Self::body_schema) says; a delivery whose
    /// body cannot be read becomes a dead letter at the consumer
    /// ([`DeadLetterReason::UndecodableBody`](crate::DeadLetterReason),
    /// [`IncompatibleBody`](crate::DeadLetterReason::IncompatibleBody); no ACK).
    /// Returns once the server has the subscription. When the consumer stops for good, the
    /// carrier unsubscribes.
    ///
    /// # Errors
    /// [`NatsError::InvalidSubject`] (empty, over 256 bytes, whitespace, an empty token, a
    /// wildcard), [`NatsError::Taken`], [`NatsError::Stopped`], or [`NatsError::Subscribe`].
    pub async fn expose<T>(
        &self,
        subject: &str,
        consumer: &ConsumerHandle<T>,
    ) -> Result<(), NatsError>
    where
        T: DeserializeOwned + Send + 'static,
    {
        self.expose_as(subject, None, consumer).await
    }

    /// Like [`expose`](Self::expose), as one member of the queue group `group`: the server
    /// hands each published batch to one member of the group. Members in several processes
    /// share the load and take over from each other: when one dies (or its consumer stops
    /// for good: the carrier then leaves the group), its unconfirmed messages are
    /// retransmitted and reach a live member. A producer's messages are then spread over the
    /// members, so the consumer's in-memory duplicate filter holds per member only; for
    /// effectively-once across members use a persistent consumer on a shared journal (see
    /// the module documentation).
    ///
    /// # Errors
    /// As [`expose`](Self::expose), and [`NatsError::InvalidGroup`].
    pub async fn expose_in_group<T>(
        &self,
        subject: &str,
        group: &str,
        consumer: &ConsumerHandle<T>,
    ) -> Result<(), NatsError>
    where
        T: DeserializeOwned + Send + 'static,
    {
        check_group(group).map_err(|why| NatsError::InvalidGroup {
            group: group.to_owned(),
            why,
        })?;
        self.expose_as(subject, Some(group), consumer).await
    }

    async fn expose_as<T>(
        &self,
        subject: &str,
        group: Option<&str>,
        consumer: &ConsumerHandle<T>,
    ) -> Result<(), NatsError>
    where
        T: DeserializeOwned + Send + 'static,
    {
        let shared = self.shared();
        let name = checked(subject)?;
        let serving = {
            let mut exposed = shared.exposed();
            if shared.cancel.is_cancelled() {
                return Err(NatsError::Stopped);
            }
            if exposed.by_subject.contains_key(subject) {
                return Err(NatsError::Taken(subject.to_owned()));
            }
            exposed.next_generation += 1;
            let serving = Serving {
                subject: subject.to_owned(),
                generation: exposed.next_generation,
                stop: shared.cancel.child_token(),
            };
            let entry = (serving.generation, serving.stop.clone());
            exposed.by_subject.insert(subject.to_owned(), entry);
            serving
        };
        let subscriber = match subscribe(&shared.client, &name, group).await {
            Ok(subscriber) => subscriber,
            Err(err) => {
                shared.exposure_ended(&serving);
                return Err(err);
            }
        };
        let consumer = Arc::new(ExposedConsumer(consumer.clone()));
        let served = serve(shared.clone(), subscriber, consumer, serving);
        #[cfg(feature = "tracing")]
        let served = tracing::Instrument::instrument(
            served,
            crate::telemetry::spans::subscription(subject, group),
        );
        shared.arbiter.spawn(served);
        Ok(())
    }

    /// Stops receiving on `subject` (unsubscribes); whether a consumer was exposed there.
    pub fn unexpose(&self, subject: &str) -> bool {
        let exposure = self.shared().exposed().by_subject.remove(subject);
        exposure.map(|(_, stop)| stop.cancel()).is_some()
    }

    /// A reference to the consumer(s) exposed on `subject`, for a normal producer. Deliveries are
    /// encoded once per message (retransmissions reuse the bytes), published in batches that fit
    /// the server's `max_payload`, with a reply subject of this carrier's inbox for their ACKs, one
    /// of this reference's own. When nobody listens on the subject they are lost (counted in
    /// [`NatsStats::no_responders`] when the server says so), and the producer retransmits them;
    /// once the carrier stopped, they are dropped and counted as unsendable.
    ///
    /// # Errors
    /// [`NatsError::InvalidSubject`].
    pub fn consumer_ref<T>(&self, subject: &str) -> Result<ConsumerRef<T>, NatsError>
    where
        T: Serialize + Send + 'static,
    {
        let subject = checked(subject)?;
        let shared = self.shared();
        let token = random_u64();
        let destination = Arc::new(Destination {
            subject,
            reply: Subject::from(format!("{}.{token:016x}", shared.inbox)),
            notices: Mutex::default(),
        });
        shared
            .destinations()
            .insert(destination.reply.to_string(), destination.clone());
        // The reference is a handle too: the carrier runs while a producer can send through it.
        let reference = Arc::new(Reference {
            owner: self.0.clone(),
            destination,
        });
        let chunks_to = reference.clone();
        // One byte of each message is the protocol version.
        let max_chunk = shared
            .max_published
            .saturating_sub(1 + CHUNK_FRAME_OVERHEAD);
        let encoding = shared.clone();
        Ok(ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
            reference.owner.0.send(&reference.destination, deliveries);
        })
        .with_chunks(move |chunks| {
            chunks_to
                .owner
                .0
                .send_chunks(&chunks_to.destination, chunks);
        })
        .with_transport(max_chunk, Arc::new(move || encoding.schemas.of::<T>())))
    }

    /// Declares how bodies of `T` go over NATS from now on, for the consumers of `T` this
    /// carrier exposes and the references to consumers of `T` it hands out: the codec they
    /// are written in, their schema version, and the upcaster of older versions (see
    /// [`BodySchema`], with an example). Without one, `T` is written in
    /// [`DEFAULT_WIRE_CODEC`](crate::tcp::DEFAULT_WIRE_CODEC) at version 1. Declare it
    /// before the first delivery (bodies kept for retransmission are sent as they were
    /// encoded); a second declaration replaces the first.
    pub fn body_schema<T: 'static>(&self, schema: BodySchema<T>) {
        self.shared().schemas.declare(schema);
    }

    /// The NATS client the carrier uses.
    pub fn client(&self) -> &Client {
        &self.shared().client
    }

    /// The carrier's counters.
    pub fn stats(&self) -> NatsStats {
        let shared = self.shared();
        let mut stats = shared.counters.snapshot();
        stats.output_high_water = shared.publisher.high_water() as u64;
        let sending = shared.sending();
        stats.routes = sending.routes.len() as u64;
        stats.cached_bodies = sending.routes.bodies() as u64;
        stats
    }

    /// Stops the carrier for good: unsubscribes every exposed subject and stops publishing.
    /// The client stays connected while the application holds a clone of it.
    pub fn stop(&self) {
        self.shared().cancel.cancel();
    }
}

fn checked(subject: &str) -> Result<Subject, NatsError> {
    check_subject(subject).map_err(|why| NatsError::InvalidSubject {
        subject: subject.to_owned(),
        why,
    })?;
    Ok(Subject::from(subject))
}

/// Subscribes and waits until the server has the subscription.
async fn subscribe(
    client: &Client,
    subject: &Subject,
    group: Option<&str>,
) -> Result<async_nats::Subscriber, NatsError> {
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| NatsError::Subscribe {
        subject: subject.to_string(),
        source,
    };
    let subscriber = match group {
        Some(group) => {
            client
                .queue_subscribe(subject.clone(), group.to_owned())
                .await
        }
        None => client.subscribe(subject.clone()).await,
    }
    .map_err(|err| failed(Box::new(err)))?;
    round_trip(client).await.map_err(failed)?;
    Ok(subscriber)
}

/// Waits until the server has processed what the client sent before (`flush` only writes it
/// to the socket): a message to an inbox of the client's own comes back.
async fn round_trip(client: &Client) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let probe = Subject::from(client.new_inbox());
    let mut echo = client.subscribe(probe.clone()).await?;
    client.publish(probe, bytes::Bytes::new()).await?;
    client.flush().await?;
    let echoed = tokio::time::timeout(std::time::Duration::from_secs(10), echo.next()).await;
    let _ = echo.unsubscribe().await;
    match echoed {
        Ok(Some(_)) => Ok(()),
        _ => Err("the server did not confirm the subscription within 10 s".into()),
    }
}

impl GracefulStop for NatsCarrierHandle {
    /// [`stop`](Self::stop): done at once.
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        Box::pin(std::future::ready(Ok(())))
    }
}
