//! Reliable, flow-controlled delivery between Actix actors: every message handled at least
//! once, retransmitted on loss, deduplicated, with backpressure and a confirmation per message.
//!
//! A [`ProducerController`] sends messages to a [`ConsumerController`]; the consumer runs your
//! handler for each new message and acknowledges (ACKs) it only when the handler returned
//! `Ok`; the producer retransmits until it gets the ACK and then tells you.
//!
//! ```text
//!  your code                ProducerController                 ConsumerController         your handler
//!  tell(body, confirm) ──▶  queue (≤ max_pending)
//!  send(body).await         window (≤ window_size in flight)
//!                           seq, incarnation ── Delivery ──▶   admission → dedup ──new──▶ handler(body)
//!                           retransmit every                         │ duplicate: re-ACK    │ Ok(())
//!                           resend_timeout                           ▼                      ▼
//!  confirm(Ok(())) ◀─────── ACK valid? ◀───────── Ack ──────────  record seq ◀──────────────┘
//! ```
//!
//! # Quick start
//!
//! ```
//! use actix_delivery::{ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn(|order: String| async move {
//!         println!("processing {order}");
//!         Ok::<(), std::io::Error>(()) // an Err here means "not done": no ACK, retried later
//!     }))
//!     .build()?,
//! );
//! let producer = ReliableDelivery::producer(ProducerOptions::builder(&consumer).build()?);
//!
//! // Fire and get called back exactly once ...
//! producer.tell("espresso".to_string(), |result: Result<(), DeliveryError>| {
//!     println!("confirmed: {result:?}");
//! })?;
//! // ... or await the confirmation (and wait for room when the queue is full).
//! producer.send("latte".to_string()).await?;
//! # Ok(()) }
//! ```
//!
//! An existing actor becomes a reliable consumer with [`DeliveryHandler::forward_to`]; a handler
//! that needs the producer id, incarnation and seq uses [`DeliveryHandler::from_fn_with_info`].
//! [`ProducerHandle::idle`] waits until everything told is settled, and both handles'
//! `stopped()` until a `stop()` took effect.
//!
//! One producer feeding a changing pool of workers, with re-routing when a worker leaves and
//! stable job ids for effectively-once workers: [`work_pulling`]. Many persistent entities,
//! started on demand, addressed by id, passivated when idle, and spread over nodes (shards
//! owned through leases in PostgreSQL, delivered over NATS or TCP), effectively once across
//! failovers: [`sharding`].
//!
//! # Guarantees
//!
//! - **At least once.** Every message told to a running producer is handled by a successful
//!   handler run at least once, or its confirmation reports why not
//!   ([`DeliveryError::ProducerStopped`], [`DeliveryError::GaveUp`] after `max_attempts`,
//!   [`DeliveryError::QueueFull`], [`DeliveryError::HandlingFailed`] when a work-pulling pool
//!   gave a job up, …), and [`DeliveryError::happened`] says whether the message certainly
//!   was not stored or sent (a retry is safe), is in doubt, or was sent and failed after.
//!   Lost deliveries and lost ACKs are recovered by retransmission every `resend_timeout`.
//! - **Duplicates suppressed while the consumer lives.** The consumer remembers, per producer id
//!   and incarnation, which seqs were handled; a retransmission or duplicated delivery of a
//!   handled seq is re-ACKed without running the handler, and a retransmission of a seq whose
//!   handler is still running is dropped (its ACK follows the run). Each id keeps windows for
//!   up to four incarnations, so a late copy from a restarted producer's previous life is still
//!   recognised and resets nothing.
//! - **Confirmation exactly once.** Each message's confirmation fires once: `Ok(())` when the
//!   consumer's ACK reached the producer, an error otherwise. A confirmation means the consumer
//!   took responsibility for the message: for a retransmission, the handler may have run on an
//!   earlier attempt, not this one.
//! - **Flow control.** At most `window_size` messages are in flight; up to `max_pending` more
//!   wait in the producer. [`ProducerHandle::tell`] hands the body back when the queue is full,
//!   [`ProducerHandle::send`] waits for room.
//! - **Forged or stale ACKs are ignored.** The producer acts on an ACK only if it carries its
//!   id, its current 128-bit incarnation (drawn from the OS CSPRNG at every start, and only
//!   ever sent on its own deliveries) and a seq in flight. Anything else is counted in
//!   [`ProducerStats::ignored_acks`] and changes nothing.
//! - **Bounded memory.** In flight ≤ `window_size`, queued ≤ `max_pending`, producer ids in
//!   the dedup table ≤ `max_producers` (least recently used evicted; each keeps at most four
//!   incarnation windows), per producer handled-above-contiguous plus waiting ≤
//!   `max_out_of_order` (plus the gap-closing seq, always admitted so the bound cannot
//!   deadlock), idle producers swept after `producer_idle_ttl`, whatever a peer sends.
//!   Malformed deliveries are refused as [`DeadLetter`]s. Every refusal is counted in
//!   [`ConsumerStats`] and logged at most once a minute per kind (without peer-supplied ids).
//! - **A stuck handler cannot stall the consumer for good.** Handlers run one at a time; a run
//!   that takes longer than `handler_timeout` (default 30 s) is abandoned: its future is dropped,
//!   it counts as a failure (no ACK), and the next message runs. The abandoned message runs
//!   again when its producer retransmits it. Abandoning only stops waiting: work the handler
//!   started elsewhere (an actor that got the message through [`DeliveryHandler::forward_to`])
//!   may still complete, and then happen twice.
//! - **Order.** By default the handler sees messages in arrival order, which retransmission can
//!   change. With `ordered(true)` it sees each producer's messages strictly in seq order: a
//!   delivery that arrives ahead of its turn is refused and retransmitted later.
//!
//! # Limits: read before relying on it
//!
//! - **The consumer's dedup lives in memory.** If the consumer crashes or restarts between
//!   "handler done" and "ACK received by the producer", the producer retransmits and the *new*
//!   consumer runs the handler again. The same happens after a dedup window was evicted
//!   (`max_producers`) or swept (`producer_idle_ttl`). So plain handlers must be idempotent;
//!   for effectively-once processing, hand each message to a persistent entity (see
//!   "Effectively once" below), which stores the delivery's processed mark atomically with its
//!   events.
//! - **Producer ids must be unique per live producer.** Two live producers configured with the
//!   same id still work (each incarnation has its own window) but compete for the id's four
//!   windows; the consumer counts and warns when an older incarnation keeps sending long after a
//!   newer one appeared ([`ConsumerStats::shared_id_messages`]).
//! - **Ordered mode is strict while the window lives.** When the consumer loses a producer's
//!   window (eviction, sweep, restart), a late copy of an earlier message, or of one its
//!   producer already gave up or settled as stopped, can run after later ones.
//! - **A producer in memory loses what it holds when it stops.** Unconfirmed messages of a
//!   stopped producer are settled with [`DeliveryError::StoppedUnconfirmed`] if it had sent
//!   them (the consumer may or may not have handled them), with
//!   [`DeliveryError::ProducerStopped`] if not. A restarted producer uses a new incarnation,
//!   so its reused seqs are never mistaken for duplicates. A [`durable`] producer stores its
//!   messages first and resends them after a restart under the same incarnation and seqs; its
//!   `stop()` is graceful (the journal writes in flight finish first), and each message's
//!   outcome reaches its callback or, after the next start, the sink, once
//!   ([`DeliveryError::InDoubt`] where the producer cannot know).
//! - **Don't swallow errors in the handler.** The handler's result *is* the acknowledgement.
//!   This handler ACKs a message whose processing failed, and it is never retried:
//!
//!   ```
//!   # use actix_delivery::DeliveryHandler;
//!   # async fn process(_: String) -> Result<(), std::io::Error> { Ok(()) }
//!   // ✗ Anti-pattern: the error is logged and dropped, the handler resolves Ok, the message
//!   //   is ACKed as done although processing failed.
//!   let handler = DeliveryHandler::from_fn(|order: String| async move {
//!       if let Err(err) = process(order).await {
//!           log::warn!("failed: {err}");
//!       }
//!       Ok::<(), std::io::Error>(())
//!   });
//!   // ✓ Let the error propagate: no ACK, the producer retransmits, the handler retries.
//!   let handler = DeliveryHandler::from_fn(|order: String| async move { process(order).await });
//!   ```
//!
//!   If a message can never succeed, record it for a separate retry workflow and then return
//!   `Ok`, or bound the retries with `max_attempts` on the producer.
//! - **Not for everything.** Each message costs a tell to the producer, a share of a delivery
//!   and of an ACK (batched under load, one each when traffic is sparse) and some bookkeeping,
//!   instead of one `do_send`; the README quotes the measured overhead. Telemetry, health pings
//!   and transient UI updates should use a plain `do_send`.
//! - **Inside one cluster.** The controllers connect actors of one Actix application (or one
//!   cluster of nodes). External or cross-cluster consumers belong on a broker such as NATS or
//!   Kafka.
//!
//! # Trust: the incarnation is a capability
//!
//! Whoever holds a producer's id and current [`Incarnation`] token, and can reach its consumer,
//! can speak for that producer: deliver bodies in its name (which the handler runs), or claim
//! seqs settled through `window_start` (which makes the consumer refuse the producer's genuine
//! copies of them: they are never confirmed, and end as [`DeliveryError::GaveUp`] or are
//! retransmitted forever). What it can never do is get a message confirmed `Ok` that no handler
//! ran: a seq below a delivery's `window_start` is *stale*, neither run nor re-ACKed.
//!
//! So the token leaves the producer only on its own deliveries; handlers
//! ([`DeliveryInfo`]), dead letters and logs see [`IncarnationId`], a one-way digest that names
//! the incarnation without granting anything, and the token's `Debug` prints only that id.
//!
//! A public id grants nothing anywhere, including where a body names a producer's message (a
//! sharded producer's [`EntityEnvelope`](sharding::EntityEnvelope) origin, a work-pulling
//! [`Job`](work_pulling::Job) id), which an effectively-once receiver records as processed:
//! the pool's streams carry tokens derived from the producer's
//! ([`protocol::origin`]), the named id must be the public id of the token the delivery
//! carries, and any other is a dead letter ([`DeadLetterReason::ForeignOrigin`]) that runs
//! nothing and moves no window.
//! In-process code is trusted (it could as well call the handler itself); across processes
//! only authenticated nodes may send deliveries, because anyone reading the traffic of the
//! secret mode learns the token (no confidentiality without TLS).
//!
//! ## Across processes: three modes
//!
//! A [`tcp::NodeHandle`] runs in one of three modes: the **shared secret** (below), **TLS** 1.3
//! (feature `tls`: the server's certificate and name are verified, everything is encrypted), and
//! **mutual TLS**, in which each node's identity is its certificate's names and
//! `NodeHandle::expose_to` restricts a consumer to a set of identities (a delivery from any other
//! is refused, counted and its connection closed). A TLS node and a node without TLS refuse each
//! other; between TLS nodes the listener decides: a mutual listener refuses a node that presents no
//! certificate, while a one-way listener asks for none, so a mutual node delivers to it. The
//! README's "Security" section compares them; what follows is what the secret mode gives, which TLS
//! gives too, plus confidentiality, and mutual TLS plus identity within the cluster.
//!
//! ## Across processes: what the shared secret protects
//!
//! [`tcp::NodeHandle`]s authenticate each other with a shared [`tcp::NodeSecret`]: an
//! HMAC-SHA256 challenge–response over everything both sides announced (fresh nonces, node
//! ids, versions, frame limits: a value altered on the path fails the handshake; the secret
//! never crosses the wire), then a 128-bit HMAC tag under a per-connection,
//! per-direction session key over every frame and its number. Against an attacker who does
//! **not** hold the secret, that gives:
//!
//! - **No delivery, no ACK from outside.** A connection that fails the handshake is closed and
//!   no byte of it reaches a consumer; a node without the secret can neither deliver to an
//!   exposed consumer nor confirm anything to a producer. Replayed and reflected handshakes
//!   fail (each proof covers the other side's fresh nonce and its own role).
//! - **No injection into a live connection.** An on-path attacker who hijacks the TCP stream
//!   cannot insert, alter, replay, reorder or remove frames: the next tag fails and the
//!   connection closes (only that one; it is made again).
//!
//! It does **not** give:
//!
//! - **Confidentiality.** Bodies, consumer names, producer ids and incarnation tokens travel
//!   in clear; a reader of the traffic learns all of them (and could only use a token through
//!   an authenticated connection, which needs the secret). Use the TLS modes (or WireGuard,
//!   or a service mesh) when the network is not private.
//! - **Availability.** An on-path attacker can drop, delay, corrupt or cut connections.
//!   Delivery then stalls and resumes when the path is back (retransmission); nothing is lost
//!   and nothing is confirmed that was not handled.
//! - **Identity within the cluster.** The secret proves membership, not which node: any
//!   holder can run a node, accept connections meant for another address (if it can redirect
//!   them), receive what is sent to consumer names it exposes, and deliver to any exposed
//!   consumer. Treat it as a cluster-wide credential (mutual TLS with `expose_to` closes
//!   this).
//! - **Protection of a weak secret.** A recorded handshake lets an attacker test guesses
//!   offline: use 32 random bytes, not a password.
//!
//! Unauthenticated peers are bounded: at most `max_handshakes` connections in their handshake
//! (a new one beyond evicts the oldest, so a flood of connections that never authenticate
//! cannot lock an honest node out; authenticated connections count against
//! `max_connections` instead), each buffering at most 256 bytes for at most
//! `handshake_timeout`. Authenticated peers are trusted for volume, within bounds that count
//! what cannot be used like what can: one can make a node buffer a frame (`max_frame_length`)
//! per connection and keep 8 frames per connection queued for consumers, dead letters of
//! undecodable bodies included, and hand at most 8 192 ACKs to a producer that has not taken
//! them yet (beyond, dropped and counted); what it delivers is bounded by the consumer's own
//! limits (admission, `max_producers`, `max_out_of_order`).
//! [`tcp::NodeOptionsBuilder::insecure_no_authentication`] gives up all of the above and
//! is logged as a warning at start.
//!
//! # Effectively once
//!
//! [`journal`] stores streams of events durably: `journal::SqliteJournal` (feature `sqlite`,
//! on by default; embedded, one file, group commit: many appends per fsync),
//! `journal::PostgresJournal` (feature `postgres`) or [`journal::MemoryJournal`] (tests).
//! [`persistence`] runs event-sourced entities over it: a [`persistence::PersistentActor`] answers
//! a command only once its events are committed, and batches everything decided while one write is
//! in flight into the next. Given a message's [`DeliveryInfo`], it stores the processed mark in the
//! same journal entry as the events, and recognises the delivery after any crash:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use actix_delivery::journal::{PersistenceId, SqliteJournal};
//! # use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
//! # use actix_delivery::{ConsumerOptions, ReliableDelivery};
//! # #[derive(Default, serde::Serialize, serde::Deserialize)] struct Account { balance: u64 }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Deposited(u64);
//! # impl EventSourced for Account {
//! #     type Command = u64; type Event = Deposited; type Reply = u64; type Rejection = String;
//! #     fn decide(&self, n: &u64) -> Result<Decision<Self>, String> {
//! #         Ok(Decision::persist([Deposited(*n)], self.balance + n)) }
//! #     fn apply(&mut self, Deposited(n): &Deposited) { self.balance += n; }
//! # }
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let journal = Arc::new(SqliteJournal::open("accounts.db").await?);
//! let account = PersistentHandle::<Account>::start(PersistentOptions::new(
//!     journal,
//!     PersistenceId::new("account-42")?,
//! ))?;
//! // Each message becomes a command; it is ACKed once its events and mark are committed.
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(account.delivery_handler(|amount: u64| amount)).build()?,
//! );
//! # Ok(()) }
//! ```
//!
//! Every message's events are then stored exactly once, however often the consumer crashes.
//! Side effects outside the journal (an email, a call to another service) still happen at
//! least once: make them idempotent. The [`persistence`] module documents the details.
//!
//! On the sending side, a [`durable`] producer stores each message before sending it and
//! resends what is unconfirmed after a crash; an entity's decision can deliver messages
//! through an [`persistence::Outbox`], recorded with its events. Durable on both ends, delivery
//! is effectively once across any number of crashes on either side.
//!
//! # Across processes
//!
//! [`tcp`] carries deliveries and ACKs over TCP: a [`tcp::NodeHandle`] per process listens,
//! exposes local consumers under names, and hands out [`ConsumerRef`]s to consumers on other
//! nodes that an unchanged producer sends to; ACKs come back on the same connection. A node
//! runs until it is stopped or its last handle is dropped (the references it handed out count
//! as handles).
//!
//! ```no_run
//! # use std::net::SocketAddr;
//! # use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};
//! # use actix_delivery::{ProducerOptions, ReliableDelivery};
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let node = NodeHandle::start(
//!     NodeOptions::builder()
//!         .secret(NodeSecret::new(std::env::var("CLUSTER_SECRET")?)?)
//!         .build()?,
//! )
//! .await?;
//! let orders = node.consumer_ref::<String>("10.0.0.7:7100".parse::<SocketAddr>()?, "orders")?;
//! let producer = ReliableDelivery::producer(ProducerOptions::builder(orders).build()?);
//! producer.send("espresso".to_string()).await?; // handled and ACKed on the other node
//! # Ok(()) }
//! ```
//!
//! The guarantees above hold across processes: a lost connection, a dropped frame or a
//! consumer process that crashed only delays confirmations (retransmission covers the gap once
//! a connection is back), and a body is encoded once per message, not per retransmission. A
//! consumer that restarts loses its in-memory dedup (see "Limits"); the effectively-once
//! consumer below does not. The first deliveries to an address wait for its connection: they
//! are dropped while it is made and go out with the next retransmission.
//!
//! With the feature `nats`, the `nats` module carries the same frames through a NATS server
//! instead: a `nats::NatsCarrierHandle` per process exposes consumers on subjects (optionally in a
//! queue group, so that another process takes over when one dies) and hands out [`ConsumerRef`]s
//! for subjects; deliveries name the carrier's inbox as their reply subject for the ACKs.
//!
//! # Large messages: chunks
//!
//! A message is one delivery, and a delivery must fit what carries it: a TCP frame
//! (`max_frame_length`, 1 MiB by default), a NATS message (the server's `max_payload`, 1 MiB
//! by default), a durable producer's journal entry (16 MiB). A producer given
//! [`chunk_size`](ProducerOptionsBuilder::chunk_size) sends messages of any size up to the
//! consumer's `max_message_bytes`, in chunks:
//!
//! - **What it does.** Each message is encoded once (serde: in bincode in process, or as its
//!   [`durable::DurableOptions`] say for a durable producer; across processes in the node's
//!   [`tcp::BodySchema`] for `T`), straight into buffers of `chunk_size` bytes. Each chunk is a
//!   delivery of its own: a seq (a message of `n` chunks takes `n` consecutive seqs), a window
//!   slot, retransmission. The consumer buffers a message's chunks (in any order), ACKs each one
//!   but the last at once, decodes the message once it is whole, runs the handler on it once, and
//!   only then ACKs the last chunk: that ACK confirms the message. [`DeliveryInfo::seq`] is the
//!   last chunk's seq, [`DeliveryInfo::first_seq`] the first's.
//! - **What it needs.** `T: Serialize + DeserializeOwned`; a consumer reference that takes
//!   chunks (a [`ConsumerHandle`], a `ConsumerController`'s `Addr`, `NodeHandle::consumer_ref`,
//!   `NatsCarrierHandle::consumer_ref`, or [`ConsumerRef::with_chunks`]); a `chunk_size` of at
//!   least [`MIN_CHUNK_SIZE`] and at most [`MAX_CHUNK_SIZE`] (16 MiB) that fits the
//!   transport's frame, less 1 KiB of headers (the builder refuses anything else; a small
//!   message takes only what it needs of a chunk). Over TCP, give the sending node room for a
//!   window of chunks (`max_output_bytes` ≥ `window_size` × `chunk_size`): what does not fit
//!   the output is dropped and waits for its retransmission. Every node of a cluster needs the same
//!   `max_frame_length` (a chunk too large for the receiver's frames is never delivered), and
//!   the wire protocol version 4 that chunk headers came with: nodes and NATS carriers of an
//!   earlier release are refused (counted in `version_refusals`).
//! - **Guarantees**, per message, as for whole messages: handled whole at least once (never a
//!   handler run on a part), duplicates suppressed while the consumer lives, confirmed once;
//!   `ordered(true)` runs each producer's messages in order. A consumer that loses chunks it
//!   ACKed (a restart, its window evicted or swept, a partial message dropped for memory)
//!   still gets the message: when the last chunk stays unconfirmed for a `resend_timeout`
//!   while every other one was ACKed, the producer sends the whole message again from its first
//!   chunk (a *round*, counted in [`ProducerStats::chunk_rounds`]; `max_attempts` bounds the
//!   rounds too). `window_start` never passes the first seq of an unconfirmed message, so a
//!   consumer that starts afresh admits all of it, and a window smaller than a message's chunk
//!   count (down to one slot) does not deadlock. A producer that restarts mid-message starts a
//!   new incarnation: the consumer drops the old one's partial message when the new one's
//!   chunks arrive. A [`durable`] producer stores a message's chunks (as many per journal entry
//!   as fit) before it sends any; after a crash it resends a message stored whole, and drops a
//!   message stored in part (never sent, so never half-delivered) and reports it not stored.
//!   The effectively-once consumer's processed mark covers the message's whole range of seqs,
//!   as the dedup windows do, so chunk seqs never pile up above the contiguous mark.
//! - **Bounds** (consumer): a message longer than `max_message_bytes` (default 64 MiB, by the
//!   length its chunks announce) is a dead letter ([`DeadLetterReason::MessageTooLarge`]);
//!   the bytes held for chunked messages, over all producers, partial and waiting for the
//!   handler, stay within `max_reassembly_bytes` (default 256 MiB). A producer (incarnation)
//!   has one message at a time being reassembled or waiting for room; a chunk of a newer one
//!   is refused (and retransmitted later). A message reserves its whole length (at least 128
//!   bytes a chunk) with its first chunk, so once started it can always complete, and lives at
//!   most `reassembly_grace` (5 s) plus its length at `min_reassembly_rate` (1 MiB/s) from its
//!   first chunk, whatever arrives later: a producer that stopped, or one that trickles chunks
//!   to keep its room, holds it no longer. Room goes to messages in the order they were first
//!   seen (a refused message keeps its place while its producer retransmits it), and at once
//!   to one within its share of the room; a message waits at most until the messages seen
//!   before it reach their lifetime ([`reassembly`](protocol::chunk::reassembly) derives the
//!   bound). Set `min_reassembly_rate` below what your producers achieve (`window_size` ×
//!   `chunk_size` per round trip): a slower message never completes. Impossible or
//!   contradictory headers are dead letters ([`DeadLetterReason::InvalidChunk`]) or drop the
//!   partial message. Everything refused or dropped is counted ([`ConsumerStats`]:
//!   `chunks_refused`, `partial_messages_dropped`; `partial_messages`,
//!   `messages_waiting_for_room` and `reassembly_bytes` say what is held).
//! - **Costs.** Every message of such a producer is encoded, a small one as one chunk. A
//!   message's chunks are held by the producer until it is confirmed (a round needs them),
//!   by the consumer until the message is decoded, and the decoded value is a third copy at the
//!   end: a 256 MiB message peaked at 2.0× its size in process (the chunks are shared) and
//!   3.0× over TCP with both nodes in one process. Received chunks that fill at least half a
//!   frame are kept as views of the frame, not copied. 16 MiB messages over TCP loopback ran
//!   at about half the rate of a plain framed send of the same bytes (median 54 % with chunks
//!   of 256 KiB or 1 MiB, 42 % with 4 MiB chunks); in the shared-secret mode the HMAC
//!   dominates (a quarter of the untagged plain send, the rate of a plain send that tags its
//!   frames too): `benches/README.md`, "Large messages".
//! - **Limits.** In process the encoding is bincode, whose schema is fixed; a [`durable`]
//!   producer writes its chunks, which it stores, as its durable options say (codec, message
//!   version), across processes in the node's [`tcp::BodySchema`]. At its start it reads
//!   every stored message as its type, as it does whole ones: one of an older version goes
//!   through the upcaster and is sent written again at today's, split anew over its own seqs;
//!   one it cannot read (a newer version, a type changed without a new version) or that no
//!   longer fits its seqs stops the producer for good, naming the stream, the message and the
//!   versions, and stays stored for a producer that can read it. A durable producer without
//!   `chunk_size` stops (for good, saying why) on a stream that holds unsettled chunked
//!   messages, and one with it on a stream that holds unsettled whole messages: switch once the
//!   stream's messages are confirmed. Producer ids must be unique: two live producers sharing
//!   one would keep displacing each other's partial messages. Over NATS, a queue group spreads
//!   a message's chunks over its members: send chunked messages to a subject with one
//!   consumer. The outbox and work pulling send whole messages.
//!
//! # Running the handler
//!
//! Handlers of one consumer run strictly one at a time, on the consumer's arbiter, beside its
//! mailbox (never `ctx.wait`): timers, statistics queries and duplicate re-ACKs keep flowing
//! while a slow handler runs. Handler futures need not be `Send`. A handler that returns an
//! error or panics gets no ACK, is retried on the next retransmission, and leaves the consumer
//! running. A future that is ready on its first poll is handled without a task switch or an
//! allocation.
//!
//! # Batching
//!
//! Both controllers send what one mailbox drain produced in one actor message per peer: a
//! [`Deliveries`] batch from producer to consumer, an [`Acks`] batch back. Under load this
//! amortises the cost of an actor message over many messages; with sparse traffic every
//! batch holds one message and goes out as a plain [`Delivery`] or [`Ack`]. Batches are an
//! optimisation of transport only: each element is admitted, deduplicated and acknowledged
//! exactly as if it had arrived alone. Producers batch towards a [`ConsumerRef`] built from a
//! [`ConsumerHandle`] (`ProducerOptions::builder(&consumer)`) or a `ConsumerController`'s
//! `Addr`; built from a plain `Recipient<Delivery<T>>` (a proxy, a test link) it receives
//! single deliveries.
//!
//! # Configuration
//!
//! Options are validated when they are built; an invalid value is an [`OptionsError`] naming the
//! field. The numeric settings are plain serde structs ([`ProducerConfig`], [`ConsumerConfig`])
//! that an application can load from its own configuration; builder values win over loaded
//! ones, which win over the defaults.
//!
//! | producer option | default | consumer option | default |
//! |---|---|---|---|
//! | `window_size` | 16 | `max_producers` | 1024 (or unbounded) |
//! | `resend_timeout` | 500 ms | `producer_idle_ttl` | 300 s (or unbounded: never) |
//! | `producer_id` | `producer-` + 16 random hex digits | `max_out_of_order` | 1024 (or unbounded) |
//! | `max_pending` | 100 000 | `ordered` | false |
//! | `max_attempts` | unbounded | `handler_timeout` | 30 s (or unbounded: never) |
//! | `backoff` | fixed | dead-letter sink | none |
//! | `chunk_size` | none (whole messages) | `max_message_bytes` | 64 MiB |
//! | | | `max_reassembly_bytes` | 256 MiB |
//! | | | `reassembly_grace` | 5 s |
//! | | | `min_reassembly_rate` | 1 MiB/s |
//!
//! Keep `producer_idle_ttl` well above the longest gap between a producer's retransmissions:
//! `resend_timeout`, or with exponential backoff up to `backoff.max`. A window swept while its
//! producer still retransmits costs a duplicate handler run.
//!
//! ## One config tree
//!
//! Every settings struct of the crate follows these rules, so one file can configure a whole
//! node: [`ProducerConfig`], [`ConsumerConfig`],
//! [`PersistentConfig`](crate::persistence::PersistentConfig),
//! [`DurableConfig`](crate::durable::DurableConfig),
//! `SqliteConfig` (feature `sqlite`, on by default), `PostgresConfig` (feature `postgres`),
//! [`NodeConfig`](crate::tcp::NodeConfig) and `NatsConfig` (feature `nats`). Each takes
//! loaded values through its builder's `.config(…)`, and a value set on the builder wins over
//! a loaded one, which wins over the default, whatever order the calls come in; what breaks a
//! rule is refused when the options are built, naming the key.
//! `examples/node.toml` in the repository is such a file, with every section; an application
//! reads it into a struct of its own:
//!
//! ```
//! # use actix_delivery::{ConsumerConfig, ProducerConfig};
//! # use actix_delivery::durable::DurableConfig;
//! # use actix_delivery::journal::{SqliteConfig, SqliteOptions};
//! # use actix_delivery::tcp::{NodeConfig, NodeOptions, NodeSecret};
//! #[derive(serde::Deserialize)]
//! struct Settings {
//!     #[serde(default)]
//!     producer: ProducerConfig,
//!     #[serde(default)]
//!     consumer: ConsumerConfig,
//!     #[serde(default)]
//!     sqlite: SqliteConfig,
//!     #[serde(default)]
//!     node: NodeConfig,
//!     #[serde(default)]
//!     durable: DurableConfig,
//! }
//!
//! let settings: Settings = toml::from_str(r#"
//!     [producer]
//!     window_size = 64
//!     [node]
//!     listen = "127.0.0.1:7400"
//!     idle_timeout_ms = 5000
//!     [sqlite]
//!     readers = 4
//! "#).unwrap();
//! let node = NodeOptions::builder()
//!     .secret(NodeSecret::new([7; 32]).unwrap()) // a secret is code, never data
//!     .config(settings.node)
//!     .build()
//!     .unwrap();
//! assert_eq!(node.config().idle_timeout, std::time::Duration::from_secs(5));
//! let journal = SqliteOptions::builder().config(settings.sqlite).build().unwrap();
//! assert_eq!(journal.config().readers, 4);
//! assert_eq!(settings.producer.window_size, 64);
//! ```
//!
//! What is not data stays in code, set on the builders only: a node's secret or TLS
//! certificates and keys, its resolver, the PostgreSQL connection string (it holds a
//! password) and TLS, the NATS client (its credentials), a durable producer's journal, stream,
//! producer id, sink, message version and upcaster, and a persistent entity's versions. A
//! producer's `chunk_size` is set on its builder too, though it is a number: it needs
//! `T: Serialize + DeserializeOwned`, which a loaded configuration cannot promise.
//!
//! # Wire limits (not configurable)
//!
//! A delivery is refused as a dead letter if it has no `reply_to`, a `seq` outside
//! `1..=2^53-1` ([`MAX_SEQ`]), a producer id that is empty or longer than 256 bytes
//! ([`MAX_ID_BYTES`]), a `window_start` outside `1..=seq`, or a trace context with an all-zero
//! id ([`DeadLetterReason::InvalidTraceContext`]). A limit the sender could raise
//! would be no limit.
//!
//! `window_start` is the lowest seq the producer still awaits an ACK for. A consumer that has no
//! window for the producer (first contact, eviction, sweep, restart) starts there instead of
//! waiting for seqs that will never be sent again. A seq below the highest `window_start` seen is
//! stale: dropped without a handler run or an ACK ([`ConsumerStats::stale`]); an honest producer
//! never sends one again, so this costs only late copies of settled messages.
//!
//! # Tracing: spans and trace contexts
//!
//! With the feature `tracing`, the crate opens `tracing` spans for handler runs (with the
//! consumer's name, producer id and seq as fields), journal commits, recoveries, TCP
//! connections and handshakes, and NATS subscriptions; `telemetry::spans` lists their names
//! and fields. Without it, nothing of it is compiled in. The crate's `log` records stay `log`
//! records either way.
//!
//! A message can carry the trace it was sent in, so that a trace follows it from `send` to its
//! handler, also on another node: give the producer a hook,
//! [`ProducerOptionsBuilder::trace_context`], that reads the current context (say, from
//! OpenTelemetry) as a [`TraceContext`] (the W3C `traceparent`: trace id, span id, flags;
//! [`TraceContext::parse_traceparent`] and [`TraceContext::to_traceparent`] convert). It is
//! called at `tell`, `send` and `store` time; the context travels in the delivery, in process,
//! in the TCP frame and in the NATS message, and the handler reads it from
//! [`DeliveryInfo::trace_context`] (and, with the feature, it is the handler span's
//! `traceparent` field). This needs no feature. A message without a context costs one byte on
//! the wire and allocates nothing; a context is 25 bytes more. Contexts are not stored: a
//! message a durable producer sends again after a restart has none. Carrying them made the
//! wire protocol version 3: nodes and NATS carriers of an earlier release are refused (and
//! counted in `version_refusals`), so a deployment upgrades its nodes together.
//!
//! # Persistence: the journal
//!
//! Everything this crate stores goes through one [`journal::Journal`]: streams of events,
//! each named by a [`journal::PersistenceId`] and numbered 1, 2, 3, … without gaps, plus one
//! current snapshot per stream. An append resolves `Ok` only once its batch is committed, and
//! only if it continues the stream exactly: a second writer of the same stream gets
//! [`journal::JournalError::Conflict`] and writes nothing, so duplicates and split brains are
//! harmless. `journal::SqliteJournal` (feature `sqlite`, on by default) is the embedded
//! durable default (one SQLite file, WAL, `synchronous=FULL`, group commit: many appends from
//! many streams per fsync);
//! [`journal::MemoryJournal`] has the same semantics in memory, with fault injection for
//! tests. Payloads are bytes; [`codec`] turns typed values into them.
//!
//! # Projections: the read side
//!
//! Entities file their events under tags
//! ([`EventSourced::tags`](persistence::EventSourced::tags)), in the append that stores them;
//! the journals answer [`events_by_tag`](journal::Journal::events_by_tag) after an
//! [`Offset`](journal::Offset) that never skips an event, also when several processes commit to
//! PostgreSQL out of order. A [`projection::Projection`] follows a tag from its stored offset,
//! live, into a read model: exactly once when the handler writes in the read model's
//! transaction that also stores the offset (SQLite, PostgreSQL), at least once into any other
//! sink. Failing, deleted and undecodable entries are retried and then stop the projection
//! or are skipped, counted, as its [`PoisonPolicy`](projection::PoisonPolicy) says.
//!
//! # Metrics
//!
//! With the feature `metrics`, every counter of every stats struct (producer, consumer,
//! durable producer, persistent entity, journals, node, NATS carrier, projection, entity host,
//! shard coordinator, sharded producer), and histograms of
//! send→confirm latency, handler run time, journal commit latency and group size, and frames
//! and bytes per socket write, go through the [`metrics`](https://docs.rs/metrics/0.24) facade
//! to whatever recorder the application installed (before starting the parts it measures).
//! Names are `actix_delivery_<subsystem>_<counter>_total`, labels only names the application
//! chose (`metrics_label` on the options). The module `telemetry::metrics` lists every name,
//! type, label and meaning. Without the feature, none of it is compiled in.
//!
//! # The protocol core
//!
//! The rules live in [`protocol`], pure state machines with no Actix or Tokio in them (time is
//! an argument); the actors are thin shells over them. Custom transports and simulations can
//! drive the same core.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | on | `journal::SqliteJournal` and `projection::SqliteReadModel`: SQLite compiled in (`rusqlite`, bundled), no server |
//! | `postgres` | off | `journal::PostgresJournal`, `projection::PostgresReadModel`, `sharding::PostgresLeaseStore`: one database shared by the nodes |
//! | `nats` | off | the `nats` module: delivery through a NATS server |
//! | `tls` | off | TLS 1.3 on the TCP transport (`tcp::NodeTls`), and with `postgres` to PostgreSQL |
//! | `metrics` | off | every stats counter and the latency histograms through the `metrics` facade (`telemetry::metrics`) |
//! | `tracing` | off | `tracing` spans (`telemetry::spans`) |
//!
//! An application whose nodes share PostgreSQL compiles no SQLite with
//! `actix-delivery = { version = "0.1", default-features = false, features = ["postgres"] }`;
//! [`journal::MemoryJournal`] and every in-process and TCP part need no feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod codec;
mod config;
mod delivery;
pub mod durable;
mod error;
mod facade;
pub mod journal;
#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;
pub mod persistence;
pub mod projection;
pub(crate) use actix_delivery_proto::protocol;
mod runtime;
pub mod sharding;
pub mod tcp;
#[cfg(any(feature = "metrics", feature = "tracing"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "metrics", feature = "tracing"))))]
pub mod telemetry;
pub mod work_pulling;

pub use actix_delivery_proto::config::{
    Backoff, ConsumerConfig, Limit, ProducerConfig, MAX_DURATION,
};
pub use actix_delivery_proto::error::{
    DeliveryError, Failure, Happened, OptionsError, StartError, TellError,
};
pub use delivery::confirmation::Confirmation;
pub use delivery::consumer::{ConsumerController, ConsumerHandle};
pub use delivery::dead_letter::DeadLetter;
pub use delivery::handler::DeliveryHandler;
pub use delivery::message::{
    Acks, ChunkDeliveries, ChunkDelivery, ConsumerRef, Deliveries, Delivery, GetConsumerStats,
    GetOutOfOrder, GetProducerStats, ReplyTo, SingleAck, StopConsumer, StopProducer, Tell,
};
pub use delivery::options::{
    ConsumerOptions, ConsumerOptionsBuilder, ProducerOptions, ProducerOptionsBuilder,
    MAX_CHUNK_SIZE, MIN_CHUNK_SIZE,
};
pub use delivery::producer::{ProducerController, ProducerHandle};
pub use facade::ReliableDelivery;
pub use protocol::chunk::ChunkHeader;
pub use protocol::consumer::ConsumerStats;
pub use protocol::envelope::{
    Ack, DeadLetterReason, DeliveryInfo, Header, Incarnation, IncarnationId, ProducerId,
    MAX_ID_BYTES, MAX_SEQ,
};
pub use protocol::producer::ProducerStats;
pub use protocol::trace_context::TraceContext;
