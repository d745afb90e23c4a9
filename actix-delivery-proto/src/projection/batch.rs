//! The entries a projection hands to its handler: taken whole from the queue, handed out as
//! one batch, or (after the batch kept failing) one entry at a time. Pure.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::SystemTime;

use crate::journal::by_tag::Offset;

use crate::journal::id::PersistenceId;
use crate::projection::envelope::{Envelope, Item};

/// A run of whole entries for the handler: `events[range]`, up to offset `to`.
#[derive(Debug)]
pub struct Batch<Ev> {
    events: Arc<[Envelope<Ev>]>,
    /// Which of the fetched entries it holds.
    pub range: Range<usize>,
    /// The last entry's offset.
    pub to: Offset,
    /// The newest commit time of its entries.
    pub newest: SystemTime,
}

impl<Ev> Clone for Batch<Ev> {
    fn clone(&self) -> Self {
        Self {
            events: self.events.clone(),
            range: self.range.clone(),
            to: self.to,
            newest: self.newest,
        }
    }
}

impl<Ev> Batch<Ev> {
    /// The events, in offset order.
    pub fn events(&self) -> &[Envelope<Ev>] {
        &self.events[self.range.clone()]
    }
}

/// An entry of a batch in flight: its place and its events.
#[derive(Debug)]
pub(crate) struct Entry {
    pub offset: Offset,
    pub persistence_id: PersistenceId,
    pub seq: u64,
    pub written_at: SystemTime,
    range: Range<usize>,
}

/// Entries taken from the queue for the handler, handed out as one batch, or (after the
/// batch kept failing) one entry at a time.
pub(crate) struct InFlight<Ev> {
    events: Arc<[Envelope<Ev>]>,
    pub entries: Vec<Entry>,
    /// The first entry not yet got past.
    pub next: usize,
    /// Handing out one entry at a time.
    pub isolating: bool,
}

impl<Ev> InFlight<Ev> {
    /// Takes whole entries from the front of `queue`, up to `batch_size` events (at least one
    /// entry) and not past an entry that cannot be read.
    pub fn take(queue: &mut VecDeque<Item<Ev>>, batch_size: usize) -> Self {
        let mut events = Vec::new();
        let mut entries = Vec::new();
        while let Some(front) = queue.front() {
            let fits = entries.is_empty() || events.len() + front.len() <= batch_size;
            if front.events.is_err() || !fits {
                break;
            }
            let Some(item) = queue.pop_front() else {
                break;
            };
            let start = events.len();
            events.extend(item.events.unwrap_or_default());
            entries.push(Entry {
                offset: item.offset,
                persistence_id: item.persistence_id,
                seq: item.seq,
                written_at: item.written_at,
                range: start..events.len(),
            });
        }
        Self {
            events: Arc::from(events),
            entries,
            next: 0,
            isolating: false,
        }
    }

    /// The entries the next batch holds.
    pub fn current(&self) -> Range<usize> {
        let end = if self.isolating {
            self.next + 1
        } else {
            self.entries.len()
        };
        self.next..end
    }

    /// The next batch: the current entries' events.
    pub fn batch(&self) -> Batch<Ev> {
        let entries = &self.entries[self.current()];
        let (first, last) = (&entries[0], &entries[entries.len() - 1]);
        Batch {
            events: self.events.clone(),
            range: first.range.start..last.range.end,
            to: last.offset,
            newest: entries
                .iter()
                .map(|e| e.written_at)
                .max()
                .unwrap_or(last.written_at),
        }
    }
}
