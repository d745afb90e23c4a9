//! Why a command got no reply of its own.

use std::fmt::Display;

use crate::codec::CodecError;
use crate::journal::error::JournalError;

/// Why a command sent to a `PersistentActor` did not
/// get its reply. `R` is the entity's rejection type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError<R: Display> {
    /// The entity refused the command (its decision); nothing was stored.
    #[error("rejected: {0}")]
    Rejected(R),
    /// Storing this command's events, or those of a command before it, failed: they were not
    /// reported stored (with a storage error they may still be on disk; the actor stopped,
    /// and a restart recovers whatever the journal holds).
    #[error("the journal failed: {0}")]
    Journal(JournalError),
    /// The actor could not recover its state from the journal; it stopped.
    #[error("recovery failed: {0}")]
    Recovery(JournalError),
    /// The command's delivery is stale: its producer had declared it settled before the
    /// entity processed it, so it is neither processed nor confirmed.
    #[error("the delivery is stale: its producer declared it settled, it was not processed")]
    Stale,
    /// With must-follow: the command's delivery came before its predecessor was processed
    /// (`expected` is the seq that must come first); it is refused and retransmitted.
    #[error("the delivery does not follow its predecessor: seq {expected} must come first")]
    OutOfOrder {
        /// The seq the entity waits for.
        expected: u64,
    },
    /// The decision delivers to a destination the actor has no outbox lane for; nothing was
    /// stored.
    #[error("no outbox destination named `{0}`")]
    UnknownDestination(String),
    /// The decision would leave more than `max_unconfirmed` deliveries to `destination`
    /// unconfirmed; nothing was stored (retry once deliveries are confirmed).
    #[error(
        "the outbox to `{destination}` has {unconfirmed} unconfirmed deliveries, the most allowed"
    )]
    OutboxFull {
        /// The destination.
        destination: String,
        /// Its unconfirmed deliveries.
        unconfirmed: usize,
    },
    /// The events could not be encoded (too large, or their `Serialize` failed); nothing was
    /// stored or applied.
    #[error("the events cannot be encoded: {0}")]
    Encoding(CodecError),
    /// Too many commands wait, so this one was refused before it was decided (nothing was
    /// stored; retry later): during recovery more than
    /// `PersistentConfig::max_recovery_buffer`, or,
    /// behind an append in flight, more than `max_pending_commands` decided commands (or
    /// `max_pending_bytes` of their entries) waiting for their commit.
    #[error("the persistent actor is overloaded: {buffered} commands wait already")]
    Overloaded {
        /// Commands waiting (for the recovery, or for their commit).
        buffered: usize,
    },
    /// The actor stopped (or was stopped) before the command was decided, or before its
    /// events were handed to the journal: nothing of it is stored.
    #[error("the persistent actor has stopped")]
    Stopped,
    /// The actor stopped (its stop timeout passed) while the journal had not answered the
    /// append holding the command's events: they may or may not be stored. The next recovery
    /// of the entity holds the truth (a command from a delivery is then recognised as
    /// processed, or processed again when retransmitted).
    #[error("the persistent actor stopped before the journal answered: the command's events may or may not be stored")]
    InDoubt,
}
