//! The sending side of one remote address: the connection made lazily on the first delivery
//! (or [`NodeHandle::dial`](crate::tcp::NodeHandle::dial)), kept, and made again with backoff
//! after a loss, a name resolved anew for every attempt; deliveries that find the connection
//! being made wait for it (bounded); the encoding of deliveries (each body once, reused by
//! retransmissions); and the ACKs that come back, routed to their producers.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::FutureExt;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};

use crate::codec::schema::BodySchema;
use crate::delivery::message::{ChunkDelivery, Delivery, ReplyTo};
use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::runtime::backoff::Reconnect;
use crate::runtime::error_chain::ErrorChain;
use crate::tcp::auth::NodeId;
use crate::tcp::body::Body;
use crate::tcp::connection::{
    connect_handshake, drive, next_frame, secure_connect, End, Established, Failure, Link,
};
use crate::tcp::context::Context;
use crate::tcp::frame::{Frame, MIN_PROTOCOL_VERSION};
use crate::tcp::handshake::HandshakeError;
use crate::tcp::output::Item;
use crate::tcp::peer::{PeerAddr, Target};
use crate::tcp::routes::{AckRefusal, AckRoute, ReplyAddress, Routes};
use crate::tcp::stats::{add, Warning, Warnings};

/// The connection to one remote address, shared by every reference to consumers there.
pub(crate) struct Outbound {
    addr: PeerAddr,
    node: Arc<Context>,
    state: Mutex<State>,
    /// A delivery found no connection: (re)connect.
    demand: Notify,
    connector_started: AtomicBool,
    /// Connection attempts finished (for [`connect_now`](Self::connect_now)).
    attempts: watch::Sender<u64>,
}

struct State {
    routes: Routes<ReplyTo>,
    /// Where bodies are encoded before they are kept.
    scratch: Vec<u8>,
    link: Option<Arc<Link>>,
    peer: Option<NodeId>,
    /// Waiting between attempts after a failure or a loss: deliveries are dropped.
    backing_off: bool,
    /// Deliveries waiting for the connection being made, per consumer name.
    waiting: Vec<(Arc<str>, Group)>,
    /// About the bytes they take on the wire (at most `max_output_bytes`).
    waiting_bytes: usize,
}

/// About what a delivery takes in a frame besides its body: seq, window start, lengths.
const ITEM_OVERHEAD: usize = 24;

/// What a trace context adds to an item: its 16 + 8 + 1 bytes (the presence byte is in
/// `ITEM_OVERHEAD`).
const TRACE_CONTEXT_BYTES: usize = 25;

impl ReplyAddress for ReplyTo {
    fn same_as(&self, other: &Self) -> bool {
        ReplyTo::same_as(self, other)
    }
}

/// Deliveries of one producer incarnation, encoded, ready for a carrier.
pub(crate) struct Group {
    pub(crate) producer_id: ProducerId,
    pub(crate) incarnation: Incarnation,
    pub(crate) items: Vec<Item>,
}

impl Outbound {
    pub(crate) fn new(addr: PeerAddr, node: Arc<Context>) -> Self {
        let routes = Routes::new(node.options.config.max_routes);
        Self {
            addr,
            node,
            state: Mutex::new(State {
                routes,
                scratch: Vec::new(),
                link: None,
                peer: None,
                backing_off: false,
                waiting: Vec::new(),
                waiting_bytes: 0,
            }),
            demand: Notify::new(),
            connector_started: AtomicBool::new(false),
            attempts: watch::Sender::new(0),
        }
    }

    fn start_connector(self: &Arc<Self>) {
        if !self.connector_started.swap(true, Ordering::AcqRel) {
            let this = self.clone();
            self.node
                .arbiter
                .spawn(async move { this.connect_loop().await });
        }
    }

