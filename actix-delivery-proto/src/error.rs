//! Error types: one enum per layer; what the handles say of a part's start and end
//! ([`Failure`], [`StartError`]); and (crate-internal) how the crate writes the errors of the
//! libraries it uses, with their whole cause chain, into its own.

use std::fmt;

pub mod chain;
mod lifecycle;

pub(crate) use chain::PlainChain;
pub use lifecycle::{Failure, StartError};

/// Why a message was not confirmed. Passed to confirmation callbacks and returned by
/// `ProducerHandle::send` and
/// `store` (and `Stored::confirmed`).
///
/// Each error says which of three it is, [`happened`](Self::happened): the message certainly
/// was not stored or sent (a retry is safe), it is in doubt (the journal settles it later), or
/// it was stored or sent and failed after that (a retry stores or sends it again):
///
/// | error | [`Happened`] | what became of the message |
/// |---|---|---|
/// | [`QueueFull`](Self::QueueFull), [`Timeout`](Self::Timeout) | `CertainlyNot` | refused for want of room |
/// | [`ProducerStopped`](Self::ProducerStopped) | `CertainlyNot` | the producer stopped before it stored or sent it |
/// | [`Storage`](Self::Storage) | `CertainlyNot` | the journal failed, it was not stored |
/// | [`NotDurable`](Self::NotDurable), [`Unencodable`](Self::Unencodable) | `CertainlyNot` | refused: a retry fails the same way |
/// | [`InDoubt`](Self::InDoubt) | `InDoubt` | perhaps stored: the next start of the stream settles it (its sink reports it) |
/// | [`StoppedUnconfirmed`](Self::StoppedUnconfirmed) | `FailedAfter` | sent (a durable producer: stored), then the producer stopped |
/// | [`GaveUp`](Self::GaveUp), [`HandlingFailed`](Self::HandlingFailed) | `FailedAfter` | sent (a durable producer: stored), then given up |
///
/// `store` resolves `Ok` as soon as the message is stored, so it never fails `FailedAfter`:
/// an HTTP handler answers `503` (retry) for `CertainlyNot` and `500` for `InDoubt`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The producer had stopped, or stopped, before it stored (a durable producer) or sent the
    /// message: it certainly was not, and never will be. Retrying it is safe.
    #[error("the producer stopped before the message was stored or sent; it never will be")]
    ProducerStopped,
    /// The producer stopped (or restarted) after it started sending the message (a durable
    /// producer: after it stored it), before the consumer confirmed it. The consumer may or may
    /// not have handled it. A durable producer keeps it stored: the next start of its stream
    /// sends it again and reports its confirmation to its sink.
    #[error(
        "the producer stopped after sending the message (a durable producer: after storing \
         it), before its confirmation"
    )]
    StoppedUnconfirmed,
    /// The message was transmitted `max_attempts` times without an ACK and was given up. The
    /// consumer may or may not have handled it.
    #[error("no confirmation after {attempts} transmissions; the message was given up")]
    GaveUp {
        /// How many times the message was transmitted.
        attempts: u32,
    },
    /// Its consumers gave the message up after `attempts` failed attempts at handling it (a
    /// work-pulling pool's `give_up_after`):
    /// it is not sent again, by this producer or, for a durable one, after a restart. No
    /// handler confirmed it: each attempt ended with the handler failing, or without a
    /// confirmation within the worker stream's `max_attempts` (a handler that outran them, or
    /// whose ACK was lost, may still have done the work: workers that record the job's id say
    /// so). `last_error` describes the last attempt's failure.
    #[error("handling failed {attempts} times, the message was given up: {last_error}")]
    HandlingFailed {
        /// How many attempts failed.
        attempts: u32,
        /// The last attempt's failure.
        last_error: String,
    },
    /// The producer's pending queue was full (`max_pending`); the message was never sent.
    #[error("the producer's pending queue is full; the message was not sent")]
    QueueFull,
    /// `ProducerHandle::send_timeout` or
    /// `store_timeout` found no room in the producer
    /// (`window_size + max_pending` messages held) before its deadline. The message was never
    /// handed to the producer: it is certainly not sent and not stored, and never will be.
    #[error("no room in the producer before the deadline; the message was not sent")]
    Timeout,
    /// A durable producer could not store the message (the reason, naming the stream). A
    /// message settled with this error was not stored and is not sent: when the journal's
    /// failure left that open, the restarted producer read its journal first (a producer gone
    /// before it could says [`InDoubt`](Self::InDoubt) instead). The producer stops (a
    /// `Supervisor` restarts it on what its journal holds, unless its stream was taken over by
    /// a newer producer, is corrupt, or has a schema this code cannot read).
    #[error("the durable producer's journal failed: {0}")]
    Storage(String),
    /// A durable producer ended (stopped past its stop timeout, or gone after a journal
    /// failure without a `Supervisor`) before its journal answered whether it stored the
    /// message or recorded its confirmation (the reason says which). Nobody in this process
    /// learns more; the next start of the stream settles it by what the journal holds: a
    /// stored, unrecorded message is sent again and its confirmation goes to the sink.
    #[error("the outcome is in doubt: {0}")]
    InDoubt(String),
    /// A producer with `chunk_size` could not
    /// encode the message (the reason); it was not sent.
    #[error("the message cannot be encoded: {0}")]
    Unencodable(String),
    /// `ProducerHandle::store` on a producer that has no
    /// journal; the message was not sent.
    #[error("the producer is not durable: it stores nothing")]
    NotDurable,
}

