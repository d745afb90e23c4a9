//! The pure core of a projection: what to do next, and what each outcome changes. No I/O and
//! no clock of its own: the shell carries out each [`Step`], reports how it went, and passes
//! the time in.
//!
//! The rules:
//!
//! - Start by loading the stored offset; read the entries after it a page at a time; read
//!   again at once after a full page, after `poll_interval` after a short one, and after a
//!   doubling wait (up to `max_poll_interval`) after each read that found nothing; at once
//!   when the journal says tagged entries were committed.
//! - Hand the entries to the handler in batches of at most `batch_size` events, whole entries
//!   only, in offset order; one batch at a time.
//! - A batch whose handler failed is retried after a doubling wait, `max_retries` times; then
//!   each of its entries alone, each as often; an entry still failing alone, or one that
//!   cannot be read at all (deleted, undecodable: no retry helps), goes to the
//!   [`PoisonPolicy`]: stop there, or skip it (counted) and store its offset.
//! - Exactly once: the offset is stored with each batch, in its transaction; a skipped entry's
//!   offset on its own. At least once: after `commit_every` handled events, or
//!   `commit_interval` after the first one not yet stored, and when stopped.
//! - A failure of the store (of the transaction itself, or of storing the offset) may leave
//!   the stored offset anywhere between where it was and where the batch went: drop what
//!   was read, wait, and load the offset again. A failure of the journal: wait, read again.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use crate::journal::by_tag::Offset;

use crate::journal::id::PersistenceId;
pub use crate::projection::batch::Batch;
use crate::projection::batch::InFlight;
use crate::projection::envelope::Item;
use crate::projection::error::ProjectionError;
use crate::projection::options::{PoisonPolicy, ProjectionOptions};
use crate::runtime::backoff::Reconnect;

/// What a projection has done since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProjectionStats {
    /// Events handled (with exactly once: committed with their offset).
    pub events: u64,
    /// Entries got past: handled, or skipped.
    pub entries: u64,
    /// Handler calls that succeeded.
    pub batches: u64,
    /// Handler calls that failed and were tried again (a batch, or an entry alone).
    pub retries: u64,
    /// Entries skipped by [`PoisonPolicy::Skip`]: failing, deleted or undecodable.
    pub skipped: u64,
    /// Offsets stored on their own (at least once; a skip with exactly once).
    pub offsets_saved: u64,
    /// Reads of the journal that failed (and were tried again).
    pub read_failures: u64,
    /// Failures of the read model or offset store (the offset was loaded again).
    pub store_failures: u64,
    /// Batches (or skips) rolled back because the stored offset was no longer the one they
    /// built on: another instance of this projection, with the same name and slices, had
    /// stored its own (the offset was loaded again; nothing was handled twice).
    pub conflicts: u64,
    /// For the last batch: from its newest entry's commit to the handler's success, in ms
    /// (clocks of the journal and this process).
    pub lag_ms: u64,
    /// The stored offset: where a restart would go on from.
    pub offset: Offset,
}

/// What the shell does next.
#[derive(Debug)]
pub enum Step<Ev> {
    /// Load the stored offset: [`Core::handle_loaded`] or [`Core::handle_store_failed`].
    Load,
    /// Read at most `max` entries after `after`: [`Core::handle_fetched`] or
    /// [`Core::handle_fetch_failed`].
    Fetch {
        /// Read after this offset.
        after: Offset,
        /// At most this many entries.
        max: usize,
    },
    /// Run the handler (exactly once: and store the batch's offset in its transaction):
    /// [`Core::handle_processed`], [`Core::handle_handler_failed`] or
    /// [`Core::handle_store_failed`].
    Handle(Batch<Ev>),
    /// Store this offset on its own: [`Core::handle_saved`] or [`Core::handle_store_failed`].
    Save(Offset),
    /// Nothing to do before this time (or a notification).
    Wait(Instant),
    /// Stopped by the poison policy.
    Failed(ProjectionError),
}

