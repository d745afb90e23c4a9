//! Durable producers: messages written to a journal before their first transmission, so that a
//! producer crash loses nothing.
//!
//! A producer started with [`DurableOptions`]
//! ([`ReliableDelivery::durable_producer`](crate::ReliableDelivery::durable_producer)) stores
//! each message in its journal stream before it sends it (a burst of messages is one append),
//! records which messages were settled (in batches, behind the ACKs), and compacts settled
//! messages away (snapshot + delete), so the journal holds O(unsettled) messages.
//!
//! Its incarnation is drawn once, when the stream is created, and stored: a restarted durable
//! producer **keeps its incarnation and continues its seq**, and first sends every stored,
//! unsettled message again under its original seq, through its window. A consumer that saw the
//! previous life recognises a message it handled as a duplicate; a persistent consumer does so
//! even after its own crash: effectively once end to end.
//!
//! - **Stored vs confirmed.** [`ProducerHandle::store`](crate::ProducerHandle::store) resolves
//!   once the message is stored (the producer owns it from then on, across crashes) with its
//!   [`MessageId`]; [`Stored::confirmed`] once the consumer's ACK is recorded. Confirmations of
//!   messages sent again after a restart (their callbacks died with the previous process) go to
//!   the optional sink as [`DurableConfirmation`]s and are counted in the producer's stats.
//! - **A confirmation fires once the settlement is recorded**, so a message's outcome reaches
//!   exactly one party: its callback (`send`, `tell`, [`Stored::confirmed`]) or, after a
//!   restart, the sink. Whatever ends the producer's life (`stop()`, a journal failure, a
//!   supervised restart), the writes it had in flight are kept and settled by the next opening
//!   of the stream from what the journal holds. Two exceptions: a process that dies between the
//!   record's commit and the callback loses the report (the message is settled), and a
//!   producer that cannot tell what the journal holds from another producer's doing settles
//!   such a message [`DeliveryError::InDoubt`]: its outcome then reaches the other producer's
//!   party once, or no one. It cannot tell when the stream was opened between its last
//!   opening and its new one, by another producer or by a failed opening of its own that
//!   committed after all. Openings are numbered, so a new opening numbered right after its
//!   last one proves that none came in between (a failed one that did not commit took no
//!   number): then the settlement the journal holds is its own, and its caller hears it.
//! - **The newest opener owns the stream.** Each start of a durable producer opens its stream
//!   and takes it over (a process cannot tell a live predecessor from a dead one: refusing
//!   newcomers would block every failover), and counts it
//!   ([`ProducerStats::takeovers`](crate::ProducerStats::takeovers)). A producer whose stream
//!   was taken over is refused at its next write by the journal's fence
//!   ([`crate::DeliveryError::Storage`], "the newest opener owns the stream") and stops for
//!   good: it does not fight back, and its [`stopped`](crate::ProducerHandle::stopped) says
//!   [`Failure::TakenOver`](crate::Failure::TakenOver). A second instance of the application
//!   started by mistake does this to the healthy one; with a
//!   [`lease`](DurableOptions::lease) a start watches the stream for one lease first and
//!   refuses it ([`Failure::InUse`](crate::Failure::InUse)) if its owner wrote meanwhile (an
//!   owner renews at least every third of the lease, also when idle; a crashed one does not,
//!   so its restart waits one lease at most). A stream whose events contradict each other
//!   (corrupt) stops the producer for good too, with an error naming it.
//! - **A store of unknown outcome waits for the truth.** When the journal fails in a way that
//!   leaves open whether a store committed (a storage error), the producer restarts (under its
//!   `Supervisor`) and reads the journal: a committed message is resent and its caller hears
//!   "stored" and "confirmed" as usual; one that was not committed is settled
//!   `DeliveryError::Storage` ("it was not stored") and never sent. A restart reopens the
//!   stream only as the opening it was: if another producer opened it since, the restarted one
//!   was taken over and stops for good. A producer that does not restart
//!   ([`DurableOptions::stop_on_journal_failure`]) settles the store
//!   [`DeliveryError::InDoubt`]: if it was stored, the next start sends it and its sink
//!   reports it.
//! - **Bursts are split, not refused.** One store writes as many waiting messages as fit in one
//!   journal entry (the codec's 16 MiB); a message that cannot fit any entry is refused alone.
//!   Resent messages hold room in the producer like new ones (`window_size + max_pending`),
//!   so after a restart new messages wait for the resent ones (backpressure).
//! - **`stop()` is graceful.** What is not stored yet never will be (settled `ProducerStopped`,
//!   `store()` says so); the store, settlement record or opening in flight is answered and what
//!   it decided is reported (a store that commits resolves `store()` with its id); the ACKs the
//!   producer received are recorded; then the actor stops for good and `stopped()` resolves. A
//!   journal failure meanwhile restarts it under its `Supervisor` and the stop goes on. The
//!   wait is bounded by [`DurableOptions::stop_timeout`] (10 s): what the journal has not
//!   answered by then is settled `InDoubt`. Stored, unconfirmed messages are settled
//!   `StoppedUnconfirmed` (not an outcome: the sink hears nothing of it) and sent again by the
//!   next start of the stream, whose sink reports them.
//! - A stream whose events do not decode, or whose schema this code cannot read, stops the
//!   producer for good (no restart loop), with an error naming the stream.
//! - **A stream holds one application's messages.** Its entries record the name of the message
//!   type ([`std::any::type_name`] of `T`): a producer of another type (another application
//!   with the same stream and producer names) does not open it, and its
//!   [`opened`](crate::ProducerHandle::opened) says so, naming both types, instead of sending
//!   the other application's stored messages to its own consumer. A `T` moved or renamed
//!   declares its former name ([`DurableOptions::accept_type_name`]). Streams written before
//!   the names held the message type are read by any producer.
//! - The journal holds the producer's incarnation token: protect it like a credential.
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//! use actix_delivery::durable::DurableOptions;
//! use actix_delivery::journal::{MemoryJournal, PersistenceId};
//! use actix_delivery::{ConsumerOptions, ConsumerRef, DeliveryHandler, ProducerOptions, ReliableDelivery};
//!
//! # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let journal = Arc::new(MemoryJournal::new());
//! let durable = || Ok::<_, Box<dyn std::error::Error>>(
//!     DurableOptions::new(journal.clone(), PersistenceId::new("orders")?, "order-service"),
//! );
//!
//! // First life: the consumer is unreachable (every delivery is lost), then the producer stops.
//! let lost = ConsumerRef::from_fn(|_deliveries| {});
//! let producer = ReliableDelivery::durable_producer(ProducerOptions::builder(lost).build()?, durable()?)?;
//! for order in 1..=3u64 {
//!     producer.store(order).await?; // stored: the producer owns it from here on
//! }
//! producer.stop();
//! producer.stopped().await?;
//!
//! // Next life (in a real application: the next process): it resends what was not confirmed.
//! let handled = Arc::new(AtomicU64::new(0));
//! let consumer = ReliableDelivery::consumer(
//!     ConsumerOptions::builder(DeliveryHandler::from_fn({
//!         let handled = handled.clone();
//!         move |_order: u64| {
//!             handled.fetch_add(1, Ordering::Relaxed);
//!             async { Ok::<(), std::io::Error>(()) }
//!         }
//!     }))
//!     .build()?,
//! );
//! let producer = ReliableDelivery::durable_producer(ProducerOptions::builder(&consumer).build()?, durable()?)?;
//! producer.idle().await;
//! assert_eq!(producer.stats().await?.resumed, 3);
//! assert_eq!(handled.load(Ordering::Relaxed), 3);
//! # Ok(()) }
//! ```