impl DeliveryError {
    /// Which of three the error is (see the table above): whether the message certainly was
    /// not stored or sent, is in doubt, or was stored or sent and failed after that.
    pub fn happened(&self) -> Happened {
        match self {
            Self::ProducerStopped
            | Self::QueueFull
            | Self::Timeout
            | Self::Storage(_)
            | Self::Unencodable(_)
            | Self::NotDurable => Happened::CertainlyNot,
            Self::InDoubt(_) => Happened::InDoubt,
            Self::StoppedUnconfirmed | Self::GaveUp { .. } | Self::HandlingFailed { .. } => {
                Happened::FailedAfter
            }
        }
    }

    /// Whether the producer stopped before the message's outcome (a settlement that ends
    /// nothing: a durable producer's stored message stays stored, and is not recorded settled).
    pub fn is_stop(&self) -> bool {
        matches!(self, Self::ProducerStopped | Self::StoppedUnconfirmed)
    }
}

/// What a [`DeliveryError`] says of its message ([`DeliveryError::happened`]): what an
/// application that must answer its own caller needs, such as an HTTP handler choosing between
/// `503` (retry) and `500`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Happened {
    /// Certainly not: the message was not stored (by a durable producer) and not sent, and
    /// never will be. Retrying it is safe.
    CertainlyNot,
    /// Perhaps: a durable producer ended before its journal answered whether it stored the
    /// message (or recorded its confirmation). The next start of its stream settles it from
    /// the journal, as the error's reason says: a stored message is sent and its confirmation
    /// goes to the sink. A retry may store it twice.
    InDoubt,
    /// It happened, then failed: the message was sent (by a durable producer: stored) and
    /// not confirmed; the consumer may or may not have handled it. A retry stores or sends it
    /// again, as a new message.
    FailedAfter,
}

/// A message that `ProducerHandle::tell` could not accept; the
/// body is handed back. Either way it certainly was not stored or sent
/// ([`Happened::CertainlyNot`]).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum TellError<T> {
    /// The pending queue is full (`max_pending` messages wait for the window).
    #[error("the producer's pending queue is full")]
    QueueFull(T),
    /// The producer has stopped.
    #[error("the producer has stopped")]
    Stopped(T),
}

impl<T> TellError<T> {
    /// The body that was not sent.
    pub fn into_body(self) -> T {
        match self {
            Self::QueueFull(body) | Self::Stopped(body) => body,
        }
    }

    /// The same refusal of another body: `f` of this one (a wrapper's error in its own terms).
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> TellError<U> {
        match self {
            Self::QueueFull(body) => TellError::QueueFull(f(body)),
            Self::Stopped(body) => TellError::Stopped(f(body)),
        }
    }
}

impl<T> fmt::Debug for TellError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::QueueFull(_) => f.write_str("QueueFull(..)"),
            Self::Stopped(_) => f.write_str("Stopped(..)"),
        }
    }
}

/// An invalid option, reported when the options are built, never later.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid option `{field}`: {reason}")]
#[non_exhaustive]
pub struct OptionsError {
    /// The name of the offending option, as spelled in the builder and the settings struct.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl OptionsError {
    /// The option `field` is invalid: `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}
