//! The Actix messages of the protocol and of the controllers' control interfaces.

use std::sync::Arc;

use actix::{Message, Recipient};
use bytes::Bytes;

use crate::codec::schema::BodySchema;
use crate::codec::schema::Unread;
use crate::delivery::confirmation::Confirmation;
use crate::error::{DeliveryError, TellError};
use crate::protocol::chunk::{Assembled, ChunkHeader};
use crate::protocol::consumer::{ConsumerStats, Inbound};
use crate::protocol::envelope::{Ack, DeadLetterReason, Header, Incarnation, ProducerId};
use crate::protocol::producer::{ProducerStats, Transmission};
use crate::protocol::trace_context::TraceContext;

/// A message from a producer to a consumer (`ProducerController` → `ConsumerController`).
///
/// Every field is untrusted input to the consumer, which checks it on arrival (see
/// [`admit`](crate::protocol::envelope::admit)); a malformed delivery becomes a
/// [`DeadLetter`](crate::DeadLetter).
#[derive(Debug)]
pub struct Delivery<T> {
    /// The sending producer's id.
    pub producer_id: ProducerId,
    /// The sending producer's current incarnation.
    pub incarnation: Incarnation,
    /// The message's sequence number (from 1).
    pub seq: u64,
    /// The lowest seq the producer has not had ACKed yet; every lower seq is settled.
    pub window_start: u64,
    /// The trace the message was sent in, if the producer set one.
    pub trace_context: Option<TraceContext>,
    /// The message.
    pub body: T,
    /// Where the consumer sends the [`Ack`].
    pub reply_to: Option<ReplyTo>,
}

impl<T: Send + 'static> Message for Delivery<T> {
    type Result = ();
}

impl<T> Delivery<T> {
    /// A hand-made delivery (tests, proxies, custom transports) with `window_start` 1 ("no seq
    /// settled yet"), which is always admissible; a producer sets it for you.
    pub fn new(
        producer_id: impl Into<ProducerId>,
        incarnation: Incarnation,
        seq: u64,
        body: T,
        reply_to: impl Into<ReplyTo>,
    ) -> Self {
        Self {
            producer_id: producer_id.into(),
            incarnation,
            seq,
            window_start: 1,
            trace_context: None,
            body,
            reply_to: Some(reply_to.into()),
        }
    }

    /// The same delivery claiming every seq below `window_start` settled.
    pub fn with_window_start(mut self, window_start: u64) -> Self {
        self.window_start = window_start;
        self
    }

    /// The same delivery in the trace `context`.
    pub fn with_trace_context(mut self, context: TraceContext) -> Self {
        self.trace_context = Some(context);
        self
    }

    /// The header of this delivery.
    pub fn header(&self) -> Header {
        Header {
            producer_id: self.producer_id.clone(),
            incarnation: self.incarnation,
            seq: self.seq,
            window_start: self.window_start,
            trace_context: self.trace_context.clone(),
            chunk: None,
        }
    }

    pub(crate) fn from_transmission(transmission: Transmission<T>, reply_to: ReplyTo) -> Self {
        let Transmission { header, body, .. } = transmission;
        Self {
            producer_id: header.producer_id,
            incarnation: header.incarnation,
            seq: header.seq,
            window_start: header.window_start,
            trace_context: header.trace_context,
            body,
            reply_to: Some(reply_to),
        }
    }

    pub(crate) fn into_inbound(self) -> Inbound<T, ReplyTo> {
        Inbound {
            header: Header {
                producer_id: self.producer_id,
                incarnation: self.incarnation,
                seq: self.seq,
                window_start: self.window_start,
                trace_context: self.trace_context,
                chunk: None,
            },
            body: self.body,
            reply_to: self.reply_to,
        }
    }
}

/// How a reassembled message becomes the consumer's `T` (carried by its chunks: the
/// producer's codec in process, the receiving node's or carrier's schema across processes).
pub(crate) type Decode<T> = Arc<dyn Fn(Assembled) -> Result<T, Unread> + Send + Sync>;

