//! The "fires exactly once" confirmation attached to each message.

use std::num::NonZeroU64;
use std::panic::{catch_unwind, AssertUnwindSafe};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::error::DeliveryError;
use crate::protocol::trace_context::TraceContext;

type Callback = Box<dyn FnOnce(Result<(), DeliveryError>) + Send>;

enum Notify {
    Nobody,
    Callback(Callback),
    Channel(oneshot::Sender<Result<(), DeliveryError>>),
    /// A channel that is also told the message's id once a durable producer stored it.
    StoredChannel(
        Option<oneshot::Sender<MessageId>>,
        oneshot::Sender<Result<(), DeliveryError>>,
    ),
}

/// The stable id of a message of a durable producer: its seq in the producer's stream, never
/// reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MessageId(pub u64);

/// How the sender of a message learns its outcome. Fires exactly once: `Ok(())` when the
/// consumer's ACK reached the producer, an error when the producer stopped, gave the message up
/// or refused it. If it is dropped unsettled (say, with the mailbox of a stopped producer, which
/// never took it), it fires [`DeliveryError::ProducerStopped`] ([`StoppedUnconfirmed`] if a
/// durable producer had stored its message). A panicking callback is caught and logged; it
/// never takes the producer down.
///
/// [`StoppedUnconfirmed`]: DeliveryError::StoppedUnconfirmed
///
/// Any `FnOnce(Result<(), DeliveryError>) + Send + 'static` converts into a `Confirmation`.
pub struct Confirmation {
    notify: Notify,
    /// The message holds one permit of its producer's room (it came through a
    /// `ProducerHandle`); the producer gives it back when it settles the message.
    holds_room: bool,
    /// A durable producer stored the message under this id (ids start at 1).
    message: Option<NonZeroU64>,
    /// When its producer took the message (for the send→confirm histogram).
    #[cfg(feature = "metrics")]
    taken: Option<std::time::Instant>,
    /// The trace the message is sent in (carried with it to the handler).
    trace_context: Option<TraceContext>,
}

impl Confirmation {
    /// No notification: fire-and-forget (the message is still delivered reliably).
    pub fn none() -> Self {
        Self {
            notify: Notify::Nobody,
            holds_room: false,
            message: None,
            #[cfg(feature = "metrics")]
            taken: None,
            trace_context: None,
        }
    }

    /// Calls `callback` with the outcome.
    pub fn callback(callback: impl FnOnce(Result<(), DeliveryError>) + Send + 'static) -> Self {
        Self {
            notify: Notify::Callback(Box::new(callback)),
            holds_room: false,
            message: None,
            #[cfg(feature = "metrics")]
            taken: None,
            trace_context: None,
        }
    }

    /// A confirmation that completes the returned receiver.
    pub(crate) fn channel() -> (Self, oneshot::Receiver<Result<(), DeliveryError>>) {
        let (sender, receiver) = oneshot::channel();
        let confirmation = Self {
            notify: Notify::Channel(sender),
            holds_room: false,
            message: None,
            #[cfg(feature = "metrics")]
            taken: None,
            trace_context: None,
        };
        (confirmation, receiver)
    }

    /// A confirmation that also tells the returned receiver the message's id once a durable
    /// producer stored it.
    pub(crate) fn channel_with_stored() -> (
        Self,
        oneshot::Receiver<MessageId>,
        oneshot::Receiver<Result<(), DeliveryError>>,
    ) {
        let (sender, outcome) = oneshot::channel();
        let (stored, id) = oneshot::channel();
        let confirmation = Self {
            notify: Notify::StoredChannel(Some(stored), sender),
            holds_room: false,
            message: None,
            #[cfg(feature = "metrics")]
            taken: None,
            trace_context: None,
        };
        (confirmation, id, outcome)
    }

    /// The message was stored under `id`.
    pub(crate) fn notify_stored(&mut self, id: MessageId) {
        self.message = NonZeroU64::new(id.0);
        if let Notify::StoredChannel(stored, _) = &mut self.notify
            && let Some(stored) = stored.take()
        {
            let _ = stored.send(id); // the caller may have stopped waiting
        }
    }

    /// The id a durable producer stored the message under.
    pub(crate) fn message(&self) -> Option<MessageId> {
        self.message.map(|id| MessageId(id.get()))
    }

    /// The same confirmation for a message sent in the trace `context`, which its deliveries
    /// carry to the handler ([`DeliveryInfo::trace_context`](crate::DeliveryInfo)): for
    /// messages told to a [`ProducerController`](crate::ProducerController) directly; a
    /// [`ProducerHandle`](crate::ProducerHandle) sets it from its producer's
    /// [`trace_context`](crate::ProducerOptionsBuilder::trace_context) hook.
    pub fn with_trace_context(mut self, context: TraceContext) -> Self {
        self.trace_context = Some(context);
        self
    }

    /// The trace the message is sent in.
    pub(crate) fn trace_context(&self) -> Option<TraceContext> {
        self.trace_context.clone()
    }