mod config;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod inspect;
use actix_delivery_proto::durable::log;
pub(crate) mod producer;

use std::sync::Arc;
use std::time::Duration;

use actix::Message;

use crate::codec::{Codec, Upcast, UpcastError};
use crate::config::Overrides;
use crate::error::{DeliveryError, OptionsError};
use crate::journal::{Journal, PersistenceId};
use crate::protocol::envelope::ProducerId;

pub use crate::delivery::confirmation::MessageId;
pub use crate::delivery::stored::Stored;
pub use config::DurableConfig;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use inspect::{
    is_durable_stream, read_durable_stream, DurableStreamInfo, StoredWhen, UnconfirmedMessage,
};

/// The confirmation of a message a durable producer sent again after a restart: its callback
/// died with the previous process, so it goes to the sink instead.
#[derive(Clone, Debug, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct DurableConfirmation {
    /// The message.
    pub id: MessageId,
    /// Its outcome: `Ok` when confirmed, or why it was given up ([`DeliveryError::GaveUp`],
    /// or [`DeliveryError::HandlingFailed`] from a work-pulling pool).
    pub result: Result<(), DeliveryError>,
}

/// Where, as whom and how a durable producer of messages `T` stores them.
///
/// The journal, the stream and the producer id are required (the constructor's arguments);
/// the data settings ([`DurableConfig`]: compaction interval, stop timeout, codec) can be
/// loaded with [`config`](Self::config) from the application's settings, and a value set here
/// wins over a loaded one, which wins over the default, whatever order the calls come in.
///
/// ```
/// # use std::sync::Arc;
/// # use actix_delivery::durable::DurableOptions;
/// # use actix_delivery::journal::{MemoryJournal, PersistenceId};
/// # use actix_delivery::{ConsumerOptions, DeliveryHandler, ProducerOptions, ReliableDelivery};
/// # #[actix::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let consumer = ReliableDelivery::consumer(ConsumerOptions::builder(
/// #     DeliveryHandler::from_fn(|_: String| async { Ok::<(), String>(()) })).build()?);
/// let journal = Arc::new(MemoryJournal::new()); // or SqliteJournal::open(path).await?
/// let producer = ReliableDelivery::durable_producer(
///     ProducerOptions::builder(&consumer).build()?,
///     DurableOptions::new(journal, PersistenceId::new("orders-out")?, "orders"),
/// )?;
/// let stored = producer.store("order-1".to_string()).await?; // in the journal now
/// stored.confirmed().await?; // and handled by the consumer
/// # Ok(()) }
/// ```
pub struct DurableOptions<T> {
    pub(crate) journal: Arc<dyn Journal>,
    pub(crate) stream: PersistenceId,
    pub(crate) producer_id: ProducerId,
    /// Loaded (or default) settings; with the builder values over them once resolved.
    pub(crate) config: DurableConfig,
    explicit: Overrides<DurableConfig>,
    pub(crate) sink: Option<actix::Recipient<DurableConfirmation>>,
    pub(crate) message_version: u32,
    pub(crate) upcast: Upcast<T>,
    /// Names `T` was stored under before (a rename or a move).
    pub(crate) former_type_names: Vec<String>,
    /// Restarted by a supervisor after a journal failure (the default), or stopped for good.
    pub(crate) restart_on_failure: bool,
}

