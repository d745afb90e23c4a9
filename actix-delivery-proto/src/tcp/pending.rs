//! Incoming connections still in their handshake: a budget of their own, apart from the
//! authenticated connections (`max_connections`), so that connections that never
//! authenticate cannot keep an honest peer out. At most `max` at once; a new one beyond
//! evicts the oldest, which is closed. A flood of `r` connections a second then gives each
//! handshake about `max / r` seconds, and an honest peer, whose handshake takes a few round
//! trips, gets through. Pure: no I/O, no runtime.

use hashlink::LinkedHashMap;

/// The handshakes in progress, oldest first, each with what stops it (`T`).
#[derive(Debug)]
pub struct Pending<T> {
    max: usize,
    next: u64,
    table: LinkedHashMap<u64, T>,
}

/// Names one admitted handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

impl<T> Pending<T> {
    /// At most `max` (positive) handshakes at once.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            next: 0,
            table: LinkedHashMap::new(),
        }
    }

    /// Admits a new handshake, stopped by `stop`; returns its ticket and, if the budget was
    /// full, the oldest handshake's `stop`, which is no longer pending (the caller stops it).
    pub fn admit(&mut self, stop: T) -> (Ticket, Option<T>) {
        let evicted = if self.table.len() >= self.max {
            self.table.pop_front().map(|(_, stop)| stop)
        } else {
            None
        };
        let ticket = Ticket(self.next);
        self.next += 1;
        self.table.insert(ticket.0, stop);
        (ticket, evicted)
    }

    /// The handshake of `ticket` ended, however it ended (a no-op for one evicted).
    pub fn finish(&mut self, ticket: Ticket) {
        self.table.remove(&ticket.0);
    }

    /// Handshakes in progress.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_budget_evicts_the_oldest_handshake() {
        let mut pending = Pending::new(2);
        let (first, none) = pending.admit("first");
        assert_eq!(none, None);
        let (_, none) = pending.admit("second");
        assert_eq!(none, None);
        let (third, evicted) = pending.admit("third");
        assert_eq!(evicted, Some("first"));
        assert_eq!(pending.len(), 2);
        // The evicted one's end changes nothing; a finished one makes room.
        pending.finish(first);
        assert_eq!(pending.len(), 2);
        pending.finish(third);
        assert_eq!(pending.admit("fourth").1, None);
        assert_eq!(pending.admit("fifth").1, Some("second"));
    }

    #[test]
    fn finished_handshakes_leave_the_budget_in_any_order() {
        let mut pending = Pending::new(3);
        let tickets: Vec<Ticket> = (0..3).map(|i| pending.admit(i).0).collect();
        pending.finish(tickets[1]);
        pending.finish(tickets[0]);
        assert_eq!(pending.len(), 1);
        assert_eq!(pending.admit(3).1, None);
        assert_eq!(pending.admit(4).1, None);
        assert_eq!(pending.admit(5).1, Some(2), "the oldest still pending");
    }
}
