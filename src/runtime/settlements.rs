//! Where the confirmations of many streams collect for the actor that owns them, so that a
//! stream's flush of many confirmations costs the actor one message, not one each (the
//! work-pulling pool's worker streams, the sharded producer's entity streams).

use std::sync::{Mutex, PoisonError};

use actix::Message;

/// Settlements waiting for their actor.
pub(crate) struct Settlements<S>(Mutex<Vec<S>>);

impl<S> Default for Settlements<S> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

impl<S> Settlements<S> {
    /// Adds one; `true` if the actor must be woken ([`TakeSettlements`]): the queue was empty.
    pub(crate) fn push(&self, settled: S) -> bool {
        let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        queue.push(settled);
        queue.len() == 1
    }

    /// Swaps what waits into `into` (an empty buffer, reused).
    pub(crate) fn take(&self, into: &mut Vec<S>) {
        let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *queue, into);
    }
}

/// Wakes an actor: settlements wait in its [`Settlements`].
pub(crate) struct TakeSettlements;

impl Message for TakeSettlements {
    type Result = ();
}
