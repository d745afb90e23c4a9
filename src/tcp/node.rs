//! The node: one per process (or more), listening for peers, exposing local consumers under
//! names, and handing out references to consumers on other nodes.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::codec::schema::{BodySchema, Schemas};
use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::message::{ConsumerRef, Delivery};
use crate::protocol::envelope::MAX_ID_BYTES;
use crate::runtime::random::random_bytes;
use crate::runtime::shutdown::{GracefulStop, StopFuture};
use crate::tcp::auth::NodeId;
use crate::tcp::context::Context;
use crate::tcp::frame::CHUNK_FRAME_OVERHEAD;
use crate::tcp::handshake::Local;
use crate::tcp::inbound::{listen, ExposedConsumer};
use crate::tcp::options::NodeOptions;
use crate::tcp::outbound::Outbound;
use crate::tcp::peer::PeerAddr;
use crate::tcp::pending::Pending;
use crate::tcp::registry::{Entry, Registry};
use crate::tcp::stats::{NodeStats, Warnings};

/// Why a consumer name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("the consumer name is empty")]
    Empty,
    /// The name is longer than 256 bytes.
    #[error("the consumer name is {0} bytes, more than the 256 allowed")]
    TooLong(usize),
    /// A consumer is exposed under this name already.
    #[error("a consumer is exposed under this name already")]
    Taken,
    /// Identities were given, and peers of this node have none: only nodes with mutual TLS
    /// know their peers' identities.
    #[error("peers of this node have no identity: expose_to needs mutual TLS")]
    NoIdentities,
}

fn check_name(name: &str) -> Result<(), NameError> {
    match name.len() {
        0 => Err(NameError::Empty),
        len if len > MAX_ID_BYTES => Err(NameError::TooLong(len)),
        _ => Ok(()),
    }
}

/// What the node's handles share besides the [`Context`] its tasks hold: the remote
/// addresses it sends to, and the address it listens on.
pub(crate) struct Shared {
    context: Arc<Context>,
    outbound: Mutex<HashMap<PeerAddr, Arc<Outbound>>>,
    local_addr: Option<SocketAddr>,
}

impl std::ops::Deref for Shared {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.context
    }
}

impl Shared {
    /// The remote addresses this node sends to.
    fn outbound(&self) -> MutexGuard<'_, HashMap<PeerAddr, Arc<Outbound>>> {
        self.outbound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the listener and every connection, and lets go of the remote addresses.
    fn shut_down(&self) {
        self.cancel.cancel();
        self.outbound().clear();
    }
}

/// What the node's handles share (the node's tasks hold only [`Shared`]): when the last
/// handle, and the last reference from [`NodeHandle::consumer_ref`], is dropped, the node stops.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.shut_down();
    }
}

/// A process's endpoint for reliable delivery over TCP. Cheap to clone.
///
/// It runs until [`stop`](NodeHandle::stop), until the arbiter that started it stops, or until its
/// last handle is dropped, like an actor whose last `Addr` is gone: the clones of this handle
/// and the [`ConsumerRef`]s from [`consumer_ref`](NodeHandle::consumer_ref) (a producer's reference
/// keeps its node running). Consumers exposed on it do not keep it running: keep a handle for
/// as long as it should listen.
///
/// ```no_run
/// use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret, PeerAddr};
/// use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
///
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let secret = NodeSecret::new(std::env::var("CLUSTER_SECRET")?)?;
/// // On the consumer's machine:
/// let node = NodeHandle::start(
///     NodeOptions::builder()
///         .secret(secret.clone())
///         .listen("0.0.0.0:7100".parse()?)
///         .build()?,
/// )
/// .await?;
/// let consumer = ReliableDelivery::consumer(
///     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
///         println!("{order}");
///         Ok::<(), std::io::Error>(())
///     }))
///     .build()?,
/// );
/// node.expose("orders", &consumer)?;
///
/// // On the producer's machine (a node that only sends need not listen):
/// let node = NodeHandle::start(NodeOptions::builder().secret(secret).build()?).await?;
/// // An address, or a name resolved on every connection attempt ("orders.internal:7100"):
/// let orders = node.consumer_ref::<String>("10.0.0.7:7100".parse::<PeerAddr>()?, "orders")?;
/// let producer = ReliableDelivery::producer(ProducerOptions::builder(orders).build()?);
/// producer.send("espresso".to_string()).await?; // confirmed by the remote consumer
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NodeHandle(Arc<Owner>);

