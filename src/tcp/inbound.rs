//! The receiving side: the listener, the handshake of each connection, and the deliveries it
//! carries handed to exposed consumers, whose ACKs go back on the same connection.

use std::future::Future;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::codec::schema::Schemas;
use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::message::{
    ChunkDeliveries, ChunkDelivery, Decode, Deliveries, Delivery, ReplyTo, Undecodable,
};
use crate::protocol::envelope::{Ack, Header, ProducerId};
use crate::tcp::connection::{
    accept_handshake, drive, next_frame, secure_accept, End, Established, Failure, Link,
};
use crate::tcp::context::Context;
use crate::tcp::frame::{DeliveryBatch, Frame};
use crate::tcp::handshake::HandshakeError;
use crate::tcp::peer::Identity;
use crate::tcp::pending::Ticket;
use crate::tcp::registry::{Dispatched, Exposed, Handed};
use crate::tcp::stats::{add, Warning};

/// Why an incoming handshake did not complete.
enum Refusal {
    Failed(Failure),
    TimedOut,
    Evicted,
}

#[cfg(feature = "tracing")]
impl Refusal {
    /// The refusal in a word or two, for the handshake span.
    fn name(&self) -> &'static str {
        match self {
            Refusal::Failed(Failure::Refused(_)) => "refused",
            Refusal::Failed(Failure::Io) => "closed",
            Refusal::Failed(Failure::Tls(_)) => "tls failed",
            Refusal::TimedOut => "timed out",
            Refusal::Evicted => "evicted",
        }
    }
}

/// Frames of one connection handed to consumers and not yet taken from their mailboxes: the
/// reader waits beyond this, so a slow consumer slows its peers' sending (TCP flow control)
/// instead of growing its mailbox.
const MAX_DISPATCHING: usize = 8;

/// A chunk's bytes as the consumer keeps them until its message is reassembled: a view of
/// `frame` if the chunk is at least half of it, else a copy. A view keeps the whole frame
/// alive (the read buffer it was split from: about the frame), and reassembly charges only
/// the chunk, so a view of a small chunk in a large frame (beside stale chunks or other
/// deliveries) would let a sender pin far more memory than the bound counts; this way a kept
/// frame is about twice what is charged for it at most.
fn chunk_bytes(frame: &Bytes, body: &[u8]) -> Bytes {
    if body.len().saturating_mul(2) >= frame.len() {
        frame.slice_ref(body)
    } else {
        Bytes::copy_from_slice(body)
    }
}

/// A [`ConsumerHandle`] as an [`Exposed`] consumer.
pub(crate) struct ExposedConsumer<T: Send + 'static>(pub ConsumerHandle<T>);

impl<T: DeserializeOwned + Send + 'static> Exposed for ExposedConsumer<T> {
    fn deliver(
        &self,
        frame: &Bytes,
        batch: &DeliveryBatch<'_>,
        reply_to: &ReplyTo,
        schemas: &Schemas,
    ) -> Handed {
        let schema = schemas.of::<T>();
        let producer_id = ProducerId::from(batch.producer_id);
        let mut deliveries = Vec::with_capacity(batch.items.len());
        let mut chunks = Vec::new();
        let mut decode: Option<Decode<T>> = None;
        let mut undecodable = Vec::new();
        let mut why = None;
        for item in &batch.items {
            let header = Header {
                producer_id: producer_id.clone(),
                incarnation: batch.incarnation,
                seq: item.seq,
                window_start: item.window_start,
                trace_context: item.trace_context.clone(),
                chunk: item.chunk,
            };
            if item.chunk.is_some() {
                // Buffered as its bytes; the whole message is read once reassembled.
                let decode = decode.get_or_insert_with(|| {
                    std::sync::Arc::new(move |message| schema.read_assembled(message))
                });
                let bytes = chunk_bytes(frame, item.body);
                let reply_to = Some(reply_to.clone());
                chunks.extend(ChunkDelivery::new(header, bytes, reply_to, decode.clone()));
                continue;
            }
            match schema.read(item.body) {
                Ok(body) => deliveries.push(Delivery {
                    producer_id: header.producer_id,
                    incarnation: header.incarnation,
                    seq: header.seq,
                    window_start: header.window_start,
                    trace_context: header.trace_context,
                    body,
                    reply_to: Some(reply_to.clone()),
                }),
                Err(unread) => {
                    why.get_or_insert(unread.why);
                    let body = chunk_bytes(frame, item.body);
                    undecodable.push((header, unread.reason, body));
                }
            }
        }
        let dead = undecodable.len() as u64;
        let addr = self.0.addr();
        // Dead letters count against the same bound as deliveries: a batch is taken once the
        // last of its messages is (a mailbox is first in, first out).
        // The last message is awaited (`send`); the ones before it go with `do_send`, as a
        // message whose `send` future is dropped is skipped.
        let (more_deliveries, more_chunks) = (!deliveries.is_empty(), !chunks.is_empty());
        let mut taken = None;
        if dead > 0 {
            let dead = Undecodable(undecodable);
            if more_deliveries || more_chunks {
                addr.do_send(dead);
            } else {
                taken = Some(dispatched(addr.send(dead)));
            }
        }
        if more_deliveries {
            if more_chunks {
                addr.do_send(Deliveries(deliveries));
            } else {
                taken = Some(dispatched(addr.send(Deliveries(deliveries))));
            }
        }
        if more_chunks {
            taken = Some(dispatched(addr.send(ChunkDeliveries(chunks))));
        }
        Handed {
            taken,
            undecodable: dead,
            why,
        }
    }
}

