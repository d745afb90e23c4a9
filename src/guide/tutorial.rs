//! # Getting started: a producer and a consumer
//!
//! This chapter builds the smallest reliable link, one producer and one consumer in one process,
//! and then shows each thing a real application adds. The main demo is the runnable version of
//! it: `cargo run --example quickstart`.
//!
//! ## The smallest link
//!
//! A consumer runs your handler for each new message and acknowledges (ACKs) it only when the
//! handler returned `Ok`; a producer numbers the messages, keeps a window of them in flight,
//! retransmits what is not ACKed, and confirms each message to its sender once.
//!
//! ```
//! use actix_delivery::{
//!     ConsumerOptions, DeliveryError, DeliveryHandler, ProducerOptions, ReliableDelivery,
//! };
//!
//! #[derive(Clone, Debug)]
//! struct Order {
//!     id: u32,
//! }
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let consumer = ReliableDelivery::consumer(
//!         ConsumerOptions::builder(DeliveryHandler::from_fn(|order: Order| async move {
//!             println!("handling order {}", order.id);
//!             Ok::<(), std::io::Error>(()) // Err: not ACKed, the producer retransmits
//!         }))
//!         .build()?,
//!     );
//!     let producer = ReliableDelivery::producer(
//!         ProducerOptions::builder(&consumer).window_size(16).build()?,
//!     );
//!
//!     // Fire and be called back exactly once ...
//!     producer.tell(Order { id: 1 }, |result: Result<(), DeliveryError>| {
//!         println!("order 1: {result:?}");
//!     })?;
//!     // ... or await the confirmation.
//!     producer.send(Order { id: 2 }).await?;
//!
//!     producer.idle().await; // everything told is settled
//!     producer.stop();
//!     producer.stopped().await?;
//!     Ok(())
//! }
//! ```
//!
//! Options are checked when they are built: an invalid value is an
//! [`OptionsError`](crate::OptionsError) naming the setting. [Configuration](super::configuration)
//! lists every setting and how to load them from a file.
//!
//! ## Handlers
//!
//! The handler's result *is* the acknowledgement: `Ok` ACKs the message, `Err` (or a panic)
//! leaves it unACKed, and the producer's retransmission runs it again. A handler that logs its
//! error and returns `Ok` gets its message ACKed and never retried (see
//! [Limits](super::guarantees#limits-read-before-relying-on-it)).
//!
//! | constructor | the handler gets | for |
//! |---|---|---|
//! | [`DeliveryHandler::from_fn`](crate::DeliveryHandler::from_fn) | the body | most handlers |
//! | [`DeliveryHandler::from_fn_with_info`](crate::DeliveryHandler::from_fn_with_info) | the body and its [`DeliveryInfo`](crate::DeliveryInfo) (producer id, public incarnation id, seq) | handlers that record what they processed |
//! | [`DeliveryHandler::pipelined`](crate::DeliveryHandler::pipelined) | the body, in order, without waiting for the previous message's outcome | handlers bound by a slow acknowledgement of their own (a journal commit) |
//! | [`DeliveryHandler::forward_to`](crate::DeliveryHandler::forward_to) | nothing: an existing actor gets the body as its message | making an existing actor a reliable consumer without changing it (`cargo run --example wrap_actor`) |
//!
//! A handler run that takes longer than `handler_timeout` (30 s by default) is abandoned as a
//! failure and runs again on retransmission.
//!
//! ## Sending and backpressure
//!
//! A producer holds at most `window_size + max_pending` messages. Without room:
//!
//! - [`tell`](crate::ProducerHandle::tell) refuses at once with
//!   [`TellError::QueueFull`](crate::TellError), which hands the body back;
//! - [`send`](crate::ProducerHandle::send) waits for room;
//! - [`send_timeout`](crate::ProducerHandle::send_timeout) waits until a deadline, then fails
//!   with [`DeliveryError::Timeout`](crate::DeliveryError::Timeout): the message was certainly
//!   not sent.
//!
//! `send` queues the message when it is called, not when the future is first polled.
//!
//! ## Errors
//!
//! Every [`DeliveryError`](crate::DeliveryError) says, through
//! [`happened()`](crate::DeliveryError::happened), which of three it is: the message certainly
//! was not sent or stored (a retry is safe), it is in doubt (a durable producer settles it at its
//! next start), or it was sent and failed after (the consumer may have handled it). The table of
//! every error is on [`DeliveryError`](crate::DeliveryError). An error's `Display`, and every line
//! the crate logs, carries the whole cause chain.
//!
//! ## Stopping
//!
//! [`idle().await`](crate::ProducerHandle::idle) waits until everything told is settled;
//! `stop()` stops a producer or consumer for good and `stopped().await` says when (and, for the
//! parts that open a stream, why: see [Durable producers](super::durable_producers)). A stopped
//! producer settles every message it still holds:
//! [`DeliveryError::StoppedUnconfirmed`](crate::DeliveryError::StoppedUnconfirmed) if it had sent it, [`DeliveryError::ProducerStopped`](crate::DeliveryError::ProducerStopped) if
//! not.
//!
//! ## Where the actors run
//!
//! A producer runs on the arbiter that starts it, or on the one its options name
//! (`ProducerOptions::builder(&consumer).arbiter(&handle)`). A consumer's handler need not be
//! `Send`, so a consumer on another arbiter builds its options there:
//! [`ReliableDelivery::consumer_in`](crate::ReliableDelivery::consumer_in).
//!
//! ## Watching it
//!
//! [`ProducerHandle::stats`](crate::ProducerHandle::stats),
//! [`ConsumerHandle::stats`](crate::ConsumerHandle::stats),
//! [`tracked_producers`](crate::ConsumerHandle::tracked_producers) and
//! [`out_of_order_for`](crate::ConsumerHandle::out_of_order_for) report what the controllers
//! hold and every refusal they counted. Malformed deliveries go to an optional
//! [`DeadLetter`](crate::DeadLetter) sink. With the `metrics` and `tracing` features the same
//! counters become metrics and spans: [Running in production](super::production).
//!
//! ## Your own transport
//!
//! A producer sends to a [`ConsumerRef`](crate::ConsumerRef) and a consumer answers to a
//! [`ReplyTo`](crate::ReplyTo); both can be one closure
//! ([`ConsumerRef::from_fn`](crate::ConsumerRef::from_fn),
//! [`ReplyTo::from_fn`](crate::ReplyTo::from_fn)), which is how test links and custom transports
//! plug in. [`Delivery::new`](crate::Delivery::new) makes a delivery by hand. The TCP and NATS
//! transports are built this way: [Across processes over TCP](super::over_tcp).
//!
//! ## Next
//!
//! Read [Guarantees and limits](super::guarantees) before relying on the library. For
//! effectively-once processing, continue with [Effectively once](super::effectively_once).