impl NodeHandle {
    /// Starts a node on the current arbiter: binds the listener (if the options name an
    /// address) and runs the node's connections on this arbiter from now on.
    ///
    /// # Errors
    /// The listener could not be bound.
    ///
    /// # Panics
    /// Outside a running Actix system (or arbiter).
    pub async fn start(options: NodeOptions) -> io::Result<NodeHandle> {
        let listener = match options.config.listen {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
            None => None,
        };
        let local_addr = listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let local = Local {
            node_id: NodeId::from_bytes(random_bytes()),
            secret: options.secret().cloned(),
            max_frame_length: u32::try_from(options.config.max_frame_length)
                .expect("validated: at most 16 MiB"),
            versions: Local::VERSIONS,
            wire_version: options.config.wire_version,
        };
        if options.insecure() {
            log::warn!(
                "node {} runs WITHOUT AUTHENTICATION (insecure_no_authentication): anyone who \
                 can reach {local_addr:?} can deliver messages to its consumers, and anyone on \
                 the path can alter its traffic",
                local.node_id
            );
        }
        let max_handshakes = options.config.max_handshakes;
        #[cfg(feature = "metrics")]
        let meter = crate::tcp::metrics::NodeMeter::new(
            options
                .metrics_label
                .as_deref()
                .unwrap_or(crate::telemetry::metrics::DEFAULT_LABEL),
        );
        let context = Arc::new(Context {
            local,
            options,
            counters: Arc::default(),
            #[cfg(feature = "metrics")]
            meter: Mutex::new(meter),
            warnings: Warnings::default(),
            cancel: CancellationToken::new(),
            arbiter: actix::Arbiter::current(),
            inbound_open: AtomicUsize::new(0),
            handshakes: Mutex::new(Pending::new(max_handshakes)),
            schemas: Schemas::default(),
            registry: Registry::default(),
        });
        let shared = Arc::new(Shared {
            context,
            outbound: Mutex::default(),
            local_addr,
        });
        if let Some(listener) = listener {
            log::info!("node {} listens on {local_addr:?}", shared.local.node_id);
            shared
                .arbiter
                .spawn(listen(shared.context.clone(), listener));
        }
        Ok(NodeHandle(Arc::new(Owner(shared))))
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.0 .0
    }

    /// This node's id for this run (random per start).
    pub fn id(&self) -> NodeId {
        self.shared().local.node_id
    }