/// The schema a transport writes messages of `T` in, looked up when it is used (a node may
/// declare it after the reference was made).
pub(crate) type SchemaOf<T> = Arc<dyn Fn() -> BodySchema<T> + Send + Sync>;

/// One chunk of a large message (producer → consumer): what a producer with
/// [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size) sends, one per seq of the
/// message. The consumer buffers the chunks and runs the handler once on the reassembled
/// message (see [`chunk`](crate::protocol::chunk)). Made by producers and transports only.
pub struct ChunkDelivery<T> {
    /// The sending producer's id.
    pub producer_id: ProducerId,
    /// The sending producer's current incarnation.
    pub incarnation: Incarnation,
    /// This chunk's seq.
    pub seq: u64,
    /// The lowest seq the producer has not had ACKed yet (never past the message's first).
    pub window_start: u64,
    /// The trace the message was sent in, if the producer set one.
    pub trace_context: Option<TraceContext>,
    /// Where the chunk sits in its message.
    pub chunk: ChunkHeader,
    /// The chunk's bytes.
    pub bytes: Bytes,
    /// Where the consumer sends the [`Ack`].
    pub reply_to: Option<ReplyTo>,
    decode: Decode<T>,
}

impl<T> ChunkDelivery<T> {
    /// The chunk of `header` (whose `chunk` is set), decoded as `decode` says once whole.
    pub(crate) fn new(
        header: Header,
        bytes: Bytes,
        reply_to: Option<ReplyTo>,
        decode: Decode<T>,
    ) -> Option<Self> {
        Some(Self {
            chunk: header.chunk?,
            producer_id: header.producer_id,
            incarnation: header.incarnation,
            seq: header.seq,
            window_start: header.window_start,
            trace_context: header.trace_context,
            bytes,
            reply_to,
            decode,
        })
    }

    /// The header of this chunk.
    pub fn header(&self) -> Header {
        Header {
            producer_id: self.producer_id.clone(),
            incarnation: self.incarnation,
            seq: self.seq,
            window_start: self.window_start,
            trace_context: self.trace_context.clone(),
            chunk: Some(self.chunk),
        }
    }

    pub(crate) fn into_inbound(self) -> (Inbound<Bytes, ReplyTo>, Decode<T>) {
        let inbound = Inbound {
            header: Header {
                producer_id: self.producer_id,
                incarnation: self.incarnation,
                seq: self.seq,
                window_start: self.window_start,
                trace_context: self.trace_context,
                chunk: Some(self.chunk),
            },
            body: self.bytes,
            reply_to: self.reply_to,
        };
        (inbound, self.decode)
    }
}

impl<T> Clone for ChunkDelivery<T> {
    fn clone(&self) -> Self {
        Self {
            producer_id: self.producer_id.clone(),
            incarnation: self.incarnation,
            seq: self.seq,
            window_start: self.window_start,
            trace_context: self.trace_context.clone(),
            chunk: self.chunk,
            bytes: self.bytes.clone(),
            reply_to: self.reply_to.clone(),
            decode: self.decode.clone(),
        }
    }
}

impl<T> std::fmt::Debug for ChunkDelivery<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkDelivery")
            .field("header", &self.header())
            .field("bytes", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

/// The chunks of large messages one producer flush sends to one consumer, in one actor
/// message. Each is buffered (and ACKed) exactly as if it had arrived alone.
#[derive(Debug)]
pub struct ChunkDeliveries<T>(pub Vec<ChunkDelivery<T>>);

impl<T: Send + 'static> Message for ChunkDeliveries<T> {
    type Result = ();
}

/// Several deliveries from one producer in one actor message: what a
/// [`ProducerController`](crate::ProducerController) sends to a [`ConsumerRef`] that accepts
/// batches when one flush has more than one delivery ready. Each element is handled exactly
/// as if it had arrived alone.
#[derive(Debug)]
pub struct Deliveries<T>(pub Vec<Delivery<T>>);

