//! # Large messages: chunks
//!
//! A message is one delivery, and a delivery must fit what carries it: a TCP frame
//! (`max_frame_length`, 1 MiB by default), a NATS message (the server's `max_payload`, 1 MiB by
//! default), a durable producer's journal entry (16 MiB). A producer given
//! [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size) sends messages of any size up to the
//! consumer's `max_message_bytes`, in chunks:
//!
//! ```
//! use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn(|scan: Vec<u8>| async move {
//!         assert_eq!(scan.len(), 4 << 20); // the handler sees the whole message, never a part
//!         Ok::<(), std::io::Error>(())
//!     }))
//!     .build()?,
//! );
//! let producer = ReliableDelivery::producer(
//!     ProducerOptions::builder(&consumer)
//!         .chunk_size(256 << 10) // T: Serialize + DeserializeOwned
//!         .build()?,
//! );
//! producer.send(vec![7u8; 4 << 20]).await?; // handled once, whole, then confirmed
//! # Ok(()) }
//! ```
//!
//! - **What it does.** Each message is encoded once (serde: in bincode in process, or as its
//!   [`DurableOptions`](crate::durable::DurableOptions) say for a durable producer; across
//!   processes in the node's [`BodySchema`](crate::tcp::BodySchema) for `T`), straight into
//!   buffers of `chunk_size` bytes. Each chunk is a delivery of its own: a seq (a message of `n`
//!   chunks takes `n` consecutive seqs), a window slot, retransmission. The consumer buffers a
//!   message's chunks (in any order), ACKs each one but the last at once, decodes the message once
//!   it is whole, runs the handler on it once, and only then ACKs the last chunk: that ACK confirms
//!   the message. [`DeliveryInfo::seq`](crate::DeliveryInfo::seq) is the last chunk's seq,
//!   [`DeliveryInfo::first_seq`](crate::DeliveryInfo::first_seq) the first's.
//! - **What it needs.** `T: Serialize + DeserializeOwned`; a consumer reference that takes chunks
//!   (a [`ConsumerHandle`](crate::ConsumerHandle), a `ConsumerController`'s `Addr`,
//!   `NodeHandle::consumer_ref`, `NatsCarrierHandle::consumer_ref`, or
//!   [`ConsumerRef::with_chunks`](crate::ConsumerRef::with_chunks)); a `chunk_size` of at least
//!   [`MIN_CHUNK_SIZE`](crate::MIN_CHUNK_SIZE) and at most
//!   [`MAX_CHUNK_SIZE`](crate::MAX_CHUNK_SIZE)
//!   (16 MiB) that fits the transport's frame, less 1 KiB of headers (the builder refuses anything
//!   else; a small message takes only what it needs of a chunk). Over TCP, give the sending node
//!   room for a window of chunks (`max_output_bytes` ≥ `window_size` × `chunk_size`): what does
//!   not fit the output is dropped and waits for its retransmission. Every node of a cluster needs
//!   the same `max_frame_length` (a chunk too large for the receiver's frames is never delivered).
//! - **Guarantees**, per message, as for whole messages: handled whole at least once (never a
//!   handler run on a part), duplicates suppressed while the consumer lives, confirmed once;
//!   `ordered(true)` runs each producer's messages in order. A consumer that loses chunks it ACKed
//!   (a restart, its window evicted or swept, a partial message dropped for memory) still gets the
//!   message: when the last chunk stays unconfirmed for a `resend_timeout` while every other one
//!   was ACKed, the producer sends the whole message again from its first chunk (a *round*,
//!   counted in [`ProducerStats::chunk_rounds`](crate::ProducerStats::chunk_rounds);
//!   `max_attempts` bounds the rounds too). `window_start` never passes the first seq of an
//!   unconfirmed message, so a consumer that starts afresh admits all of it, and a window smaller
//!   than a message's chunk count (down to one slot) does not deadlock. A producer that restarts
//!   mid-message starts a new incarnation: the consumer drops the old one's partial message when
//!   the new one's chunks arrive. A [durable producer](super::durable_producers) stores a message's
//!   chunks (as many per journal entry as fit) before it sends any; after a crash it resends a
//!   message stored whole, and drops a message stored in part (never sent, so never
//!   half-delivered) and reports it not stored. The effectively-once consumer's processed mark
//!   covers the message's whole range of seqs.
//! - **Bounds** (consumer): a message longer than `max_message_bytes` (default 64 MiB, by the
//!   length its chunks announce) is a dead letter
//!   ([`DeadLetterReason::MessageTooLarge`](crate::DeadLetterReason::MessageTooLarge)); the bytes
//!   held for chunked messages, over all producers, partial and waiting for the handler, stay
//!   within `max_reassembly_bytes` (default 256 MiB). A producer (incarnation) has one message at a
//!   time being reassembled or waiting for room; a chunk of a newer one is refused (and
//!   retransmitted later). A message reserves its whole length (at least 128 bytes a chunk) with
//!   its first chunk, so once started it can always complete, and lives at most
//!   `reassembly_grace` (5 s) plus its length at `min_reassembly_rate` (1 MiB/s) from its first
//!   chunk, whatever arrives later: a producer that stopped, or one that trickles chunks to keep
//!   its room, holds it no longer. Room goes to messages in the order they were first seen (a
//!   refused message keeps its place while its producer retransmits it), and at once to one
//!   within its share of the room; a message waits at most until the messages seen before it
//!   reach their lifetime (`actix_delivery_proto::protocol::chunk::reassembly` derives the bound).
//!   Set `min_reassembly_rate` below what your producers achieve (`window_size` × `chunk_size` per
//!   round trip): a slower message never completes. Impossible or contradictory headers are dead
//!   letters ([`DeadLetterReason::InvalidChunk`](crate::DeadLetterReason::InvalidChunk)) or drop
//!   the partial message. Everything refused or dropped is counted
//!   ([`ConsumerStats`](crate::ConsumerStats): `chunks_refused`, `partial_messages_dropped`;
//!   `partial_messages`, `messages_waiting_for_room` and `reassembly_bytes` say what is held).
//! - **Costs.** Every message of such a producer is encoded, a small one as one chunk. A message's
//!   chunks are held by the producer until it is confirmed (a round needs them), by the consumer
//!   until the message is decoded, and the decoded value is a third copy: a message peaks at about
//!   2× its size in memory in process (the chunks are shared) and 3× over TCP. Received chunks
//!   that fill at least half a frame are kept as views of the frame, not copied. Throughput is in
//!   `benches/README.md`, "Large messages".
//! - **Limits.** In process the encoding is bincode, whose schema is fixed; a durable producer
//!   writes its chunks, which it stores, as its durable options say (codec, message version),
//!   across processes in the node's `BodySchema`. At its start it reads every stored message as
//!   its type, as it does whole ones: one of an older version goes through the upcaster and is
//!   sent written again at today's, split anew over its own seqs; one it cannot read (a newer
//!   version, a type changed without a new version) or that no longer fits its seqs stops the
//!   producer for good, naming the stream, the message and the versions, and stays stored for a
//!   producer that can read it. A durable producer without `chunk_size` stops (for good, saying
//!   why) on a stream that holds unsettled chunked messages, and one with it on a stream that holds
//!   unsettled whole messages: switch once the stream's messages are confirmed. Producer ids must
//!   be unique: two live producers sharing one would keep displacing each other's partial
//!   messages. Over NATS, a queue group spreads a message's chunks over its members: send chunked
//!   messages to a subject with one consumer. The outbox and work pulling send whole messages.
//!   Chunk headers came with wire protocol version 4: on a connection at version 3 (with a node
//!   of a release that speaks only 3, or a NATS carrier writing 3) chunks are not sent, and a
//!   producer that chunks waits ([Upgrading without downtime](super::upgrades)).