    /// The address the node listens on (with the port the OS picked for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.shared().local_addr
    }

    /// Makes `consumer` reachable by peers under `name`. Bodies arrive encoded and are decoded
    /// as `T` on arrival; a delivery whose body does not decode becomes a dead letter at the
    /// consumer ([`DeadLetterReason::UndecodableBody`](crate::DeadLetterReason), no ACK),
    /// counted in [`NodeStats::undecodable_bodies`](crate::tcp::NodeStats).
    ///
    /// # Errors
    /// [`NameError`] if the name is empty, longer than 256 bytes, or taken.
    pub fn expose<T>(&self, name: &str, consumer: &ConsumerHandle<T>) -> Result<(), NameError>
    where
        T: DeserializeOwned + Send + 'static,
    {
        self.expose_entry(name, consumer, None)
    }

    /// Like [`expose`](Self::expose), for peers with one of these `identities` only (DNS
    /// names, compared without regard to ASCII case): a node with mutual TLS knows a
    /// connecting peer's identity as the DNS names of its certificate's subject alternative
    /// names. Deliveries from any other peer are refused, counted in
    /// [`NodeStats::unauthorized_deliveries`](crate::tcp::NodeStats), and close their
    /// connection; none reaches the consumer. (ACKs come back only on connections this node
    /// made, to a peer whose certificate was checked for the name connected to.)
    ///
    /// # Errors
    /// [`NameError`] as for `expose`; [`NameError::NoIdentities`] if this node's peers have no
    /// identity (it does not run mutual TLS).
    pub fn expose_to<T, I>(
        &self,
        name: &str,
        consumer: &ConsumerHandle<T>,
        identities: I,
    ) -> Result<(), NameError>
    where
        T: DeserializeOwned + Send + 'static,
        I: IntoIterator,
        I::Item: Into<String>,
    {
        #[cfg(feature = "tls")]
        let known = self.shared().options.tls().is_some_and(|t| t.identities());
        #[cfg(not(feature = "tls"))]
        let known = false;
        if !known {
            return Err(NameError::NoIdentities);
        }
        let identities = identities.into_iter().map(Into::into).collect();
        self.expose_entry(name, consumer, Some(identities))
    }

    fn expose_entry<T>(
        &self,
        name: &str,
        consumer: &ConsumerHandle<T>,
        identities: Option<Vec<String>>,
    ) -> Result<(), NameError>
    where
        T: DeserializeOwned + Send + 'static,
    {
        check_name(name)?;
        let mut exposed = self.shared().registry.exposed_mut();
        if exposed.contains_key(name) {
            return Err(NameError::Taken);
        }
        let entry = Entry {
            consumer: Box::new(ExposedConsumer(consumer.clone())),
            identities,
        };
        exposed.insert(name.to_owned(), Arc::new(entry));
        Ok(())
    }

    /// Stops exposing the consumer under `name` (its deliveries are then counted as unknown);
    /// whether one was exposed.
    pub fn unexpose(&self, name: &str) -> bool {
        let mut exposed = self.shared().registry.exposed_mut();
        exposed.remove(name).is_some()
    }

    /// A reference to the consumer exposed as `name` by the node at `addr` (a
    /// [`SocketAddr`], or a [`PeerAddr`] such as `"orders.internal:7100".parse()?`, resolved
    /// on every connection attempt), for a normal producer. Deliveries are encoded once per
    /// message (retransmissions reuse the bytes) and sent on one connection per address, made
    /// on the first delivery and again after a loss. While a connection is being made,
    /// deliveries wait for it (up to `max_output_bytes`); while there is none (after a failed
    /// attempt, until the next) they are dropped, and the producer's retransmission covers the
    /// gap. ACKs come back on the same connection.
    ///
    /// # Errors
    /// [`NameError`] if the name is empty or longer than 256 bytes.
    pub fn consumer_ref<T>(
        &self,
        addr: impl Into<PeerAddr>,
        name: &str,
    ) -> Result<ConsumerRef<T>, NameError>
    where
        T: Serialize + Send + 'static,
    {
        check_name(name)?;
        let outbound = self.outbound_to(addr.into());
        let name: Arc<str> = name.into();
        // The reference is a handle too: the node runs while a producer can send through it.
        let owner = self.0.clone();
        let (chunks_to, chunks_owner) = (outbound.clone(), owner.clone());
        let chunks_name = name.clone();
        let shared = self.shared().clone();
        let max_chunk = shared.options.config.max_frame_length - CHUNK_FRAME_OVERHEAD;
        Ok(ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
            let _owner = &owner;
            outbound.send(&name, deliveries);
        })
        .with_chunks(move |chunks| {
            let _owner = &chunks_owner;
            chunks_to.send_chunks(&chunks_name, chunks);
        })
        .with_transport(max_chunk, Arc::new(move || shared.schemas.of::<T>())))
    }

    /// The sending side of `addr`, made if new.
    fn outbound_to(&self, addr: PeerAddr) -> Arc<Outbound> {
        let shared = self.shared();
        shared
            .outbound()
            .entry(addr.clone())
            .or_insert_with(|| Arc::new(Outbound::new(addr, shared.context.clone())))
            .clone()
    }

    /// Makes the connection to the node at `addr` now, before the first delivery needs it
    /// (as [`consumer_ref`](Self::consumer_ref) would, and kept the same way), and waits for
    /// the attempt: the peer's id once connected, `None` if the attempt failed (the next one
    /// follows with backoff while references to `addr` send) or the node stopped.
    pub async fn dial(&self, addr: impl Into<PeerAddr>) -> Option<NodeId> {
        self.outbound_to(addr.into()).connect_now().await
    }

    /// The id of the node connected at `addr` now (`None` while not connected). A node that
    /// restarted has a new id.
    pub fn peer_id(&self, addr: impl Into<PeerAddr>) -> Option<NodeId> {
        let all = self.shared().outbound();
        all.get(&addr.into()).and_then(|outbound| outbound.peer())
    }

    /// The remote addresses this node sends to (one outgoing connection each, made on
    /// demand), with the id of the node connected at each now (`None` while not connected),
    /// in no particular order.
    pub fn peers(&self) -> Vec<(PeerAddr, Option<NodeId>)> {
        let all = self.shared().outbound();
        all.iter()
            .map(|(addr, outbound)| (addr.clone(), outbound.peer()))
            .collect()
    }

    /// Declares how bodies of `T` go over the wire from now on, for the consumers of `T`
    /// this node exposes and the references to consumers of `T` it hands out: the codec they
    /// are written in, their schema version, and the upcaster of older versions (see
    /// [`BodySchema`]). Without one, `T` is written in
    /// [`DEFAULT_WIRE_CODEC`](crate::tcp::DEFAULT_WIRE_CODEC) at version 1. Declare it
    /// before the first delivery (bodies kept for retransmission are sent as they were
    /// encoded); a second declaration replaces the first.
    ///
    /// ```no_run
    /// use actix_delivery::codec::{UpcastError, Written};
    /// use actix_delivery::tcp::{BodySchema, NodeHandle, NodeOptions, NodeSecret};
    /// use serde::{Deserialize, Serialize};
    ///
    /// /// Version 2: `total` became `total_cents`.
    /// #[derive(Serialize, Deserialize)]
    /// struct Order {
    ///     id: u64,
    ///     total_cents: u64,
    ///     #[serde(default)] // added without a new version: old nodes ignore it
    ///     currency: Option<String>,
    /// }
    ///
    /// /// What version 1 nodes send.
    /// #[derive(Deserialize)]
    /// struct OrderV1 {
    ///     id: u64,
    ///     total: u64,
    /// }
    ///
    /// fn upcast(old: Written<'_>) -> Result<Order, UpcastError> {
    ///     match old.version() {
    ///         1 => {
    ///             let v1: OrderV1 = old.decode()?;
    ///             Ok(Order { id: v1.id, total_cents: v1.total * 100, currency: None })
    ///         }
    ///         other => Err(UpcastError::new(format!("no upcaster from version {other}"))),
    ///     }
    /// }
    ///
    /// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let secret = NodeSecret::new(std::env::var("CLUSTER_SECRET")?)?;
    /// let node = NodeHandle::start(NodeOptions::builder().secret(secret).build()?).await?;
    /// // Before exposing consumers of `Order` or sending `Order`s:
    /// node.body_schema(BodySchema::<Order>::new().version(2).upcast(upcast));
    /// # Ok(()) }
    /// ```
    pub fn body_schema<T: 'static>(&self, schema: BodySchema<T>) {
        self.shared().schemas.declare(schema);
    }

    /// The node's counters.
    pub fn stats(&self) -> NodeStats {
        let mut stats = self.shared().counters.snapshot();
        let all = self.shared().outbound();
        for outbound in all.values() {
            let (routes, bodies) = outbound.memory();
            stats.routes += routes as u64;
            stats.cached_bodies += bodies as u64;
        }
        stats
    }

    /// Closes the listener and every connection now, whatever handles are left; references
    /// handed out drop their deliveries from now on.
    pub fn stop(&self) {
        self.shared().shut_down();
    }
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle")
            .field("id", &self.shared().local.node_id)
            .field("local_addr", &self.shared().local_addr)
            .finish_non_exhaustive()
    }
}

impl GracefulStop for NodeHandle {
    /// [`stop`](Self::stop): done at once (its connections close behind it).
    fn stop_gracefully(&self) -> StopFuture {
        self.stop();
        Box::pin(std::future::ready(Ok(())))
    }
}