impl<T> DurableOptions<T> {
    /// Store in stream `stream` of `journal`, as the producer `producer_id`. The stream belongs
    /// to this id across restarts, so it is fixed here: the producer options need not name it
    /// (if they do, it must be the same).
    ///
    /// **One live producer per stream: the newest opener owns it.** Each start opens the
    /// stream and takes it over, which is what a restarted process needs (its predecessor may
    /// be dead or only paused; the journal's fence keeps the two apart). It is also what a
    /// second instance of the application started by mistake on the same stream does: it
    /// takes the stream, and the healthy instance's producer stops for good at its next write,
    /// its [`stopped`](crate::ProducerHandle::stopped) saying
    /// [`Failure::TakenOver`](crate::Failure::TakenOver). Openings that took the stream over
    /// from an earlier one are counted
    /// ([`ProducerStats::takeovers`](crate::ProducerStats::takeovers)). To refuse a stream
    /// whose owner is alive instead, give every producer of the stream a
    /// [`lease`](Self::lease).
    pub fn new(
        journal: Arc<dyn Journal>,
        stream: PersistenceId,
        producer_id: impl Into<ProducerId>,
    ) -> Self {
        Self {
            journal,
            stream,
            producer_id: producer_id.into(),
            config: DurableConfig::default(),
            explicit: Overrides::default(),
            sink: None,
            message_version: 1,
            former_type_names: Vec::new(),
            restart_on_failure: true,
            upcast: |old| {
                Err(UpcastError::new(format!(
                    "written as {}, and the producer has no upcaster (DurableOptions::upcast)",
                    old.manifest()
                )))
            },
        }
    }

    /// Loaded settings (e.g. a `[durable]` section of the application's config file); values
    /// set on these options still win.
    pub fn config(mut self, config: DurableConfig) -> Self {
        self.config = config;
        self
    }

    /// The codec new messages are stored in (default [`Codec::MessagePack`]; see
    /// [`DurableConfig::codec`]).
    pub fn codec(mut self, codec: Codec) -> Self {
        self.explicit.set(move |c| c.codec = codec);
        self
    }

    /// The schema version of `T` this code stores (default 1; messages stored before versions were
    /// recorded are version 1). Raise it with a change of `T` that cannot decode what the previous
    /// version stored, and read the older versions with [`upcast`](Self::upcast). A stored message
    /// of a newer version than this (the code was rolled back) stops the producer for good with an
    /// error naming stream, seq and versions. At least 1:
    /// [`ReliableDelivery::durable_producer`](crate::ReliableDelivery::durable_producer) refuses 0.
    /// Code, not data: not among the loaded settings. With
    /// [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size) in process, the chunks the
    /// producer sends (and stores) are written at this version and in this codec too, and read with
    /// the upcaster; across processes they are written in the node's
    /// [`BodySchema`](crate::tcp::BodySchema), which reads them back.
    pub fn message_version(mut self, version: u32) -> Self {
        self.message_version = version;
        self
    }

    /// How a message stored at an older [`message_version`](Self::message_version) becomes a `T`
    /// when the stream is resumed: decode it as the type it was stored as with
    /// [`Written::decode`](crate::codec::Written::decode), dispatching on
    /// [`Written::version`](crate::codec::Written::version). Without one, such a message stops the
    /// producer for good with an error naming it.
    pub fn upcast(mut self, upcast: Upcast<T>) -> Self {
        self.upcast = upcast;
        self
    }