enum Phase {
    Loading,
    Running,
    Failed(ProjectionError),
}

/// An entry the poison policy skipped: where it is, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its offset in the tag.
    pub offset: Offset,
    /// Its stream.
    pub persistence_id: PersistenceId,
    /// Its seq in the stream.
    pub seq: u64,
    /// Why it could not be got past (the handler's last error, or why it could not be read).
    pub reason: String,
    /// How many times it was tried (1 + retries; 0 for one that could not be read).
    pub attempts: u32,
}

/// The projection's state machine; see the module documentation for its rules.
pub struct Core<Ev> {
    options: ProjectionOptions,
    offset_in_transaction: bool,
    phase: Phase,
    /// Handled up to here (at least once: perhaps not stored yet).
    handled: Offset,
    /// Read up to here.
    fetched: Offset,
    queue: VecDeque<Item<Ev>>,
    in_flight: Option<InFlight<Ev>>,
    attempts: u32,
    retry: Reconnect,
    retry_at: Option<Instant>,
    poll: Reconnect,
    poll_at: Option<Instant>,
    /// An offset to store on its own.
    to_save: Option<Offset>,
    /// At least once: events handled since the offset was last stored, and since when
    /// something (events or a skip) waits to be stored.
    unsaved_events: usize,
    unsaved_since: Option<Instant>,
    /// Entries skipped by the poison policy since [`Core::take_skipped`] was last called.
    skipped: Vec<Skipped>,
    stats: ProjectionStats,
}

