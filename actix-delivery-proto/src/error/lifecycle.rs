//! What the handles of the parts that open a stream (durable producers, persistent entities,
//! projections) say about their start and their end: `opened()` resolves with whether the
//! part opened and why not, `stopped()` with why it stopped.

/// Why a part stopped for good, or could not open, without being asked to: what
/// `ProducerHandle::stopped` and
/// `PersistentHandle::stopped` answer, and
/// inside [`StartError::Failed`]. Its text is the whole reason, causes included (naming the
/// stream).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// A durable producer: another producer opened its stream after it, and owns the stream
    /// now (the newest opener owns a stream: see
    /// `DurableOptions::new`). Expected after this
    /// process was restarted elsewhere (a failover); otherwise a second instance of the
    /// application runs on the same stream.
    #[error("{0}")]
    TakenOver(String),
    /// A durable producer with a `lease`: another
    /// producer wrote the stream while this one watched it for the lease, so it is alive and
    /// this one did not open the stream.
    #[error("{0}")]
    InUse(String),
    /// Anything else that ended it or failed its opening: the stream belongs to another
    /// producer id, holds another application's type, is corrupt or of a newer schema; or,
    /// for a part without a `Supervisor`, its journal failed.
    #[error("{0}")]
    Error(String),
}

/// Why a part did not open: what the `opened()` of its handle answers.
/// `ProducerHandle::opened` and
/// `PersistentHandle::opened` fail with a
/// [`Failure`]; a projection's with its
/// `ProjectionError`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError<F = Failure> {
    /// It was stopped (on request, or as its handles were dropped) before it opened.
    #[error("it was stopped before it opened")]
    Stopped,
    /// Its opening failed for good, or it failed for good before it opened: why.
    #[error("{0}")]
    Failed(F),
}