impl<T: Send + 'static> Message for Deliveries<T> {
    type Result = ();
}

/// Deliveries whose bodies a transport received but could not decode as the consumer's
/// message type (their headers as received, each with why and the body's bytes as
/// received): the consumer makes them dead letters
/// ([`DeadLetterReason::UndecodableBody`](crate::DeadLetterReason::UndecodableBody),
/// [`DeadLetterReason::IncompatibleBody`](crate::DeadLetterReason::IncompatibleBody)).
#[derive(Debug)]
pub(crate) struct Undecodable(pub(crate) Vec<(Header, DeadLetterReason, Bytes)>);

impl Message for Undecodable {
    type Result = ();
}

/// One ACK as an actor message: what a [`ReplyTo`] made from a `Recipient<SingleAck>`
/// receives (several at once go as [`Acks`] where the address accepts them). The protocol's
/// [`Ack`] is the sans-IO core's, which knows no actors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SingleAck(pub Ack);

impl Message for SingleAck {
    type Result = ();
}

/// Several ACKs for one producer in one actor message: what a
/// [`ConsumerController`](crate::ConsumerController) sends to a [`ReplyTo`] that accepts
/// batches when one event produced more than one ACK for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acks(pub Vec<Ack>);

impl Message for Acks {
    type Result = ();
}

/// The largest batch, in bytes of elements. Small buffers stay in the allocator's per-thread
/// cache; batches of several kilobytes made allocation the dominant cost (measured: over half
/// of the L1 data misses in glibc's large-chunk paths).
const BATCH_BYTES: usize = 1024;

/// Sends `items` one message each (`one`), or, where a batch recipient exists, in batch
/// messages of up to [`BATCH_BYTES`] (`wrap`; a lone item still goes as a single message).
fn send_batched<I, M, B>(
    single: &Recipient<M>,
    batch: Option<&Recipient<B>>,
    items: impl Iterator<Item = I>,
    one: fn(I) -> M,
    wrap: fn(Vec<I>) -> B,
) where
    M: Message + Send + 'static,
    M::Result: Send,
    B: Message + Send + 'static,
    B::Result: Send,
{
    match (send_all_but_last(single, batch, items, one, wrap), batch) {
        (Some(Last::Single(item)), _) => single.do_send(item),
        (Some(Last::Batch(items)), Some(batch)) => batch.do_send(items),
        _ => {} // nothing left (a batch is only made for a batch recipient)
    }
}

/// The last message of [`send_all_but_last`], not sent yet.
enum Last<M, B> {
    Single(M),
    Batch(B),
}

/// Sends what [`send_batched`] would, except its last message, which it returns.
fn send_all_but_last<I, M, B>(
    single: &Recipient<M>,
    batch: Option<&Recipient<B>>,
    items: impl Iterator<Item = I>,
    one: fn(I) -> M,
    wrap: fn(Vec<I>) -> B,
) -> Option<Last<M, B>>
where
    M: Message + Send + 'static,
    M::Result: Send,
    B: Message + Send + 'static,
    B::Result: Send,
{
    let mut items = items.peekable();
    let Some(batch) = batch else {
        while let Some(item) = items.next() {
            if items.peek().is_none() {
                return Some(Last::Single(one(item)));
            }
            single.do_send(one(item));
        }
        return None;
    };
    let most = (BATCH_BYTES / std::mem::size_of::<I>().max(1)).max(2);
    let mut last = None;
    while let Some(first) = items.next() {
        if let Some(Last::Batch(chunk)) = last.take() {
            batch.do_send(chunk);
        }
        if items.peek().is_none() {
            return Some(Last::Single(one(first)));
        }
        let mut chunk = Vec::with_capacity(most);
        chunk.push(first);
        chunk.extend(items.by_ref().take(most - 1));
        last = Some(Last::Batch(wrap(chunk)));
    }
    last
}

