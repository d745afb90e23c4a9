//! # Guarantees and limits
//!
//! What the library promises, under which conditions, and where the promises end. Every other
//! chapter states only what its part adds to this one.
//!
//! ## Guarantees
//!
//! - **At least once.** Every message told to a running producer is handled by a successful
//!   handler run at least once, or its confirmation reports why not
//!   ([`DeliveryError::ProducerStopped`](crate::DeliveryError::ProducerStopped),
//!   [`DeliveryError::GaveUp`](crate::DeliveryError::GaveUp) after `max_attempts`,
//!   [`DeliveryError::QueueFull`](crate::DeliveryError::QueueFull),
//!   [`DeliveryError::HandlingFailed`](crate::DeliveryError::HandlingFailed) when a work-pulling
//!   pool gave a job up, …), and [`DeliveryError::happened`](crate::DeliveryError::happened) says
//!   whether the message certainly was not stored or sent (a retry is safe), is in doubt, or was
//!   sent and failed after. Lost deliveries and lost ACKs are recovered by retransmission every
//!   `resend_timeout`.
//! - **Duplicates suppressed while the consumer lives.** The consumer remembers, per producer id
//!   and incarnation, which seqs were handled; a retransmission or duplicated delivery of a
//!   handled seq is re-ACKed without running the handler, and a retransmission of a seq whose
//!   handler is still running is dropped (its ACK follows the run). Each id keeps windows for up
//!   to four incarnations, so a late copy from a restarted producer's previous life is still
//!   recognised and resets nothing.
//! - **Confirmation exactly once.** Each message's confirmation fires once: `Ok(())` when the
//!   consumer's ACK reached the producer, an error otherwise. A confirmation means the consumer
//!   took responsibility for the message: for a retransmission, the handler may have run on an
//!   earlier attempt, not this one.
//! - **Flow control.** At most `window_size` messages are in flight; up to `max_pending` more
//!   wait in the producer. [`ProducerHandle::tell`](crate::ProducerHandle::tell) hands the body
//!   back when the queue is full, [`ProducerHandle::send`](crate::ProducerHandle::send) waits for
//!   room.
//! - **Forged or stale ACKs are ignored.** The producer acts on an ACK only if it carries its id,
//!   its current 128-bit incarnation (drawn from the OS CSPRNG at every start, and only ever sent
//!   on its own deliveries) and a seq in flight. Anything else is counted in
//!   [`ProducerStats::ignored_acks`](crate::ProducerStats::ignored_acks) and changes nothing.
//! - **Bounded memory.** In flight ≤ `window_size`, queued ≤ `max_pending`, producer ids in the
//!   dedup table ≤ `max_producers` (least recently used evicted; each keeps at most four
//!   incarnation windows), per producer handled-above-contiguous plus waiting ≤
//!   `max_out_of_order` (plus the gap-closing seq, always admitted so the bound cannot deadlock),
//!   idle producers swept after `producer_idle_ttl`, whatever a peer sends. Malformed deliveries
//!   are refused as [`DeadLetter`](crate::DeadLetter)s. Every refusal is counted in
//!   [`ConsumerStats`](crate::ConsumerStats) and logged at most once a minute per kind (without
//!   peer-supplied ids).
//! - **A stuck handler cannot stall the consumer for good.** Handlers run one at a time; a run
//!   that takes longer than `handler_timeout` (default 30 s) is abandoned: its future is dropped,
//!   it counts as a failure (no ACK), and the next message runs. The abandoned message runs again
//!   when its producer retransmits it. Abandoning only stops waiting: work the handler started
//!   elsewhere (an actor that got the message through
//!   [`DeliveryHandler::forward_to`](crate::DeliveryHandler::forward_to)) may still complete, and
//!   then happen twice.
//! - **Order.** By default the handler sees messages in arrival order, which retransmission can
//!   change. With `ordered(true)` it sees each producer's messages strictly in seq order: a
//!   delivery that arrives ahead of its turn is refused and retransmitted later.
//!
//! ## What each combination guarantees
//!
//! A producer in memory loses what it holds when its process dies; a consumer in memory forgets
//! what it handled. A [durable producer](super::durable_producers) and a
//! [persistent consumer](super::effectively_once) each remove one of these:
//!
//! | | producer in memory | durable producer |
//! |---|---|---|
//! | **consumer in memory** | at least once; a producer crash loses its unconfirmed messages, a consumer crash re-runs handlers | at least once; nothing lost when the producer crashes; a consumer crash re-runs handlers |
//! | **persistent consumer** | every message's events stored exactly once, across consumer crashes; a producer crash loses its unconfirmed messages | **effectively once end to end**: any number of crashes on either side, no message lost, no event stored twice |
//!
//! "Effectively once" covers what the journal stores. Side effects outside it (an email, a call
//! to another service) still happen at least once: make them idempotent.
//!
//! ## Limits: read before relying on it
//!
//! - **The consumer's dedup lives in memory.** If the consumer crashes or restarts between
//!   "handler done" and "ACK received by the producer", the producer retransmits and the *new*
//!   consumer runs the handler again. The same happens after a dedup window was evicted
//!   (`max_producers`) or swept (`producer_idle_ttl`). So plain handlers must be idempotent; for
//!   effectively-once processing, hand each message to a persistent entity
//!   ([Effectively once](super::effectively_once)), which stores the delivery's processed mark
//!   atomically with its events.
//! - **Producer ids must be unique per live producer.** Two live producers configured with the
//!   same id still work (each incarnation has its own window) but compete for the id's four
//!   windows; the consumer counts and warns when an older incarnation keeps sending long after a
//!   newer one appeared
//!   ([`ConsumerStats::shared_id_messages`](crate::ConsumerStats::shared_id_messages)).
//! - **Ordered mode is strict while the window lives.** When the consumer loses a producer's
//!   window (eviction, sweep, restart), a late copy of an earlier message, or of one its producer
//!   already gave up or settled as stopped, can run after later ones. For an order that survives
//!   crashes, use `must_follow` on a persistent receiver
//!   ([the outbox](super::durable_producers#the-outbox)).
//! - **A producer in memory loses what it holds when it stops.** Unconfirmed messages of a
//!   stopped producer are settled with
//!   [`DeliveryError::StoppedUnconfirmed`](crate::DeliveryError::StoppedUnconfirmed) if it had
//!   sent them (the consumer may or may not have handled them), with
//!   [`DeliveryError::ProducerStopped`](crate::DeliveryError::ProducerStopped) if not. A restarted
//!   producer uses a new incarnation, so its reused seqs are never mistaken for duplicates. A
//!   [durable producer](super::durable_producers) stores its messages first and resends them
//!   after a restart under the same incarnation and seqs.
//! - **Don't swallow errors in the handler.** The handler's result *is* the acknowledgement.
//!   This handler ACKs a message whose processing failed, and it is never retried:
//!
//!   ```
//!   # use actix_delivery::DeliveryHandler;
//!   # async fn process(_: String) -> Result<(), std::io::Error> { Ok(()) }
//!   // ✗ Anti-pattern: the error is logged and dropped, the handler resolves Ok, the message
//!   //   is ACKed as done although processing failed.
//!   let _handler = DeliveryHandler::from_fn(|order: String| async move {
//!       if let Err(err) = process(order).await {
//!           log::warn!("failed: {err}");
//!       }
//!       Ok::<(), std::io::Error>(())
//!   });
//!   // ✓ Let the error propagate: no ACK, the producer retransmits, the handler retries.
//!   let _handler = DeliveryHandler::from_fn(|order: String| async move { process(order).await });
//!   ```
//!
//!   If a message can never succeed, record it for a separate retry workflow and then return
//!   `Ok`, or bound the retries with `max_attempts` on the producer.
//! - **Not for everything.** Each message costs a tell to the producer, a share of a delivery and
//!   of an ACK (batched under load, one each when traffic is sparse) and some bookkeeping, instead
//!   of one `do_send` (the README's cost table has the ratios). Telemetry, health pings and
//!   transient UI updates should use a plain `do_send`.
//! - **Inside one cluster.** The controllers connect actors of one Actix application (or one
//!   cluster of nodes). External or cross-cluster consumers belong on a broker such as NATS
//!   JetStream or Kafka ([Choosing a transport](super::over_nats#choosing-a-transport)).
//!
//! ## Trust: the incarnation is a capability
//!
//! Whoever holds a producer's id and current [`Incarnation`](crate::Incarnation) token, and can
//! reach its consumer, can speak for that producer: deliver bodies in its name (which the handler
//! runs), or claim seqs settled through `window_start` (which makes the consumer refuse the
//! producer's genuine copies of them: they are never confirmed, and end as
//! [`DeliveryError::GaveUp`](crate::DeliveryError::GaveUp) or are retransmitted forever). What it
//! can never do is get a message confirmed `Ok` that no handler ran: a seq below a delivery's
//! `window_start` is *stale*, neither run nor re-ACKed.
//!
//! So the token leaves the producer only on its own deliveries; handlers
//! ([`DeliveryInfo`](crate::DeliveryInfo)), dead letters, logs and journals see
//! [`IncarnationId`](crate::IncarnationId), a one-way digest that names the incarnation without
//! granting anything, and the token's `Debug` prints only that id. A journal of a durable producer
//! holds its token: protect it like a credential.
//!
//! A public id grants nothing anywhere, including where a body names a producer's message (a
//! sharded producer's `EntityEnvelope` origin, a work-pulling `Job` id), which an effectively-once
//! receiver records as processed: the pool's streams carry tokens derived from the producer's, the
//! named id must be the public id of the token the delivery carries, and any other is a dead letter
//! ([`DeadLetterReason::ForeignOrigin`](crate::DeadLetterReason::ForeignOrigin)) that runs nothing
//! and moves no window.
//!
//! In-process code is trusted (it could as well call the handler itself). Across processes only
//! authenticated nodes may send deliveries, and what a peer sends that cannot be used counts
//! against the same bounds as useful input: [Security](super::over_tcp#security-three-modes).
