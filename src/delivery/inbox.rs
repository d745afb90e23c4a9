//! How handles reach a producer: a shared queue, woken with one actor message per burst rather
//! than one per message, plus the producer's room (`window_size + max_pending` permits).
//!
//! A message takes one permit when it enters the inbox and gives it back (in bulk, per flush)
//! when the producer settles it; so `tell` can refuse synchronously and `send` can wait.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Semaphore, TryAcquireError};

use crate::delivery::confirmation::Confirmation;

/// Why the inbox did not take a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No room: `window_size + max_pending` messages are held already.
    Full,
    /// The producer has stopped.
    Closed,
}

/// Messages handed over by `ProducerHandle`s, waiting for the producer to take them.
pub(crate) struct Inbox<T> {
    state: Mutex<State<T>>,
    room: Semaphore,
    /// Hand-overs that waited for room past their deadline.
    timed_out: AtomicU64,
}

struct State<T> {
    queue: VecDeque<(T, Confirmation)>,
    /// A wake-up message is on its way to the producer: no need to send another.
    wake_sent: bool,
    /// The producer stopped: nothing more is accepted.
    closed: bool,
}

impl<T> Inbox<T> {
    pub(crate) fn new(room: usize) -> Self {
        Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                wake_sent: false,
                closed: false,
            }),
            room: Semaphore::new(room.min(Semaphore::MAX_PERMITS)),
            timed_out: AtomicU64::new(0),
        }
    }

    /// Counts a hand-over that got no room before its deadline.
    pub(crate) fn count_timeout(&self) {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Hand-overs that got no room before their deadline, so far.
    pub(crate) fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }

    /// Takes one permit of room without waiting.
    pub(crate) fn try_reserve(&self) -> Result<(), Refusal> {
        match self.room.try_acquire() {
            Ok(permit) => {
                permit.forget();
                Ok(())
            }
            Err(TryAcquireError::NoPermits) => Err(Refusal::Full),
            Err(TryAcquireError::Closed) => Err(Refusal::Closed),
        }
    }

    /// Takes one permit of room, waiting for it.
    pub(crate) async fn reserve(&self) -> Result<(), Refusal> {
        let permit = self.room.acquire().await.map_err(|_| Refusal::Closed)?;
        permit.forget();
        Ok(())
    }

    /// Takes up to `permits` of room without waiting (for messages that are held already):
    /// how many it took.
    pub(crate) fn take_room(&self, permits: usize) -> usize {
        self.room.forget_permits(permits)
    }

    /// Queues a message for which room was reserved. `Ok(true)` means the producer must be
    /// woken; a closed inbox hands the message back (and its room).
    pub(crate) fn push(&self, body: T, confirm: Confirmation) -> Result<bool, (T, Confirmation)> {
        let mut state = self.lock();
        if state.closed {
            drop(state);
            self.release(1);
            return Err((body, confirm));
        }
        state.queue.push_back((body, confirm.holding_room()));
        Ok(!std::mem::replace(&mut state.wake_sent, true))
    }

    /// Moves every queued message into `into` (the producer was woken).
    pub(crate) fn take(&self, into: &mut VecDeque<(T, Confirmation)>) {
        let mut state = self.lock();
        state.wake_sent = false;
        std::mem::swap(&mut state.queue, into);
    }

    /// Whether no message waits to be taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().queue.is_empty()
    }

    /// Stops accepting messages and returns those still queued.
    pub(crate) fn close(&self) -> VecDeque<(T, Confirmation)> {
        let mut state = self.lock();
        state.closed = true;
        state.wake_sent = false;
        std::mem::take(&mut state.queue)
    }

    /// Accepts messages again (the producer restarted).
    pub(crate) fn reopen(&self) {
        self.lock().closed = false;
    }

    /// Closes for good: waiting and future senders are refused (the producer is gone).
    pub(crate) fn shut(&self) {
        self.close();
        self.room.close();
    }

    /// Gives back room of `permits` settled messages.
    pub(crate) fn release(&self, permits: usize) {
        if permits > 0 {
            self.room.add_permits(permits);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The state stays consistent whatever panicked while holding the lock (every critical
        // section is a few field updates), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_bounds_what_is_held_and_comes_back_when_released() {
        let inbox = Inbox::<u32>::new(2);
        assert_eq!(inbox.try_reserve(), Ok(()));
        assert_eq!(inbox.try_reserve(), Ok(()));
        assert_eq!(inbox.try_reserve(), Err(Refusal::Full));
        inbox.release(1);
        assert_eq!(inbox.try_reserve(), Ok(()));
        inbox.release(2);
        assert_eq!(inbox.take_room(3), 2, "as much as there is");
        assert_eq!(inbox.try_reserve(), Err(Refusal::Full));
    }

    #[test]
    fn only_the_first_push_of_a_burst_asks_for_a_wake_up() {
        let inbox = Inbox::new(8);
        for (body, wake) in [(1, true), (2, false), (3, false)] {
            inbox.try_reserve().unwrap();
            assert_eq!(inbox.push(body, Confirmation::none()).ok(), Some(wake));
        }
        let mut taken = VecDeque::new();
        inbox.take(&mut taken);
        assert_eq!(taken.iter().map(|(b, _)| *b).collect::<Vec<_>>(), [1, 2, 3]);
        inbox.try_reserve().unwrap();
        assert_eq!(inbox.push(4, Confirmation::none()).ok(), Some(true));
    }

    #[test]
    fn a_closed_inbox_hands_messages_back_with_their_room_and_reopens() {
        let inbox = Inbox::new(1);
        inbox.try_reserve().unwrap();
        inbox.push(1, Confirmation::none()).unwrap();
        assert_eq!(inbox.close().len(), 1);
        inbox.release(1);
        inbox.try_reserve().unwrap();
        assert!(inbox.push(2, Confirmation::none()).is_err());
        assert_eq!(
            inbox.try_reserve(),
            Ok(()),
            "the refused message's room came back"
        );
        inbox.release(1);
        inbox.reopen();
        inbox.try_reserve().unwrap();
        assert!(inbox.push(3, Confirmation::none()).is_ok());
    }

    #[test]
    fn shut_refuses_waiting_and_future_senders() {
        let inbox = Inbox::<u32>::new(1);
        inbox.shut();
        assert_eq!(inbox.try_reserve(), Err(Refusal::Closed));
    }
}