/// Where a consumer sends ACKs: cheap to clone onto every delivery. Built from any
/// `Recipient<SingleAck>`; a `ProducerController`'s own reply address also accepts [`Acks`]
/// batches;
/// a proxy or transport can be one closure ([`ReplyTo::from_fn`]).
#[derive(Clone)]
pub struct ReplyTo(Arc<AckSink>);

enum AckSink {
    Actor {
        single: Recipient<SingleAck>,
        batch: Option<Recipient<Acks>>,
    },
    Fn(Box<dyn Fn(Vec<Ack>) + Send + Sync>),
}

impl ReplyTo {
    /// Sends an ACK, fire-and-forget (a lost ACK is recovered by retransmission).
    pub fn do_send(&self, ack: Ack) {
        match &*self.0 {
            AckSink::Actor { single, .. } => single.do_send(SingleAck(ack)),
            AckSink::Fn(send) => send(vec![ack]),
        }
    }

    /// Sends several ACKs, batched where the recipient accepts [`Acks`].
    pub fn do_send_all(&self, acks: impl Iterator<Item = Ack>) {
        match &*self.0 {
            AckSink::Actor { single, batch } => {
                send_batched(single, batch.as_ref(), acks, SingleAck, Acks)
            }
            AckSink::Fn(send) => send_collected(send, acks),
        }
    }

    /// Sends several ACKs as [`do_send_all`](Self::do_send_all) does; the future resolves once
    /// the recipient has taken the last of them from its mailbox, and so all of them (a
    /// mailbox is first in, first out): `true`, or `false` if it is gone. A closure address
    /// takes them at once. The future must be polled for the last message to be sent (as
    /// with `Recipient::send`).
    pub(crate) fn send_all(
        &self,
        acks: impl Iterator<Item = Ack>,
    ) -> impl std::future::Future<Output = bool> + Send + 'static {
        use futures_util::future::{ready, Either, FutureExt};
        match &*self.0 {
            AckSink::Actor { single, batch } => {
                match (
                    send_all_but_last(single, batch.as_ref(), acks, SingleAck, Acks),
                    batch,
                ) {
                    (Some(Last::Single(ack)), _) => {
                        Either::Left(single.send(ack).map(|r| r.is_ok()))
                    }
                    (Some(Last::Batch(acks)), Some(batch)) => {
                        Either::Right(Either::Left(batch.send(acks).map(|r| r.is_ok())))
                    }
                    // Nothing left (a batch is only made for a batch recipient).
                    _ => Either::Right(Either::Right(ready(true))),
                }
            }
            AckSink::Fn(send) => {
                send_collected(send, acks);
                Either::Right(Either::Right(ready(true)))
            }
        }
    }

    /// A reply address that hands every batch of ACKs (one or more) to `send`, fire-and-forget:
    /// what a proxy, a test link or a network transport needs, in one closure.
    pub fn from_fn(send: impl Fn(Vec<Ack>) + Send + Sync + 'static) -> Self {
        Self(Arc::new(AckSink::Fn(Box::new(send))))
    }

    /// Whether both are the same address (ACKs for them may share a batch).
    pub fn same_as(&self, other: &ReplyTo) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A reply address that takes single ACKs and [`Acks`] batches (as a `ProducerController`
    /// does).
    pub fn batching(single: Recipient<SingleAck>, batch: Recipient<Acks>) -> Self {
        Self(Arc::new(AckSink::Actor {
            single,
            batch: Some(batch),
        }))
    }
}

impl From<Recipient<SingleAck>> for ReplyTo {
    fn from(single: Recipient<SingleAck>) -> Self {
        Self(Arc::new(AckSink::Actor {
            single,
            batch: None,
        }))
    }
}

impl std::fmt::Debug for ReplyTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let batches = !matches!(&*self.0, AckSink::Actor { batch: None, .. });
        f.debug_struct("ReplyTo")
            .field("batches", &batches)
            .finish_non_exhaustive()
    }
}

/// Hands `items` to `send` as one `Vec`, unless there are none.
fn send_collected<M>(send: &(dyn Fn(Vec<M>) + Send + Sync), items: impl Iterator<Item = M>) {
    let items: Vec<M> = items.collect();
    if !items.is_empty() {
        send(items);
    }
}

