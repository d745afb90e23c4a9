//! The sending side of one remote address: the connection made lazily on the first delivery,
//! kept, and made again with backoff after a loss; the encoding of deliveries (each body once,
//! reused by retransmissions); and the ACKs that come back, routed to their producers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::FutureExt;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::message::{Delivery, ReplyTo};
use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::remote::auth::NodeId;
use crate::remote::backoff::Reconnect;
use crate::remote::connection::{
    connect_handshake, drive, next_frame, End, Established, Failure, Link,
};
use crate::remote::frame::Frame;
use crate::remote::handshake::HandshakeError;
use crate::remote::node::Shared;
use crate::remote::output::Item;
use crate::remote::routes::{AckRefusal, AckRoute, ReplyAddress, Routes};
use crate::remote::schema::BodySchema;
use crate::remote::stats::{add, Warning, Warnings};

/// The connection to one remote address, shared by every reference to consumers there.
pub(crate) struct Outbound {
    addr: SocketAddr,
    node: Arc<Shared>,
    state: Mutex<State>,
    /// A delivery found no connection: (re)connect.
    demand: Notify,
    connector_started: AtomicBool,
}

struct State {
    routes: Routes<ReplyTo>,
    /// Where bodies are encoded before they are kept.
    scratch: Vec<u8>,
    link: Option<Arc<Link>>,
    peer: Option<NodeId>,
}

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
    pub(crate) fn new(addr: SocketAddr, node: Arc<Shared>) -> Self {
        let routes = Routes::new(node.options.max_routes);
        Self {
            addr,
            node,
            state: Mutex::new(State {
                routes,
                scratch: Vec::new(),
                link: None,
                peer: None,
            }),
            demand: Notify::new(),
            connector_started: AtomicBool::new(false),
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

    /// Sends deliveries to the consumer `name` there; what finds no connection, or no room in
    /// its output, is dropped and counted (the producer retransmits it).
    pub(crate) fn send<T: Serialize + 'static>(
        self: &Arc<Self>,
        name: &str,
        deliveries: Vec<Delivery<T>>,
    ) {
        if !self.connector_started.swap(true, Ordering::AcqRel) {
            let this = self.clone();
            self.node
                .arbiter
                .spawn(async move { this.connect_loop().await });
        }
        let counters = &self.node.counters;
        let (link, groups, unsendable) = {
            let mut state = self.lock();
            let Some(link) = state.link.clone() else {
                drop(state);
                add(
                    &counters.deliveries_dropped_disconnected,
                    deliveries.len() as u64,
                );
                self.demand.notify_one();
                return;
            };
            let State {
                routes, scratch, ..
            } = &mut *state;
            let (groups, unsendable) = encode(
                routes,
                scratch,
                deliveries,
                &self.node.schemas.of::<T>(),
                &counters.bodies_encoded,
                &self.node.warnings,
            );
            (link, groups, unsendable)
        };
        add(&counters.deliveries_unsendable, unsendable);
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
    /// backoff after failures, until the node stops.
    async fn connect_loop(self: Arc<Self>) {
        let node = &self.node;
        let options = &node.options;
        let mut backoff = Reconnect::new(
            options.reconnect_min,
            options.reconnect_max,
            crate::protocol::envelope::random_u64(),
        );
        loop {
            tokio::select! {
                biased;
                () = node.cancel.cancelled() => return,
                () = self.demand.notified() => {}
            }
            if let Some(established) = self.connect().await {
                backoff.reset();
                self.run(established).await;
                self.demand.notify_one(); // reconnect without waiting for a delivery
            }
            tokio::select! {
                biased;
                () = node.cancel.cancelled() => return,
                () = tokio::time::sleep(backoff.next_wait()) => {}
            }
        }
    }

    async fn connect(&self) -> Option<Established> {
        let node = &self.node;
        let options = &node.options;
        let stream = match tokio::time::timeout(
            options.connect_timeout,
            TcpStream::connect(self.addr),
        )
        .await
        {
            Ok(Ok(stream)) => stream,
            _ => {
                add(&node.counters.connect_failures, 1);
                log::debug!("connecting to {} failed", self.addr);
                return None;
            }
        };
        let handshake = tokio::time::timeout(
            options.handshake_timeout,
            connect_handshake(stream, &node.local),
        );
        match handshake.await {
            Ok(Ok(established)) => Some(established),
            Ok(Err(Failure::Io)) => {
                // Closed during the handshake: the peer refused us (or went away).
                add(&node.counters.handshake_failures, 1);
                node.warnings.warn(Warning::Handshake, || {
                    format!("{} closed the connection during the handshake", self.addr)
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
        } = established;
        let mut opener = session.opener;
        let link = Arc::new(Link::new(
            node,
            session.sealer,
            session.peer_max_frame_length,
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
        }
        add(&node.counters.connections_opened, 1);
        log::debug!("connected to {} (node {})", self.addr, session.peer);
        let read = async {
            loop {
                let frame = match next_frame(
                    &mut reader,
                    &mut opener,
                    node.options.idle_timeout,
                    &node.counters,
                )
                .await
                {
                    Ok(frame) => frame,
                    Err(end) => return end,
                };
                match Frame::decode(&frame) {
                    Ok(Frame::Acks(batch)) => {
                        self.route_acks(batch.producer_id, batch.incarnation, &batch.seqs)
                    }
                    Ok(Frame::Ping) => {}
                    _ => return End::Violation,
                }
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
/// then releases what the probe covers. Shared by the TCP and NATS carriers.
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
/// deliveries that cannot be sent. Shared by the TCP and NATS carriers.
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
        let item = (delivery.seq, delivery.window_start, body);
        match groups.last_mut() {
            Some(group)
                if group.incarnation == delivery.incarnation
                    && group.producer_id == delivery.producer_id =>
            {
                group.items.push(item);
            }
            _ => groups.push(Group {
                producer_id: delivery.producer_id,
                incarnation: delivery.incarnation,
                items: vec![item],
            }),
        }
    }
    add(bodies_encoded, encoded);
    (groups, unsendable)
}
