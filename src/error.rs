//! Error types: one enum per layer; what the handles say of a part's start and end
//! ([`Failure`], [`StartError`]); and (crate-internal) how the crate writes the errors of the
//! libraries it uses, with their whole cause chain, into its own.

use std::fmt;

mod chain;
mod lifecycle;

pub(crate) use chain::ErrorChain;
pub use lifecycle::{Failure, StartError};

/// Why a message was not confirmed. Passed to confirmation callbacks and returned by
/// [`ProducerHandle::send`](crate::ProducerHandle::send).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryError {
    /// The producer stopped (or restarted) before the consumer acknowledged the message. The
    /// consumer may or may not have handled it.
    #[error("the producer stopped before the message was confirmed")]
    ProducerStopped,
    /// The message was transmitted `max_attempts` times without an ACK and was given up. The
    /// consumer may or may not have handled it.
    #[error("no confirmation after {attempts} transmissions; the message was given up")]
    GaveUp {
        /// How many times the message was transmitted.
        attempts: u32,
    },
    /// Its consumers gave the message up after `attempts` failed attempts at handling it (a
    /// work-pulling pool's [`give_up_after`](crate::work_pulling::WorkPullingOptionsBuilder::give_up_after)):
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
    /// [`ProducerHandle::send_timeout`](crate::ProducerHandle::send_timeout) or
    /// [`store_timeout`](crate::ProducerHandle::store_timeout) found no room in the producer
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
    /// A producer with [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size) could not
    /// encode the message (the reason); it was not sent.
    #[error("the message cannot be encoded: {0}")]
    Unencodable(String),
    /// [`ProducerHandle::store`](crate::ProducerHandle::store) on a producer that has no
    /// journal; the message was not sent.
    #[error("the producer is not durable: it stores nothing")]
    NotDurable,
}

/// A message that [`ProducerHandle::tell`](crate::ProducerHandle::tell) could not accept; the
/// body is handed back.
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
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}