/// Where a producer sends deliveries (the consumer's "ref"). Built from a
/// [`ConsumerHandle`](crate::ConsumerHandle) or a `ConsumerController`'s `Addr`, it also takes
/// [`Deliveries`] batches and the [`ChunkDeliveries`] of large messages; built from any
/// `Recipient<Delivery<T>>`, it receives one message per delivery; a proxy, a test link or a
/// network transport can be one closure that receives every batch
/// ([`ConsumerRef::from_fn`]), and one more for chunks ([`ConsumerRef::with_chunks`]).
pub struct ConsumerRef<T: Send + 'static> {
    target: Target<T>,
    chunks: Option<ChunkSink<T>>,
    /// Set by a transport: the largest chunk its frames carry, and the schema it writes
    /// messages in.
    transport: Option<(usize, SchemaOf<T>)>,
}

enum Target<T: Send + 'static> {
    Actor {
        single: Recipient<Delivery<T>>,
        batch: Option<Recipient<Deliveries<T>>>,
    },
    Fn(Arc<dyn Fn(Vec<Delivery<T>>) + Send + Sync>),
}

enum ChunkSink<T: Send + 'static> {
    Actor(Recipient<ChunkDeliveries<T>>),
    Fn(Arc<dyn Fn(Vec<ChunkDelivery<T>>) + Send + Sync>),
}

impl<T: Send + 'static> ConsumerRef<T> {
    fn of(target: Target<T>) -> Self {
        Self {
            target,
            chunks: None,
            transport: None,
        }
    }

    /// A reference that accepts both single deliveries and batches.
    pub fn batching(single: Recipient<Delivery<T>>, batch: Recipient<Deliveries<T>>) -> Self {
        Self::of(Target::Actor {
            single,
            batch: Some(batch),
        })
    }

    /// A reference that hands every batch of deliveries (one or more, in the producer's order)
    /// to `send`, fire-and-forget. A delivery it drops is retransmitted by the producer.
    pub fn from_fn(send: impl Fn(Vec<Delivery<T>>) + Send + Sync + 'static) -> Self {
        Self::of(Target::Fn(Arc::new(send)))
    }

    /// The same reference, handing the chunks of large messages (a producer with
    /// [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size)) to `send`, every batch of
    /// them (one or more, in the producer's order), fire-and-forget. A chunk it drops is
    /// retransmitted by the producer.
    pub fn with_chunks(
        mut self,
        send: impl Fn(Vec<ChunkDelivery<T>>) + Send + Sync + 'static,
    ) -> Self {
        self.chunks = Some(ChunkSink::Fn(Arc::new(send)));
        self
    }

    /// Whether chunked messages can be sent through this reference.
    pub fn takes_chunks(&self) -> bool {
        self.chunks.is_some()
    }

    /// The reference of a transport whose frames carry chunks of at most `max_chunk` bytes,
    /// and which writes messages in `schema` (its schema for `T`).
    pub(crate) fn with_transport(mut self, max_chunk: usize, schema: SchemaOf<T>) -> Self {
        self.transport = Some((max_chunk, schema));
        self
    }

    /// The largest chunk the transport carries, and the schema it writes messages in (`None`
    /// in process).
    pub(crate) fn transport(&self) -> Option<&(usize, SchemaOf<T>)> {
        self.transport.as_ref()
    }

    /// Sends deliveries, batched where the consumer accepts batches.
    pub fn do_send_all(&self, deliveries: impl Iterator<Item = Delivery<T>>) {
        match &self.target {
            Target::Actor { single, batch } => {
                send_batched(single, batch.as_ref(), deliveries, |d| d, Deliveries);
            }
            Target::Fn(send) => send_collected(&**send, deliveries),
        }
    }

    /// Sends chunks (in one message), if the reference takes them; otherwise drops them (a
    /// producer with `chunk_size` is refused such a reference when it is built).
    pub(crate) fn send_chunks(&self, chunks: impl Iterator<Item = ChunkDelivery<T>>) {
        let chunks: Vec<ChunkDelivery<T>> = chunks.collect();
        if chunks.is_empty() {
            return;
        }
        match &self.chunks {
            Some(ChunkSink::Actor(recipient)) => recipient.do_send(ChunkDeliveries(chunks)),
            Some(ChunkSink::Fn(send)) => send(chunks),
            None => {}
        }
    }
}

