//! The event queue: events ordered by simulated time, ties broken by insertion order, so
//! that a run is a pure function of its seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

/// An event due at `at` (time since the start of the run); `order` is its insertion number.
#[derive(Debug)]
struct Scheduled<E> {
    at: Duration,
    order: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl<E> Eq for Scheduled<E> {}

impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Scheduled<E> {
    /// Reversed, so that the max-heap pops the earliest event (and of equal times, the one
    /// scheduled first).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// A deterministic priority queue of future events.
#[derive(Debug)]
pub struct EventQueue<E> {
    heap: BinaryHeap<Scheduled<E>>,
    inserted: u64,
}

impl<E> EventQueue<E> {
    /// An empty queue.
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            inserted: 0,
        }
    }

    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Duration, event: E) {
        self.heap.push(Scheduled {
            at,
            order: self.inserted,
            event,
        });
        self.inserted += 1;
    }

    /// When the earliest event is due.
    pub fn next_at(&self) -> Option<Duration> {
        self.heap.peek().map(|s| s.at)
    }

    /// Removes and returns the earliest event with its time.
    pub fn pop(&mut self) -> Option<(Duration, E)> {
        self.heap.pop().map(|s| (s.at, s.event))
    }
}