    /// Marks the confirmation as holding one permit of its producer's room.
    pub(crate) fn holding_room(mut self) -> Self {
        self.holds_room = true;
        self
    }

    /// Delivers the outcome.
    #[inline]
    pub fn settle(mut self, result: Result<(), DeliveryError>) {
        // Fire-and-forget (`Confirmation::none()`, the common case of a burst of `tell`s): no
        // one to notify, so nothing to take, match or drop. `Nobody` owns nothing and the
        // other fields but the trace context are `Copy`, so skipping `Drop` leaks nothing
        // unless the message carries a context (a shared allocation: it must be dropped).
        if matches!(self.notify, Notify::Nobody) && self.trace_context.is_none() {
            std::mem::forget(self);
            return;
        }
        self.fire(result);
    }

    /// Notes when the producer took the message (the first time only).
    #[cfg(feature = "metrics")]
    pub(crate) fn taken_at(&mut self, now: std::time::Instant) {
        self.taken.get_or_insert(now);
    }

    /// When the producer took the message, if it noted it.
    #[cfg(feature = "metrics")]
    pub(crate) fn taken(&self) -> Option<std::time::Instant> {
        self.taken
    }

    /// Whether the message holds a permit of room, which the producer gives back (in bulk:
    /// one semaphore operation per flush, not one per message) before settling it.
    pub(crate) fn holds_room(&self) -> bool {
        self.holds_room
    }

    #[inline(never)]
    fn fire(&mut self, result: Result<(), DeliveryError>) {
        match std::mem::replace(&mut self.notify, Notify::Nobody) {
            Notify::Nobody => {}
            Notify::Callback(callback) => {
                if catch_unwind(AssertUnwindSafe(|| callback(result))).is_err() {
                    log::error!("a confirmation callback panicked; the producer carries on");
                }
            }
            Notify::Channel(sender) | Notify::StoredChannel(_, sender) => {
                // The receiver may have been dropped (the caller stopped waiting): fine.
                let _ = sender.send(result);
            }
        }
    }
}

impl Drop for Confirmation {
    #[inline]
    fn drop(&mut self) {
        // Settled, or `Confirmation::none()`: nothing to fire (see `settle`).
        if !matches!(self.notify, Notify::Nobody) {
            let stopped = match self.message {
                Some(_) => DeliveryError::StoppedUnconfirmed, // stored: it stays stored
                None => DeliveryError::ProducerStopped,
            };
            self.fire(Err(stopped));
        }
    }
}

impl<F: FnOnce(Result<(), DeliveryError>) + Send + 'static> From<F> for Confirmation {
    fn from(callback: F) -> Self {
        Self::callback(callback)
    }
}

impl std::fmt::Debug for Confirmation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.notify {
            Notify::Nobody => "none",
            Notify::Callback(_) => "callback",
            Notify::Channel(_) | Notify::StoredChannel(..) => "channel",
        };
        f.debug_tuple("Confirmation").field(&kind).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Seen = Arc<Mutex<Vec<Result<(), DeliveryError>>>>;

    fn recorder() -> (Confirmation, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let confirmation = Confirmation::from(move |r| sink.lock().unwrap().push(r));
        (confirmation, seen)
    }

    #[test]
    fn settle_fires_once_and_drop_does_not_fire_again() {
        let (confirmation, seen) = recorder();
        confirmation.settle(Ok(()));
        assert_eq!(*seen.lock().unwrap(), [Ok(())]);
    }

    #[test]
    fn dropped_unsettled_fires_producer_stopped() {
        let (confirmation, seen) = recorder();
        drop(confirmation);
        assert_eq!(*seen.lock().unwrap(), [Err(DeliveryError::ProducerStopped)]);
    }

    #[test]
    fn panicking_callback_is_contained() {
        let confirmation = Confirmation::from(|_| panic!("callback bug"));
        confirmation.settle(Ok(()));
    }

    #[test]
    fn a_confirmation_knows_whether_it_holds_room() {
        assert!(Confirmation::none().holding_room().holds_room());
        assert!(!Confirmation::none().holds_room());
    }

    #[test]
    fn a_settled_fire_and_forget_confirmation_releases_its_trace_context() {
        let context = TraceContext::new([1; 16], [2; 8], TraceContext::SAMPLED).unwrap();
        Confirmation::none()
            .with_trace_context(context.clone())
            .settle(Ok(()));
        assert_eq!(context.holders(), 1, "the confirmation's copy was dropped");
        Confirmation::from(|_| ())
            .with_trace_context(context.clone())
            .settle(Ok(()));
        drop(Confirmation::none().with_trace_context(context.clone()));
        assert_eq!(context.holders(), 1);
    }

    #[test]
    fn channel_receives_the_outcome() {
        let (confirmation, mut receiver) = Confirmation::channel();
        confirmation.settle(Err(DeliveryError::QueueFull));
        assert_eq!(receiver.try_recv(), Ok(Err(DeliveryError::QueueFull)));
    }
}