    /// A name `T` was stored under before: the type was moved to another module or crate, or
    /// renamed. The stream records the [`std::any::type_name`] of the messages it holds, and a
    /// producer of another type is refused its stream (another application's messages are not
    /// sent as this one's): its [`opened`](crate::ProducerHandle::opened) fails with
    /// [`JournalError::ForeignType`](crate::journal::JournalError::ForeignType)'s text, naming
    /// both names. Each name given here is read as `T`'s own (call it once per former name);
    /// the compiler's spelling of a name changing would be mended the same way.
    /// Code, not data: not among the loaded settings.
    pub fn accept_type_name(mut self, name: impl Into<String>) -> Self {
        self.former_type_names.push(name.into());
        self
    }

    /// How long [`ProducerHandle::stop`](crate::ProducerHandle::stop) waits for the journal to
    /// answer the writes in flight (default 10 s; see [`DurableConfig::stop_timeout`]).
    /// Positive: [`ReliableDelivery::durable_producer`](crate::ReliableDelivery::durable_producer)
    /// refuses 0.
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.explicit.set(move |c| c.stop_timeout = timeout);
        self
    }

    /// Refuse to take the stream over from a live producer: watch it for `lease` before
    /// opening it, and write to it at least every third of `lease` while owning it (default
    /// none; see [`DurableConfig::lease`]). Positive:
    /// [`ReliableDelivery::durable_producer`](crate::ReliableDelivery::durable_producer)
    /// refuses 0.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.explicit.set(move |c| c.lease = Some(lease));
        self
    }

    /// Compact after this many messages stored and settlement records written (default 1 000;
    /// see [`DurableConfig::snapshot_every`]). Positive:
    /// [`ReliableDelivery::durable_producer`](crate::ReliableDelivery::durable_producer)
    /// refuses 0.
    pub fn snapshot_every(mut self, writes: u64) -> Self {
        self.explicit.set(move |c| c.snapshot_every = writes);
        self
    }

    /// Stops the producer for good at its first journal failure, its
    /// [`stopped`](crate::ProducerHandle::stopped) saying why, for an application that would
    /// rather fail than wait (its orchestrator restarts it). By default an Actix `Supervisor`
    /// restarts the producer on what the journal holds, after a backoff that doubles per
    /// consecutive failure (100 ms up to 10 s), for as long as the journal fails.
    pub fn stop_on_journal_failure(mut self) -> Self {
        self.restart_on_failure = false;
        self
    }

    /// Where confirmations of messages sent again after a restart go.
    pub fn confirmations(mut self, sink: actix::Recipient<DurableConfirmation>) -> Self {
        self.sink = Some(sink);
        self
    }

    /// Applies the builder values over the loaded settings and checks every rule.
    pub(crate) fn resolve(&mut self) -> Result<(), OptionsError> {
        let explicit = std::mem::take(&mut self.explicit);
        self.config = explicit.apply(std::mem::take(&mut self.config));
        self.config.validate()?;
        if self.message_version == 0 {
            return Err(OptionsError::new(
                "message_version",
                "versions start at 1 (got 0)",
            ));
        }
        Ok(())
    }
}

impl<T> std::fmt::Debug for DurableOptions<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableOptions")
            .field("stream", &self.stream)
            .field("producer_id", &self.producer_id)
            .field("config", &self.config)
            .field("explicit", &self.explicit)
            .field("message_version", &self.message_version)
            .field("former_type_names", &self.former_type_names)
            .field("restart_on_failure", &self.restart_on_failure)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::MemoryJournal;

    #[test]
    fn options_take_explicit_over_loaded_over_default_in_any_order() {
        let loaded = DurableConfig {
            snapshot_every: 50,
            stop_timeout: Duration::from_secs(3),
            ..DurableConfig::default()
        };
        let stream = PersistenceId::new("s").unwrap();
        let mut options = DurableOptions::<u32>::new(Arc::new(MemoryJournal::new()), stream, "p")
            .snapshot_every(7) // explicit, set before loading
            .config(loaded);
        options.resolve().unwrap();
        assert_eq!(options.config.snapshot_every, 7, "explicit wins");
        assert_eq!(
            options.config.stop_timeout,
            Duration::from_secs(3),
            "loaded"
        );
        assert_eq!(options.config.codec, Codec::MessagePack, "default");
        let zero = DurableConfig {
            snapshot_every: 0,
            ..DurableConfig::default()
        };
        let stream = PersistenceId::new("s").unwrap();
        let mut options =
            DurableOptions::<u32>::new(Arc::new(MemoryJournal::new()), stream, "p").config(zero);
        assert_eq!(options.resolve().unwrap_err().field, "snapshot_every");
    }
}