/// Resolves with whether the consumer took the message `taken` waits for.
fn dispatched(
    taken: impl Future<Output = Result<(), actix::MailboxError>> + Send + 'static,
) -> Dispatched {
    Box::pin(async move { taken.await.is_ok() })
}

/// Accepts connections until the node stops.
pub(crate) async fn listen(node: Arc<Context>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = node.cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            // Out of file descriptors, say: wait a little instead of spinning.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let evicted = CancellationToken::new();
        let (ticket, oldest) = node.handshakes().admit(evicted.clone());
        if let Some(oldest) = oldest {
            oldest.cancel();
        }
        let node = node.clone();
        #[cfg(feature = "tracing")]
        let span = crate::telemetry::spans::connection(
            "inbound",
            &stream
                .peer_addr()
                .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string()),
        );
        node.arbiter.clone().spawn(async move {
            let handshake = InHandshake {
                node: &node,
                ticket,
            };
            let served = serve(&node, stream, handshake, evicted);
            #[cfg(feature = "tracing")]
            let served = tracing::Instrument::instrument(served, span);
            served.await;
        });
    }
}

/// An incoming connection's place in the handshake budget, given back when dropped.
struct InHandshake<'a> {
    node: &'a Context,
    ticket: Ticket,
}

impl Drop for InHandshake<'_> {
    fn drop(&mut self) {
        self.node.handshakes().finish(self.ticket);
    }
}

/// An authenticated incoming connection's place in `max_connections`, given back when
/// dropped.
struct Open<'a>(&'a Context);

