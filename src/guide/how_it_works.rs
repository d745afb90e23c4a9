//! # How it works
//!
//! The protocol between the two controllers, what the actors add to it, and how the code is
//! split. None of this is needed to use the library; it explains what the other chapters rely on.
//! The flow of one message is the diagram on the [crate page](crate).
//!
//! ## Two crates: cores and shells
//!
//! `actix-delivery-proto` holds the protocol and every subsystem's rules as pure state machines:
//! no Actix, no Tokio, no clock, no OS randomness (time and seeds are arguments), and dependencies
//! that cannot reach a socket. `actix-delivery` holds the actors, tasks, sockets and databases that
//! drive them: the producer and consumer actors are thin shells that feed the cores messages and
//! timer ticks. Custom transports and simulations can drive the same cores; depend on
//! `actix-delivery-proto` for that. `ARCHITECTURE.md` in the repository says where each folder
//! sits and what it may import.
//!
//! ## Running the handler
//!
//! Handlers of one consumer run strictly one at a time, on the consumer's arbiter, beside its
//! mailbox (never `ctx.wait`): timers, statistics queries and duplicate re-ACKs keep flowing while
//! a slow handler runs. Handler futures need not be `Send`. A handler that returns an error or
//! panics gets no ACK, is retried on the next retransmission, and leaves the consumer running. A
//! future that is ready on its first poll is handled without a task switch or an allocation.
//!
//! ## Batching
//!
//! Both controllers send what one mailbox drain produced in one actor message per peer: a
//! [`Deliveries`](crate::Deliveries) batch from producer to consumer, an [`Acks`](crate::Acks)
//! batch back, at most 1 KiB of elements each. Under load this amortises the cost of an actor
//! message over many messages; with sparse traffic every batch holds one message and goes out as
//! a plain [`Delivery`](crate::Delivery) or [`SingleAck`](crate::SingleAck). Batches are an
//! optimisation of transport only: each element is admitted, deduplicated and acknowledged
//! exactly as if it had arrived alone. Producers batch towards a
//! [`ConsumerRef`](crate::ConsumerRef) built from a [`ConsumerHandle`](crate::ConsumerHandle)
//! (`ProducerOptions::builder(&consumer)`) or a `ConsumerController`'s `Addr`; built from a plain
//! `Recipient<Delivery<T>>` (a proxy, a test link) it receives single deliveries. Handles do not
//! send one actor message per `tell` either: they leave messages in the producer's inbox and wake
//! it once per burst.
//!
//! ## The window start
//!
//! Beyond the seed protocol (producer id, incarnation, seq, body, reply address), each delivery
//! carries `window_start`, the lowest seq its producer still awaits an ACK for. A consumer that
//! has no window for the producer (first contact, eviction, idle sweep, restart) starts the
//! window there instead of waiting for seqs that will never be sent again; without it, a consumer
//! that lost a window would refuse the producer's later seqs forever once `max_out_of_order`
//! filled up. A seq below the highest `window_start` seen is stale: dropped without a handler run
//! or an ACK ([`ConsumerStats::stale`](crate::ConsumerStats::stale)); an honest producer never
//! sends one again, so this costs only late copies of settled messages.
//!
//! ## Wire limits (not configurable)
//!
//! A delivery is refused as a dead letter if it has no `reply_to`, a `seq` outside `1..=2^53-1`
//! ([`MAX_SEQ`](crate::MAX_SEQ)), a producer id that is empty or longer than 256 bytes
//! ([`MAX_ID_BYTES`](crate::MAX_ID_BYTES)), a `window_start` outside `1..=seq`, or a trace context
//! with an all-zero id
//! ([`DeadLetterReason::InvalidTraceContext`](crate::DeadLetterReason::InvalidTraceContext)). A
//! limit the sender could raise would be no limit.