impl<Ev> Core<Ev> {
    /// A core about to load its offset; `offset_in_transaction` for exactly once; `seed` for
    /// the jitter of its waits.
    pub fn new(options: ProjectionOptions, offset_in_transaction: bool, seed: u64) -> Self {
        let (retry_first, retry_max) = options.retry_backoff;
        let (poll_first, poll_max) = (options.poll_interval, options.max_poll_interval);
        Self {
            offset_in_transaction,
            phase: Phase::Loading,
            handled: Offset::START,
            fetched: Offset::START,
            queue: VecDeque::new(),
            in_flight: None,
            attempts: 0,
            retry: Reconnect::new(retry_first, retry_max, seed),
            retry_at: None,
            poll: Reconnect::new(poll_first, poll_max, seed.rotate_left(17)),
            poll_at: None,
            to_save: None,
            unsaved_events: 0,
            unsaved_since: None,
            skipped: Vec::new(),
            stats: ProjectionStats::default(),
            options,
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> ProjectionStats {
        self.stats
    }

    /// What to do at `now`.
    pub fn next_step(&mut self, now: Instant) -> Step<Ev> {
        match &self.phase {
            Phase::Failed(error) => return Step::Failed(error.clone()),
            Phase::Loading => {
                return match self.retry_at {
                    Some(at) if at > now => Step::Wait(at),
                    _ => Step::Load,
                }
            }
            Phase::Running => {}
        }
        if self.to_save.is_none() && self.is_commit_due(now) {
            self.to_save = Some(self.handled);
        }
        if let Some(offset) = self.to_save {
            return Step::Save(offset);
        }
        if let Some(in_flight) = &self.in_flight {
            return match self.retry_at {
                Some(at) if at > now => Step::Wait(self.earliest(at)),
                _ => Step::Handle(in_flight.batch()),
            };
        }
        while let Some(front) = self.queue.front() {
            if front.events.is_ok() {
                let in_flight = InFlight::take(&mut self.queue, self.options.batch_size);
                let batch = in_flight.batch();
                self.in_flight = Some(in_flight);
                return Step::Handle(batch);
            }
            let Some(item) = self.queue.pop_front() else {
                break;
            };
            let reason = item.events.err().unwrap_or_default();
            let entry = (item.offset, item.persistence_id, item.seq);
            if let Some(failed) = self.poison(entry, reason, 0, now) {
                return failed;
            }
            if let Some(offset) = self.to_save {
                return Step::Save(offset);
            }
        }
        match self.poll_at {
            Some(at) if at > now => Step::Wait(self.earliest(at)),
            _ => Step::Fetch {
                after: self.fetched,
                max: self.options.fetch_size,
            },
        }
    }

    /// The stored offset is `offset`: start reading after it.
    pub fn handle_loaded(&mut self, offset: Offset) {
        self.phase = Phase::Running;
        self.stats.offset = offset;
        self.handled = offset;
        self.fetched = offset;
        self.retry_at = None;
        self.retry.reset();
        self.poll_at = None;
        self.poll.reset();
    }

    /// A read returned `items` (their offsets ascending after the last read); `full` if it
    /// returned as many as asked for.
    pub fn handle_fetched(&mut self, items: Vec<Item<Ev>>, full: bool, now: Instant) {
        let Some(last) = items.last() else {
            self.poll_at = Some(now + self.poll.next_wait());
            return;
        };
        self.fetched = last.offset;
        self.queue.extend(items);
        self.poll.reset();
        self.poll_at = (!full).then(|| now + self.options.poll_interval);
    }

    /// A read of the journal failed: read again after a wait.
    pub fn handle_fetch_failed(&mut self, now: Instant) {
        self.stats.read_failures += 1;
        self.poll_at = Some(now + self.retry.next_wait());
    }

    /// The journal says tagged entries were committed: read at once if idle.
    pub fn handle_notified(&mut self) {
        if self.queue.is_empty() && self.in_flight.is_none() {
            self.poll_at = None;
            self.poll.reset();
        }
    }

    /// The batch handed out last was handled (exactly once: and its offset stored), at `now`
    /// (`wall` on this process's clock).
    pub fn handle_processed(&mut self, now: Instant, wall: SystemTime) {
        let Some(in_flight) = &mut self.in_flight else {
            debug_assert!(false, "a batch was processed with none in flight");
            return;
        };
        let batch = in_flight.batch();
        let entries = in_flight.current().len();
        in_flight.next += entries;
        if in_flight.next == in_flight.entries.len() {
            self.in_flight = None;
        }
        self.attempts = 0;
        self.retry_at = None;
        self.retry.reset();
        self.handled = batch.to;
        let events = batch.range.len();
        self.stats.events += events as u64;
        self.stats.entries += entries as u64;
        self.stats.batches += 1;
        let lag = wall.duration_since(batch.newest).unwrap_or(Duration::ZERO);
        self.stats.lag_ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        if self.offset_in_transaction {
            self.stats.offset = batch.to;
        } else {
            self.unsaved_events += events;
            self.unsaved_since.get_or_insert(now);
        }
    }

    /// The handler failed on the batch handed out last (`why`): retry it, or its entries one
    /// by one, or apply the poison policy.
    pub fn handle_handler_failed(&mut self, why: &str, now: Instant) {
        let Some(in_flight) = &mut self.in_flight else {
            debug_assert!(false, "a handler failed with no batch in flight");
            return;
        };
        self.attempts += 1;
        if self.attempts <= self.options.max_retries {
            self.stats.retries += 1;
            self.retry_at = Some(now + self.retry.next_wait());
            return;
        }
        self.attempts = 0;
        if in_flight.current().len() > 1 {
            // Find the entry at fault: each alone, with retries of its own, from now.
            in_flight.isolating = true;
            self.stats.retries += 1;
            self.retry_at = None;
            return;
        }
        let entry = &in_flight.entries[in_flight.next];
        let entry = (entry.offset, entry.persistence_id.clone(), entry.seq);
        in_flight.next += 1;
        if in_flight.next == in_flight.entries.len() {
            self.in_flight = None;
        }
        self.retry_at = None;
        self.retry.reset();
        let reason = format!(
            "its handler failed {} times: {why}",
            self.options.max_retries + 1
        );
        let attempts = self.options.max_retries.saturating_add(1);
        let _ = self.poison(entry, reason, attempts, now);
    }

    /// The offset store or the read model failed (while handling, or storing an offset): the
    /// stored offset is uncertain, so load it again after a wait.
    pub fn handle_store_failed(&mut self, now: Instant) {
        self.stats.store_failures += 1;
        self.reload(now);
    }

    /// Exactly once: the stored offset was not [`stored`](Self::stored) any more (another
    /// instance moved it), and the batch or skip was rolled back: load it again after a wait.
    pub fn handle_conflict(&mut self, now: Instant) {
        self.stats.conflicts += 1;
        self.reload(now);
    }

    /// The projection cannot go on (its stored offset does not fit the journal or its
    /// slices, or the journal cannot be read): stop with `error`.
    pub fn handle_refused(&mut self, error: ProjectionError) {
        self.queue.clear();
        self.in_flight = None;
        self.phase = Phase::Failed(error);
    }

    /// The stored offset as far as this core knows: what an exactly-once batch or skip builds
    /// on, and stores only if it is still the stored one.
    pub fn stored(&self) -> Offset {
        self.stats.offset
    }

    /// Drops what was read and loads the offset again after a wait.
    fn reload(&mut self, now: Instant) {
        self.phase = Phase::Loading;
        self.queue.clear();
        self.in_flight = None;
        self.attempts = 0;
        self.to_save = None;
        self.unsaved_events = 0;
        self.unsaved_since = None;
        self.retry_at = Some(now + self.retry.next_wait());
    }

    /// `offset` (from a [`Step::Save`]) was stored.
    pub fn handle_saved(&mut self, offset: Offset) {
        self.stats.offsets_saved += 1;
        self.stats.offset = offset;
        self.to_save = None;
        if offset == self.handled {
            self.unsaved_events = 0;
            self.unsaved_since = None;
        }
    }

    /// Asked to stop: the offset to store first, if handled events wait to be stored (at
    /// least once).
    pub fn offset_to_save_at_stop(&self) -> Option<Offset> {
        (self.unsaved_since.is_some() || self.to_save.is_some()).then_some(self.handled)
    }

    /// The entries the poison policy skipped since the last call (for a dead-letter store).
    pub fn take_skipped(&mut self) -> Vec<Skipped> {
        std::mem::take(&mut self.skipped)
    }

    fn is_commit_due(&self, now: Instant) -> bool {
        let Some(since) = self.unsaved_since else {
            return false;
        };
        self.unsaved_events >= self.options.commit_every
            || now >= since + self.options.commit_interval
    }

    /// `at`, or the time a pending at-least-once commit is due if that is earlier.
    fn earliest(&self, at: Instant) -> Instant {
        self.unsaved_since
            .map_or(at, |since| at.min(since + self.options.commit_interval))
    }

    /// Applies the poison policy to an entry that cannot be got past; the step to return if
    /// the projection stops.
    fn poison(
        &mut self,
        (offset, persistence_id, seq): (Offset, PersistenceId, u64),
        reason: String,
        attempts: u32,
        now: Instant,
    ) -> Option<Step<Ev>> {
        let name = &self.options.name;
        match self.options.poison {
            PoisonPolicy::Stop => {
                log::error!(
                    "projection `{name}` stops at stream `{persistence_id}`, seq {seq} (offset \
                     {offset}): {reason}"
                );
                let error = ProjectionError::Poison {
                    projection: name.clone(),
                    offset,
                    persistence_id,
                    seq,
                    reason,
                };
                self.handle_refused(error.clone());
                Some(Step::Failed(error))
            }
            PoisonPolicy::Skip => {
                log::warn!(
                    "projection `{name}` skips stream `{persistence_id}`, seq {seq} (offset \
                     {offset}): {reason}"
                );
                self.stats.skipped += 1;
                self.stats.entries += 1;
                self.skipped.push(Skipped {
                    offset,
                    persistence_id,
                    seq,
                    reason,
                    attempts,
                });
                self.handled = offset;
                if self.offset_in_transaction {
                    self.to_save = Some(offset);
                } else {
                    self.unsaved_since.get_or_insert(now);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
