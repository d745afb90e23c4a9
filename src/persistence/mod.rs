//! Persistence: event-sourced entities whose commands are answered only once their events are
//! durable, and the effectively-once consumer built on them.
//!
//! An [`EventSourced`] type describes an entity: a pure [`decide`](EventSourced::decide) turns
//! a command and the state into events and a reply, [`apply`](EventSourced::apply) folds events
//! into the state. A [`PersistentActor`] runs it over a [`Journal`](crate::journal::Journal)
//! stream: it recovers the state on start, applies each command's events at once, and replies
//! only after they are committed. Commands decided while one append is in flight share the next
//! append, so one entity commits many commands per journal write.
//!
//! # Effectively once
//!
//! A command may carry the [`DeliveryInfo`](crate::DeliveryInfo) of the message it came from.
//! The actor then stores the delivery's *processed mark* in the same journal entry as the
//! command's events, and keeps a record of processed deliveries (per producer incarnation, the
//! dedup windows of the consumer) as part of its recovered state and snapshots. A delivery whose
//! mark is recorded is answered [`Outcome::AlreadyProcessed`] without deciding again.
//!
//! [`PersistentHandle::delivery_handler`] makes that a consumer: each new message becomes a
//! command; the message is ACKed once the reply says the command is durable (or was processed
//! before). So across any number of consumer crashes and restarts:
//!
//! - crash before the commit: no ACK, the producer retransmits, the command is decided again on
//!   the recovered state (which does not have it);
//! - crash after the commit, before the ACK reached the producer: the producer retransmits, the
//!   recovered record knows the delivery, it is answered at once and ACKed;
//!
//! **every message's events are stored exactly once.** What this does not cover: side effects
//! outside the journal. An email sent, or an HTTP call made, from the handler or after the
//! reply, happens at least once: make it idempotent, or emit it as a delivery of its own.
//! The record forgets producers beyond `max_producers` (least recently recorded first): a
//! retransmission from a forgotten producer is processed again.
//!
//! A delivery below its producer's window start that was never processed is *stale*: it is
//! refused ([`CommandError::Stale`]), never processed and never ACKed, exactly as the consumer
//! does ([Trust](crate::guide::guarantees#trust-the-incarnation-is-a-capability)).
//!
//! # Changing the types
//!
//! Entries and snapshots record their codec, the name of their type and its version, and are read
//! in the codec they were written in. The name says whose data a stream is: a stream of another
//! type's name is another application's, and its recovery fails with
//! [`JournalError::ForeignType`](crate::journal::JournalError::ForeignType) naming both names,
//! rather than reading it as this entity's; a type moved or renamed lists its former names in
//! [`EventSourced::FORMER_TYPE_NAMES`]. With the default
//! [`Codec::MessagePack`](crate::codec::Codec) a field added with `#[serde(default)]` needs no
//! code; a breaking change raises [`EventSourced::EVENT_VERSION`] (or
//! [`STATE_VERSION`](EventSourced::STATE_VERSION)) and reads the older versions in
//! [`EventSourced::upcast_events`] (or [`upcast_state`](EventSourced::upcast_state)); see
//! [`crate::codec`]. [Changing your types](crate::guide::schema_evolution) gives the recipe for
//! each classic change (add a field, rename a field, remove or split an event, change the
//! snapshot type).
//!
//! # Two instances of one entity
//!
//! The journal's fence makes a second writer of the stream harmless: an append at a seq the
//! other instance already wrote fails with a conflict, and the losing actor catches up (replays
//! what the other wrote, marks included) and decides the same commands again. A delivery the
//! other instance processed is then answered as already processed.

mod actor;
pub(crate) use actix_delivery_proto::persistence::behavior;
use actix_delivery_proto::persistence::config;
use actix_delivery_proto::persistence::core;
pub(crate) use actix_delivery_proto::persistence::error;
mod handle;
#[cfg(feature = "metrics")]
pub(crate) mod metrics;
mod options;
mod outbox;
use actix_delivery_proto::persistence::outbox_state;
pub(crate) use actix_delivery_proto::persistence::type_names;

pub(crate) use self::actor::Ask;
pub use self::actor::{
    recover_state, Execute, GetPersistentStats, PersistentActor, StopPersistent,
};
pub use self::behavior::{Decision, EventSourced};
pub use self::config::PersistentConfig;
pub(crate) use self::core::Answer;
pub use self::core::{Outcome, PersistentStats};
pub use self::error::CommandError;
pub(crate) use self::handle::check_versions;
pub use self::handle::PersistentHandle;
pub use self::options::PersistentOptions;
pub use self::outbox::Outbox;