impl<T: Send + 'static> Clone for ConsumerRef<T> {
    fn clone(&self) -> Self {
        Self {
            target: match &self.target {
                Target::Actor { single, batch } => Target::Actor {
                    single: single.clone(),
                    batch: batch.clone(),
                },
                Target::Fn(send) => Target::Fn(send.clone()),
            },
            chunks: self.chunks.as_ref().map(|sink| match sink {
                ChunkSink::Actor(recipient) => ChunkSink::Actor(recipient.clone()),
                ChunkSink::Fn(send) => ChunkSink::Fn(send.clone()),
            }),
            transport: self.transport.clone(),
        }
    }
}

impl<T: Send + 'static> From<Recipient<Delivery<T>>> for ConsumerRef<T> {
    fn from(single: Recipient<Delivery<T>>) -> Self {
        Self::of(Target::Actor {
            single,
            batch: None,
        })
    }
}

impl<T: Send + 'static> ConsumerRef<T> {
    /// A reference that takes single deliveries, batches and chunks (a consumer's).
    pub(crate) fn of_consumer(
        single: Recipient<Delivery<T>>,
        batch: Recipient<Deliveries<T>>,
        chunks: Recipient<ChunkDeliveries<T>>,
    ) -> Self {
        let mut reference = Self::batching(single, batch);
        reference.chunks = Some(ChunkSink::Actor(chunks));
        reference
    }
}

impl<T: Send + 'static> std::fmt::Debug for ConsumerRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let batches = !matches!(self.target, Target::Actor { batch: None, .. });
        f.debug_struct("ConsumerRef")
            .field("batches", &batches)
            .field("chunks", &self.takes_chunks())
            .finish_non_exhaustive()
    }
}

/// Hands a message to a `ProducerController`. [`ProducerHandle`](crate::ProducerHandle) is the
/// convenient way; send this directly when you hold the controller's `Addr`.
pub struct Tell<T> {
    /// The message.
    pub body: T,
    /// Notified exactly once with the outcome.
    pub confirm: Confirmation,
}

impl<T: Send + 'static> Message for Tell<T> {
    type Result = Result<(), TellError<T>>;
}

/// Stops a `ProducerController` for good, as [`ProducerHandle::stop`](crate::ProducerHandle::stop)
/// does: every in-flight and queued message is settled, and a durable one first finishes its
/// journal writes in flight.
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct StopProducer;

/// An in-process consumer gave up the message `ack` names (a work-pulling pool's
/// `give_up_after`): its producer settles it with `error` and never sends it again. Checked as
/// an ACK is; crate-internal, so only the pool that holds the producer's jobs can send it.
#[derive(Clone, Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct GiveUp {
    /// Names the message, as its ACK would.
    pub(crate) ack: Ack,
    /// What its confirmation reports.
    pub(crate) error: DeliveryError,
}

/// Asks a `ProducerController` for its [`ProducerStats`].
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "ProducerStats")]
pub struct GetProducerStats;

/// Asks a `ConsumerController` for its [`ConsumerStats`].
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "ConsumerStats")]
pub struct GetConsumerStats;

/// Asks a `ConsumerController` how many seqs of one producer it holds handled above the
/// contiguous mark (`None`: the producer is not tracked).
#[derive(Clone, Debug, Message)]
#[rtype(result = "Option<usize>")]
pub struct GetOutOfOrder(pub ProducerId);

/// Stops a `ConsumerController`; its dedup state is dropped.
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct StopConsumer;