impl<'a> Open<'a> {
    fn take(node: &'a Context) -> Option<Self> {
        let open = node.inbound_open.fetch_add(1, Ordering::AcqRel);
        let place = Self(node);
        (open < node.options.config.max_connections).then_some(place)
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.inbound_open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs an incoming connection: its handshake (in the handshake budget, closed when
/// `evicted`), then, if a place in `max_connections` is free, its frames.
async fn serve(
    node: &Context,
    stream: TcpStream,
    handshake: InHandshake<'_>,
    evicted: CancellationToken,
) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "an unknown address".to_string(), |a| a.to_string());
    let timed = tokio::time::timeout(node.options.config.handshake_timeout, async {
        accept_handshake(secure_accept(node, stream).await?, &node.local).await
    });
    #[cfg(feature = "tracing")]
    let span = crate::telemetry::spans::handshake();
    #[cfg(feature = "tracing")]
    let timed = tracing::Instrument::instrument(timed, span.clone());
    let established = tokio::select! {
        biased; // a handshake that completed is not evicted
        () = node.cancel.cancelled() => return,
        result = timed => match result {
            Ok(Ok(established)) => Ok(established),
            Ok(Err(failure)) => Err(Refusal::Failed(failure)),
            Err(_) => Err(Refusal::TimedOut),
        },
        () = evicted.cancelled() => Err(Refusal::Evicted),
    };
    drop(handshake);
    #[cfg(feature = "tracing")]
    match &established {
        Ok(established) => {
            span.record("outcome", "established");
            crate::telemetry::spans::established(
                &tracing::Span::current(),
                &established.session.peer,
                established.identity.as_deref(),
            );
        }
        Err(refusal) => {
            span.record("outcome", refusal.name());
        }
    }
    let counters = &node.counters;
    let established = match established {
        Ok(established) => established,
        Err(refusal) => {
            add(&counters.handshake_failures, 1);
            let why = match refusal {
                Refusal::Failed(Failure::Refused(err)) => {
                    if matches!(err, HandshakeError::Version { .. }) {
                        add(&counters.version_refusals, 1);
                    }
                    err.to_string()
                }
                Refusal::Failed(Failure::Io) => "closed or not a frame".to_string(),
                Refusal::Failed(Failure::Tls(why)) => {
                    add(&counters.tls_failures, 1);
                    why
                }
                Refusal::TimedOut => {
                    add(&counters.handshakes_timed_out, 1);
                    "timed out".to_string()
                }
                Refusal::Evicted => {
                    add(&counters.handshakes_evicted, 1);
                    "evicted: max_handshakes newer connections were in their handshake".to_string()
                }
            };
            node.warnings.warn(Warning::Handshake, || {
                format!("refused a connection from {peer}: {why}")
            });
            #[cfg(feature = "metrics")]
            node.publish();
            return;
        }
    };
    let Some(_open) = Open::take(node) else {
        add(&counters.connections_refused, 1);
        node.warnings.warn(Warning::Handshake, || {
            format!("closed the connection from {peer}: max_connections are open")
        });
        #[cfg(feature = "metrics")]
        node.publish();
        return;
    };
    let Established {
        mut reader,
        writer,
        session,
        identity,
    } = established;
    add(&node.counters.connections_accepted, 1);
    log::debug!(
        "accepted node {} from {peer} at protocol version {}",
        session.peer,
        session.version
    );
    let (mut opener, version) = (session.opener, session.version);
    let link = Arc::new(Link::new(
        node,
        session.sealer,
        session.peer_max_frame_length,
        session.version,
    ));
    let reply_to = reply_to(node, &link);
    let read = async {
        let mut dispatching = FuturesUnordered::<Dispatched>::new();
        loop {
            tokio::select! {
                biased;
                Some(_) = dispatching.next(), if !dispatching.is_empty() => {}
                frame = next_frame(&mut reader, &mut opener, node.options.config.idle_timeout, &node.counters),
                    if dispatching.len() < MAX_DISPATCHING =>
                {
                    let frame = match frame {
                        Ok(frame) => frame.freeze(),
                        Err(end) => return end,
                    };
                    match Frame::decode_versioned(&frame, version) {
                        Ok(Frame::Deliveries(batch)) => {
                            match dispatch(node, &frame, &batch, &reply_to, identity.as_ref()) {
                                Ok(Some(taken)) => dispatching.push(taken),
                                Ok(None) => {}
                                Err(Unauthorized) => return End::Unauthorized,
                            }
                        }
                        Ok(Frame::Ping) => {}
                        _ => return End::Violation,
                    }
                    #[cfg(feature = "metrics")]
                    node.publish();
                }
            }
        }
    };
    drive(node, &link, writer, read, &peer).await;
}

/// The peer is not authorized for the consumer it delivers to.
struct Unauthorized;

/// Hands a batch to its consumer (dead letters of undecodable bodies included); `None` if
/// nothing was handed over (an unknown name: dropped; or an empty batch).
///
/// # Errors
/// [`Unauthorized`] (counted, nothing handed over) if the consumer is exposed to identities
/// that do not include the peer's.
fn dispatch(
    node: &Context,
    frame: &Bytes,
    batch: &DeliveryBatch<'_>,
    reply_to: &ReplyTo,
    identity: Option<&Identity>,
) -> Result<Option<Dispatched>, Unauthorized> {
    let n = batch.items.len() as u64;
    let Some(exposed) = node.registry.exposed(batch.consumer) else {
        add(&node.counters.unknown_consumer, n);
        node.warnings.warn(Warning::UnknownConsumer, || {
            "dropped deliveries for a consumer name this node does not expose".to_string()
        });
        return Ok(None);
    };
    if !exposed.admits(identity) {
        add(&node.counters.unauthorized_deliveries, n);
        node.warnings.warn(Warning::Unauthorized, || {
            format!(
                "closed a connection from {}: it delivered to a consumer it is not authorized \
                 for",
                identity.map_or_else(
                    || "a peer without identity".to_string(),
                    |names| { format!("identity {names:?}") }
                )
            )
        });
        return Err(Unauthorized);
    }
    let handed = exposed
        .consumer
        .deliver(frame, batch, reply_to, &node.schemas);
    add(&node.counters.deliveries_in, n - handed.undecodable);
    add(&node.counters.undecodable_bodies, handed.undecodable);
    if let Some(why) = handed.why {
        node.warnings.warn(Warning::Undecodable, || {
            format!("deliveries to {:?} are dead letters: {why}", batch.consumer)
        });
    }
    Ok(handed.taken)
}

/// The reply address of every delivery of one connection: ACKs go back on it, or are dropped
/// (and counted) once it is closed or its output is full.
fn reply_to(node: &Context, link: &Arc<Link>) -> ReplyTo {
    let link = link.clone();
    let counters = node.counters.clone();
    ReplyTo::from_fn(move |acks: Vec<Ack>| {
        let n = acks.len() as u64;
        match link.with(|output| output.push_acks(&acks)) {
            Some(pushed) => {
                add(&counters.frames_out, pushed.frames);
                add(&counters.acks_out, pushed.queued);
                add(&counters.acks_dropped_full, pushed.full + pushed.too_large);
            }
            None => add(&counters.acks_dropped_disconnected, n),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_kept_as_a_view_of_its_frame_only_if_it_is_at_least_half_of_it() {
        let frame = Bytes::from(vec![1u8; 100]);
        let within = |kept: &Bytes| frame.as_ptr_range().contains(&kept.as_ptr());
        let large = chunk_bytes(&frame, &frame[10..60]);
        assert!(within(&large), "a view: no copy");
        let small = chunk_bytes(&frame, &frame[10..59]);
        assert!(!within(&small), "a copy: the frame is not pinned by it");
        assert_eq!((&large[..], &small[..]), (&frame[10..60], &frame[10..59]));
    }
}