    /// Connects now if not connected, and waits for the attempt: the peer's id, or `None`
    /// if it failed or the node stopped.
    pub(crate) async fn connect_now(self: &Arc<Self>) -> Option<NodeId> {
        let mut attempts = self.attempts.subscribe();
        attempts.mark_unchanged();
        if let Some(peer) = self.peer() {
            return Some(peer);
        }
        self.start_connector();
        self.demand.notify_one();
        tokio::select! {
            () = self.node.cancel.cancelled() => None,
            _ = attempts.changed() => self.peer(),
        }
    }

    /// The id of the node connected at this address now.
    pub(crate) fn peer(&self) -> Option<NodeId> {
        let state = self.lock();
        state.link.as_ref().and(state.peer)
    }

    /// Routes and encoded bodies held now.
    pub(crate) fn memory(&self) -> (usize, usize) {
        let state = self.lock();
        (state.routes.len(), state.routes.bodies())
    }

    /// Sends deliveries to the consumer `name` there. Without a connection they wait for the
    /// one being made (up to `max_output_bytes`), or, while backing off after a failure, are
    /// dropped and counted; so is what finds no room in the output (the producer retransmits
    /// it).
    pub(crate) fn send<T: Serialize + 'static>(
        self: &Arc<Self>,
        name: &Arc<str>,
        deliveries: Vec<Delivery<T>>,
    ) {
        let (n, node) = (deliveries.len(), &self.node);
        let schema = node.schemas.of::<T>();
        self.send_encoded(name, n, |routes, scratch| {
            let counters = &node.counters;
            encode(
                routes,
                scratch,
                deliveries,
                &schema,
                &counters.bodies_encoded,
                &node.warnings,
            )
        });
    }

    /// Sends the chunks of large messages to the consumer `name` there, as
    /// [`send`](Self::send) sends deliveries (a chunk goes out as its bytes: nothing is
    /// encoded or kept).
    pub(crate) fn send_chunks<T>(self: &Arc<Self>, name: &Arc<str>, chunks: Vec<ChunkDelivery<T>>) {
        let n = chunks.len();
        self.send_encoded(name, n, |routes, _| encode_chunks(routes, chunks));
    }

    /// Sends `n` deliveries that `encode` turns into groups of items (with the routes of their
    /// producers, and a buffer to encode into), as [`send`](Self::send) says.
    fn send_encoded(
        self: &Arc<Self>,
        name: &Arc<str>,
        n: usize,
        encode: impl FnOnce(&mut Routes<ReplyTo>, &mut Vec<u8>) -> (Vec<Group>, u64),
    ) {
        self.start_connector();
        let counters = &self.node.counters;
        let (link, groups) = {
            let mut state = self.lock();
            if state.link.is_none() && state.backing_off {
                drop(state);
                add(&counters.deliveries_dropped_disconnected, n as u64);
                return;
            }
            let State {
                routes, scratch, ..
            } = &mut *state;
            let (groups, unsendable) = encode(routes, scratch);
            add(&counters.deliveries_unsendable, unsendable);
            match state.link.clone() {
                Some(link) => (link, groups),
                None => {
                    self.wait(&mut state, name, groups);
                    drop(state);
                    self.demand.notify_one();
                    return;
                }
            }
        };
        self.push(&link, name, groups);
    }

    /// Keeps `groups` for the connection being made, as far as `max_output_bytes` allows.
    fn wait(&self, state: &mut State, name: &Arc<str>, groups: Vec<Group>) {
        let counters = &self.node.counters;
        let limit = self.node.options.config.max_output_bytes;
        for mut group in groups {
            let overhead = name.len() + group.producer_id.as_str().len() + ITEM_OVERHEAD;
            let mut fit = 0;
            for item in &group.items {
                let traced = item
                    .trace_context
                    .as_ref()
                    .map_or(0, |_| TRACE_CONTEXT_BYTES);
                let bytes = item.body.as_slice().len() + ITEM_OVERHEAD + traced;
                if state.waiting_bytes + overhead + bytes > limit {
                    break;
                }
                state.waiting_bytes += bytes;
                fit += 1;
            }
            add(
                &counters.deliveries_dropped_full,
                (group.items.len() - fit) as u64,
            );
            if fit > 0 {
                add(&counters.deliveries_waited, fit as u64);
                state.waiting_bytes += overhead;
                group.items.truncate(fit);
                state.waiting.push((name.clone(), group));
            }
        }
    }

    /// Queues `groups` on `link`, counting what becomes of them.
    fn push(&self, link: &Link, name: &str, groups: Vec<Group>) {
        let counters = &self.node.counters;
        for group in groups {
            let pushed = link.with(|output| {
                output.push_deliveries(
                    name,
                    group.producer_id.as_str(),
                    group.incarnation,
                    &group.items,
                )
            });
            let Some(pushed) = pushed else {
                add(
                    &counters.deliveries_dropped_disconnected,
                    group.items.len() as u64,
                );
                continue;
            };
            add(&counters.frames_out, pushed.frames);
            add(&counters.deliveries_out, pushed.queued);
            add(&counters.deliveries_dropped_full, pushed.full);
            add(&counters.deliveries_unsendable, pushed.too_large);
            add(&counters.chunks_held_for_version, pushed.held_for_version);
            if pushed.held_for_version > 0 {
                self.node.warnings.warn(Warning::ChunksHeld, || {
                    let (version, offered) =
                        (link.version(), self.node.options.config.wire_version);
                    let what_to_do = if version < offered {
                        format!(
                            "the node at {} speaks no later version: upgrade it",
                            self.addr
                        )
                    } else {
                        "raise this node's wire_version to 4 once every node runs a release \
                         that speaks it"
                            .to_string()
                    };
                    format!(
                        "chunks of large messages to {} not sent (their producers retransmit \
                         them): the connection speaks protocol version {version}, which has no \
                         chunks; {what_to_do}",
                        self.addr
                    )
                });
            }
            if pushed.full > 0 {
                self.node.warnings.warn(Warning::Dropped, || {
                    format!(
                        "deliveries to {} dropped: the connection's output is full \
                         (the producer retransmits them)",
                        self.addr
                    )
                });
            }
            if pushed.too_large > 0 {
                self.node.warnings.warn(Warning::Unsendable, || {
                    "a delivery does not fit any frame the peer accepts (max_frame_length)"
                        .to_string()
                });
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects when there is demand, runs the connection until it is lost, and again, with
    /// backoff after failures and losses, until the node stops.
    async fn connect_loop(self: Arc<Self>) {
        let node = &self.node;
        let options = &node.options;
        let mut backoff = Reconnect::new(
            options.config.reconnect_min,
            options.config.reconnect_max,
            crate::runtime::random::random_u64(),
        );
        loop {
            tokio::select! {
                biased;
                () = node.cancel.cancelled() => return,
                () = self.demand.notified() => {}
            }
            let connected = self.connect();
            #[cfg(feature = "tracing")]
            let span = crate::telemetry::spans::connection("outbound", &self.addr);
            #[cfg(feature = "tracing")]
            let connected = tracing::Instrument::instrument(connected, span.clone());
            if let Some(established) = connected.await {
                backoff.reset();
                let run = self.run(established);
                #[cfg(feature = "tracing")]
                let run = tracing::Instrument::instrument(run, span);
                run.await;
                self.demand.notify_one(); // reconnect without waiting for a delivery
            } else {
                // Nothing waits beyond a failed attempt: the producers retransmit.
                let mut state = self.lock();
                let dropped: usize = state.waiting.iter().map(|(_, g)| g.items.len()).sum();
                state.waiting.clear();
                state.waiting_bytes = 0;
                drop(state);
                add(
                    &node.counters.deliveries_dropped_disconnected,
                    dropped as u64,
                );
                #[cfg(feature = "metrics")]
                node.publish();
                self.attempts.send_modify(|n| *n += 1);
            }
            self.lock().backing_off = true;
            tokio::select! {
                biased;
                () = node.cancel.cancelled() => return,
                () = tokio::time::sleep(backoff.next_wait()) => {}
            }
            self.lock().backing_off = false;
        }
    }

    /// The addresses to try: the address, or what the name resolves to now.
    async fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        let (host, port) = match self.addr.target() {
            Target::Addr(addr) => return Ok(vec![*addr]),
            Target::Name { host, port } => (host, *port),
        };
        let addrs = match &self.node.options.resolver.0 {
            Some(resolve) => resolve(host, port)?,
            None => tokio::net::lookup_host((&**host, port)).await?.collect(),
        };
        if addrs.is_empty() {
            return Err(io::Error::other("no address"));
        }
        Ok(addrs)
    }

    /// A TCP connection to the first of the peer's addresses that answers.
    async fn open(&self) -> Option<TcpStream> {
        let node = &self.node;
        let addrs = match self.resolve().await {
            Ok(addrs) => addrs,
            Err(err) => {
                add(&node.counters.resolve_failures, 1);
                add(&node.counters.connect_failures, 1);
                node.warnings.warn(Warning::Handshake, || {
                    format!("{} did not resolve: {}", self.addr, ErrorChain(&err))
                });
                return None;
            }
        };
        let timeout = node.options.config.connect_timeout;
        let mut failures = Vec::with_capacity(addrs.len());
        for addr in addrs {
            match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => return Some(stream),
                Ok(Err(err)) => failures.push(format!("{addr}: {}", ErrorChain(&err))),
                Err(_) => failures.push(format!("{addr}: no answer within {timeout:?}")),
            }
        }
        add(&node.counters.connect_failures, 1);
        node.warnings.warn(Warning::Handshake, || {
            format!("cannot connect to {} ({})", self.addr, failures.join("; "))
        });
        None
    }

    async fn connect(&self) -> Option<Established> {
        let node = &self.node;
        let stream = self.open().await?;
        let handshake = tokio::time::timeout(node.options.config.handshake_timeout, async {
            connect_handshake(secure_connect(node, stream, &self.addr).await?, &node.local).await
        });
        #[cfg(feature = "tracing")]
        let span = crate::telemetry::spans::handshake();
        #[cfg(feature = "tracing")]
        let handshake = tracing::Instrument::instrument(handshake, span.clone());
        let outcome = handshake.await;
        #[cfg(feature = "tracing")]
        match &outcome {
            Ok(Ok(established)) => {
                span.record("outcome", "established");
                let connection = tracing::Span::current();
                crate::telemetry::spans::established(&connection, &established.session.peer, None);
            }
            Ok(Err(failure)) => {
                span.record("outcome", tracing::field::debug(failure));
            }
            Err(_) => {
                span.record("outcome", "timed out");
            }
        }
        match outcome {
            Ok(Ok(established)) => Some(established),
            Ok(Err(Failure::Tls(why))) => {
                add(&node.counters.handshake_failures, 1);
                add(&node.counters.tls_failures, 1);
                node.warnings.warn(Warning::Handshake, || {
                    format!("refused the node at {}: {why}", self.addr)
                });
                None
            }
            Ok(Err(Failure::Io)) => {
                // Closed during the handshake: the peer refused us (or went away). A node of
                // an older release closes, without a word, a connection whose offered version
                // it does not speak: the likeliest cause while a rolling upgrade is under way.
                add(&node.counters.handshake_failures, 1);
                node.warnings.warn(Warning::Handshake, || {
                    let offered = node.options.config.wire_version;
                    let hint = if offered > MIN_PROTOCOL_VERSION {
                        format!(
                            " (if it runs an older release that speaks only an older protocol \
                             version, it refuses this node's offer of version {offered}: set \
                             this node's wire_version to the version it speaks until it is \
                             upgraded)"
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "{} closed the connection during the handshake{hint}",
                        self.addr
                    )
                });
                None
            }
            Ok(Err(Failure::Refused(err))) => {
                add(&node.counters.handshake_failures, 1);
                if matches!(err, HandshakeError::Version { .. }) {
                    add(&node.counters.version_refusals, 1);
                }
                node.warnings.warn(Warning::Handshake, || {
                    format!("refused the node at {}: {err}", self.addr)
                });
                None
            }
            Err(_) => {
                add(&node.counters.handshake_failures, 1);
                add(&node.counters.handshakes_timed_out, 1);
                node.warnings.warn(Warning::Handshake, || {
                    format!("the handshake with {} timed out", self.addr)
                });
                None
            }
        }
    }

    /// Runs an established connection until it ends.
    async fn run(&self, established: Established) {
        let node = &self.node;
        let Established {
            mut reader,
            writer,
            session,
            ..
        } = established;
        let (mut opener, version) = (session.opener, session.version);
        let link = Arc::new(Link::new(
            node,
            session.sealer,
            session.peer_max_frame_length,
            session.version,
        ));
        {
            let mut state = self.lock();
            if state.peer.is_some_and(|old| old != session.peer) {
                log::info!(
                    "the node at {} is a new node (it restarted): {}",
                    self.addr,
                    session.peer
                );
            }
            state.peer = Some(session.peer);
            state.link = Some(link.clone());
            // What waited goes first, in its order, before anything sent from now on.
            state.waiting_bytes = 0;
            for (name, group) in std::mem::take(&mut state.waiting) {
                self.push(&link, &name, vec![group]);
            }
        }
        self.attempts.send_modify(|n| *n += 1);
        add(&node.counters.connections_opened, 1);
        log::debug!(
            "connected to {} (node {}) at protocol version {version}",
            self.addr,
            session.peer
        );
        let read = async {
            loop {
                let frame = match next_frame(
                    &mut reader,
                    &mut opener,
                    node.options.config.idle_timeout,
                    &node.counters,
                )
                .await
                {
                    Ok(frame) => frame,
                    Err(end) => return end,
                };
                match Frame::decode_versioned(&frame, version) {
                    Ok(Frame::Acks(batch)) => {
                        self.route_acks(batch.producer_id, batch.incarnation, &batch.seqs)
                    }
                    Ok(Frame::Ping) => {}
                    _ => return End::Violation,
                }
                #[cfg(feature = "metrics")]
                node.publish();
            }
        };
        drive(node, &link, writer, read, &self.addr).await;
        self.lock().link = None;
    }

    fn route_acks(&self, producer_id: &str, incarnation: Incarnation, seqs: &[u64]) {
        let counters = &self.node.counters;
        let admitted = self
            .lock()
            .routes
            .admit_acks(producer_id, incarnation, seqs);
        let n = seqs.len() as u64;
        match admitted {
            Ok(route) => {
                add(&counters.acks_in, n);
                hand_acks(route, incarnation, seqs);
            }
            Err(AckRefusal::Unroutable) => add(&counters.unroutable_acks, n),
            Err(AckRefusal::Busy) => {
                add(&counters.acks_dropped_busy, n);
                self.node.warnings.warn(Warning::Dropped, || {
                    format!(
                        "ACKs from {} dropped: their producer has not taken the ACKs before \
                         them yet (it retransmits, and the consumer ACKs again)",
                        self.addr
                    )
                });
            }
        }
    }
}

/// Hands ACKs that [`Routes::admit_acks`] admitted to their producer. If their last message
/// is the route's probe, a task of the current arbiter waits until the producer took it and
/// then releases what the probe covers. Context by the TCP and NATS carriers.
pub(crate) fn hand_acks(route: AckRoute<ReplyTo>, incarnation: Incarnation, seqs: &[u64]) {
    let AckRoute {
        producer_id,
        reply_to,
        probe,
    } = route;
    let acks = seqs.iter().map(|&seq| Ack {
        producer_id: producer_id.clone(),
        incarnation,
        seq,
    });
    let Some(probe) = probe else {
        return reply_to.do_send_all(acks);
    };
    let mut taken = Box::pin(reply_to.send_all(acks));
    // Polled once here: a closure address takes them at once, and the last message to an
    // actor enters its mailbox now if there is room.
    if (&mut taken).now_or_never().is_none() {
        actix::spawn(async move {
            taken.await;
            drop(probe);
        });
    }
}

/// Looks up (or encodes as `schema` says, and caches) each delivery's body, grouped by
/// producer incarnation,
/// counting fresh encodings in `bodies_encoded`. Returns the groups and the number of
/// deliveries that cannot be sent. Context by the TCP and NATS carriers.
pub(crate) fn encode<T: Serialize>(
    routes: &mut Routes<ReplyTo>,
    scratch: &mut Vec<u8>,
    deliveries: Vec<Delivery<T>>,
    schema: &BodySchema<T>,
    bodies_encoded: &AtomicU64,
    warnings: &Warnings,
) -> (Vec<Group>, u64) {
    let mut groups: Vec<Group> = Vec::new();
    let (mut unsendable, mut encoded) = (0, 0);
    for delivery in deliveries {
        let Some(reply_to) = &delivery.reply_to else {
            unsendable += 1;
            continue;
        };
        let route = routes.route(&delivery.producer_id, delivery.incarnation, reply_to);
        let body = route.body(delivery.seq, delivery.window_start, scratch, |out| {
            schema.write(&delivery.body, out)
        });
        let Ok((body, fresh)) = body else {
            unsendable += 1;
            warnings.warn(Warning::Unsendable, || {
                "a delivery's body cannot be encoded".to_string()
            });
            continue;
        };
        encoded += u64::from(fresh);
        let item = Item {
            seq: delivery.seq,
            window_start: delivery.window_start,
            body,
            trace_context: delivery.trace_context,
            chunk: None,
        };
        group(
            &mut groups,
            delivery.producer_id,
            delivery.incarnation,
            item,
        );
    }
    add(bodies_encoded, encoded);
    (groups, unsendable)
}

/// The chunks of large messages as items, grouped by producer incarnation, their producers'
/// routes made or refreshed (for the ACKs): a chunk goes out as its bytes (shared with its
/// producer, not kept). Returns the groups and the number of chunks that cannot be sent.
/// Context by the TCP and NATS carriers.
pub(crate) fn encode_chunks<T>(
    routes: &mut Routes<ReplyTo>,
    chunks: Vec<ChunkDelivery<T>>,
) -> (Vec<Group>, u64) {
    let mut groups: Vec<Group> = Vec::new();
    let mut unsendable = 0;
    for chunk in chunks {
        let Some(reply_to) = &chunk.reply_to else {
            unsendable += 1;
            continue;
        };
        routes.route(&chunk.producer_id, chunk.incarnation, reply_to);
        let item = Item {
            seq: chunk.seq,
            window_start: chunk.window_start,
            body: Body::Chunk(chunk.bytes),
            trace_context: chunk.trace_context,
            chunk: Some(chunk.chunk),
        };
        group(&mut groups, chunk.producer_id, chunk.incarnation, item);
    }
    (groups, unsendable)
}

/// Appends `item` to the last group if it is of the same producer incarnation, else to a new
/// one.
fn group(groups: &mut Vec<Group>, producer_id: ProducerId, incarnation: Incarnation, item: Item) {
    match groups.last_mut() {
        Some(group) if group.incarnation == incarnation && group.producer_id == producer_id => {
            group.items.push(item);
        }
        _ => groups.push(Group {
            producer_id,
            incarnation,
            items: vec![item],
        }),
    }
}
