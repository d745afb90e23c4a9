//! A journal in memory, with fault injection: for tests and examples.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use tokio::sync::oneshot;

use crate::codec::Manifest;
use crate::journal::{
    check_fence, check_max_events, check_payload, check_snapshot, check_tagged_append, normalized,
    slice_of, Journal, JournalError, JournalFuture, JournalId, Offset, PersistenceId, Snapshot,
    StoredEvent, Tag, TagNotifications, TagQuery, TagSignal, TaggedEvent,
};
use crate::runtime::random::random_u64;

/// A [`Journal`] in memory, with the same semantics as the durable ones ("committed" means
/// stored in this process), their payload limit ([`MAX_PAYLOAD_BYTES`](crate::journal::MAX_PAYLOAD_BYTES)) included. Clones
/// share the store.
///
/// [`MemoryJournal::faults`] injects failures: fail the Nth append, hold commits until
/// released, crash. [`MemoryJournal::stats`] counts appends and commits, so a test can see
/// from above how a caller batches its writes.
///
/// Each new journal has a [`JournalId`] of its own (128 random bits), shared by its
/// clones.
#[derive(Clone)]
pub struct MemoryJournal {
    shared: Arc<Mutex<State>>,
    id: JournalId,
}

impl Default for MemoryJournal {
    fn default() -> Self {
        Self {
            shared: Arc::default(),
            id: JournalId::from_draws(random_u64(), random_u64()),
        }
    }
}

/// Counters of a [`MemoryJournal`], from its creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Non-empty appends received with valid arguments (committed, refused or failed).
    pub appends: u64,
    /// Commits: one per append, or one for all the appends a [`MemoryFaults::release`] let
    /// through together.
    pub commits: u64,
    /// Events committed.
    pub events: u64,
}

/// The fault hook of a [`MemoryJournal`] (from [`MemoryJournal::faults`]); acts on the store
/// shared by all clones.
#[derive(Clone)]
pub struct MemoryFaults {
    shared: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    streams: HashMap<PersistenceId, Stream>,
    stats: MemoryStats,
    /// Fail the append this many appends from now (1: the next one).
    fail_in: Option<u64>,
    holding: bool,
    held: Vec<Held>,
    /// Per tag, its entries in commit order.
    tagged: HashMap<Tag, Vec<TagRow>>,
    /// The position of the last tagged entry.
    position: u64,
    signal: TagSignal,
    /// The metrics of `stats` (registered at the first append).
    #[cfg(feature = "metrics")]
    meter: Option<MemoryMeter>,
}

/// Events `highest - events.len() + 1 ..= highest`, gapless (deletion removes from the front).
#[derive(Default)]
struct Stream {
    events: VecDeque<(Vec<u8>, Manifest)>,
    highest: u64,
    snapshot: Option<Snapshot>,
}

/// One entry filed under a tag.
struct TagRow {
    /// Offset `0:position`.
    position: u64,
    id: PersistenceId,
    seq: u64,
    slice: u16,
    written_at: SystemTime,
}

struct Held {
    id: PersistenceId,
    first_seq: u64,
    payloads: Vec<Vec<u8>>,
    manifest: Manifest,
    tags: Vec<Vec<Tag>>,
    reply: oneshot::Sender<Result<(), JournalError>>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        Self::default()
    }

    /// The fault hook.
    pub fn faults(&self) -> MemoryFaults {
        MemoryFaults {
            shared: self.shared.clone(),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> MemoryStats {
        lock(&self.shared).stats
    }
}

impl MemoryFaults {
    /// Makes the `n`th append from now (1: the next one; 0 counts as 1) fail with a
    /// [`JournalError::Storage`] error, writing nothing. Replaces an earlier setting.
    pub fn fail_nth_append(&self, n: u64) {
        lock(&self.shared).fail_in = Some(n.max(1));
    }

    /// From now on, appends wait instead of committing, until [`release`](Self::release)
    /// or [`crash`](Self::crash). Needs no timer, so it works under `tokio::time::pause()`.
    pub fn hold_commits(&self) {
        lock(&self.shared).holding = true;
    }

    /// Commits the held appends, in arrival order, as one commit (each still fenced on its
    /// own: a conflict rejects only that append), and stops holding.
    pub fn release(&self) {
        let mut state = lock(&self.shared);
        state.holding = false;
        let held = std::mem::take(&mut state.held);
        if !held.is_empty() {
            state.stats.commits += 1;
        }
        for Held {
            id,
            first_seq,
            payloads,
            manifest,
            tags,
            reply,
        } in held
        {
            let result = state.commit(&id, first_seq, payloads, manifest, tags);
            // The caller may have dropped its future; the append is committed regardless.
            let _ = reply.send(result);
        }
    }

    /// Simulates a crash and restart: every held (uncommitted) append fails with a
    /// [`JournalError::Storage`] error and is gone, the committed state is what remains, and
    /// all faults are cleared.
    pub fn crash(&self) {
        let mut state = lock(&self.shared);
        state.holding = false;
        state.fail_in = None;
        for held in std::mem::take(&mut state.held) {
            let _ = held.reply.send(Err(JournalError::storage(
                Some(&held.id),
                "simulated crash before the commit",
            )));
        }
    }

    /// How many appends are held now.
    pub fn held(&self) -> usize {
        lock(&self.shared).held.len()
    }
}

impl State {
    fn commit(
        &mut self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
        tags: Vec<Vec<Tag>>,
    ) -> Result<(), JournalError> {
        #[cfg(feature = "metrics")]
        self.publish();
        let stream = self.streams.entry(id.clone()).or_default();
        check_fence(id, first_seq, stream.highest)?;
        stream.highest += payloads.len() as u64;
        if !tags.is_empty() {
            let (slice, written_at) = (slice_of(id), SystemTime::now());
            for (seq, entry_tags) in (first_seq..).zip(tags) {
                for tag in entry_tags {
                    self.position += 1;
                    self.tagged.entry(tag).or_default().push(TagRow {
                        position: self.position,
                        id: id.clone(),
                        seq,
                        slice,
                        written_at,
                    });
                }
            }
            self.signal.notify();
        }
        self.stats.events += payloads.len() as u64;
        stream.events.extend(
            payloads
                .into_iter()
                .map(|payload| (payload, manifest.clone())),
        );
        #[cfg(feature = "metrics")]
        self.publish();
        Ok(())
    }

    /// Publishes the counters to the metrics.
    #[cfg(feature = "metrics")]
    fn publish(&mut self) {
        let stats = self.stats;
        self.meter
            .get_or_insert_with(|| MemoryMeter::new(crate::telemetry::metrics::DEFAULT_LABEL))
            .publish(&stats);
    }

    fn highest(&self, id: &PersistenceId) -> u64 {
        self.streams.get(id).map_or(0, |stream| stream.highest)
    }
}

/// The lock never guards a panicking section, so a poisoned one is still consistent.
fn lock(shared: &Mutex<State>) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// The entries of `query` after `after`, at most `max` of them.
    fn by_tag(&self, query: &TagQuery, after: Offset, max: usize) -> Vec<TaggedEvent> {
        let Some(rows) = self.tagged.get(&query.tag) else {
            return Vec::new();
        };
        let start = rows.partition_point(|row| Offset::from_parts(0, row.position) <= after);
        rows[start..]
            .iter()
            .filter(|row| (query.slices.first()..=query.slices.last()).contains(&row.slice))
            .take(max)
            .map(|row| TaggedEvent {
                offset: Offset::from_parts(0, row.position),
                persistence_id: row.id.clone(),
                seq: row.seq,
                written_at: row.written_at,
                event: self.event(&row.id, row.seq),
            })
            .collect()
    }

    /// Event `seq` of stream `id`, unless it was deleted.
    fn event(&self, id: &PersistenceId, seq: u64) -> Option<StoredEvent> {
        let stream = self.streams.get(id)?;
        let first = stream.highest + 1 - stream.events.len() as u64;
        let index = usize::try_from(seq.checked_sub(first)?).ok()?;
        let (payload, manifest) = stream.events.get(index)?;
        Some(StoredEvent {
            seq,
            payload: payload.clone(),
            manifest: manifest.clone(),
        })
    }
}

impl Journal for MemoryJournal {
    fn append_as(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
    ) -> JournalFuture<'_, ()> {
        self.append_tagged(id, first_seq, payloads, manifest, Vec::new())
    }

    fn append_tagged(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
        manifest: Manifest,
        tags: Vec<Vec<Tag>>,
    ) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            check_tagged_append(
                &id,
                first_seq,
                &payloads,
                &tags,
                self.max_payload(),
                "memory",
            )?;
            let tags = normalized(tags);
            if payloads.is_empty() {
                return Ok(());
            }
            let reply = {
                let mut state = lock(&self.shared);
                state.stats.appends += 1;
                match state.fail_in {
                    Some(1) => {
                        state.fail_in = None;
                        #[cfg(feature = "metrics")]
                        state.publish();
                        return Err(JournalError::storage(Some(&id), "injected append failure"));
                    }
                    Some(n) => state.fail_in = Some(n - 1),
                    None => {}
                }
                if !state.holding {
                    state.stats.commits += 1;
                    return state.commit(&id, first_seq, payloads, manifest, tags);
                }
                let (reply, wait) = oneshot::channel();
                state.held.push(Held {
                    id: id.clone(),
                    first_seq,
                    payloads,
                    manifest,
                    tags,
                    reply,
                });
                wait
            };
            reply.await.unwrap_or(Err(JournalError::Closed))
        })
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        let id = id.clone();
        Box::pin(async move {
            let state = lock(&self.shared);
            let Some(stream) = state.streams.get(&id) else {
                return Ok(Vec::new());
            };
            let first = stream.highest + 1 - stream.events.len() as u64;
            let from = from_seq.max(first);
            let to = to_seq.min(stream.highest);
            if from > to {
                return Ok(Vec::new());
            }
            let count = usize::try_from(to - from + 1).map_or(max_events, |n| n.min(max_events));
            let skip = (from - first) as usize;
            Ok((from..)
                .zip(stream.events.iter().skip(skip).take(count))
                .map(|(seq, (payload, manifest))| StoredEvent {
                    seq,
                    payload: payload.clone(),
                    manifest: manifest.clone(),
                })
                .collect())
        })
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        let id = id.clone();
        Box::pin(async move { Ok(lock(&self.shared).highest(&id)) })
    }

    fn events_by_tag(
        &self,
        query: &TagQuery,
        after: Offset,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<TaggedEvent>> {
        let query = query.clone();
        Box::pin(async move {
            check_max_events(max_events)?;
            Ok(lock(&self.shared).by_tag(&query, after, max_events))
        })
    }

    fn tag_notifications(&self) -> Option<TagNotifications> {
        Some(lock(&self.shared).signal.subscribe())
    }

    /// `0:n`, `n` the position of the last tagged entry committed, in any tag.
    fn offset_ceiling(&self) -> JournalFuture<'_, Offset> {
        Box::pin(async move { Ok(Offset::from_parts(0, lock(&self.shared).position)) })
    }

    fn journal_id(&self) -> Option<JournalId> {
        Some(self.id.clone())
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            let mut state = lock(&self.shared);
            if let Some(stream) = state.streams.get_mut(&id) {
                let first = stream.highest + 1 - stream.events.len() as u64;
                if to_seq >= first {
                    let count = (to_seq - first + 1).min(stream.events.len() as u64);
                    stream.events.drain(..count as usize);
                }
            }
            Ok(())
        })
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            check_payload(&id, snapshot.payload.len(), self.max_payload(), "memory")?;
            let mut state = lock(&self.shared);
            check_snapshot(&id, snapshot.seq, state.highest(&id))?;
            let stream = state.streams.entry(id).or_default();
            if stream
                .snapshot
                .as_ref()
                .is_none_or(|current| current.seq <= snapshot.seq)
            {
                stream.snapshot = Some(snapshot);
            }
            Ok(())
        })
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        let id = id.clone();
        Box::pin(async move {
            let state = lock(&self.shared);
            Ok(state
                .streams
                .get(&id)
                .and_then(|stream| stream.snapshot.clone()))
        })
    }
}

#[cfg(feature = "metrics")]
crate::telemetry::metrics::meter! {
    /// A memory journal's metrics.
    MemoryMeter(MemoryStats, "journal") {
        counter appends: "actix_delivery_memory_journal_appends_total",
        counter commits: "actix_delivery_memory_journal_commits_total",
        counter events: "actix_delivery_memory_journal_events_total",
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    fn id(name: &str) -> PersistenceId {
        PersistenceId::new(name).unwrap()
    }

    #[test]
    fn nth_append_fails_and_writes_nothing() {
        let journal = MemoryJournal::new();
        let a = id("a");
        journal.faults().fail_nth_append(2);
        let append = |seq| {
            journal
                .append(&a, seq, vec![vec![seq as u8]])
                .now_or_never()
                .unwrap()
        };
        assert_eq!(append(1), Ok(()));
        assert!(matches!(append(2), Err(JournalError::Storage { .. })));
        assert_eq!(append(2), Ok(()));
        assert_eq!(journal.highest_seq(&a).now_or_never().unwrap(), Ok(2));
        assert_eq!(
            journal.stats(),
            MemoryStats {
                appends: 3,
                commits: 2,
                events: 2
            }
        );
    }

    #[test]
    fn held_appends_commit_together_on_release() {
        let journal = MemoryJournal::new();
        let faults = journal.faults();
        faults.hold_commits();
        let (a, b) = (id("a"), id("b"));
        let mut first = journal.append(&a, 1, vec![vec![1]]);
        let mut second = journal.append(&b, 1, vec![vec![2], vec![3]]);
        let mut conflicting = journal.append(&a, 1, vec![vec![9]]);
        assert!((&mut first).now_or_never().is_none());
        assert!((&mut second).now_or_never().is_none());
        assert!((&mut conflicting).now_or_never().is_none());
        assert_eq!(faults.held(), 3);
        assert_eq!(journal.highest_seq(&a).now_or_never().unwrap(), Ok(0));
        faults.release();
        assert_eq!(first.now_or_never().unwrap(), Ok(()));
        assert_eq!(second.now_or_never().unwrap(), Ok(()));
        assert_eq!(
            conflicting.now_or_never().unwrap(),
            Err(JournalError::Conflict {
                persistence_id: a.clone(),
                first_seq: 1,
                highest_seq: 1
            })
        );
        assert_eq!(
            journal.stats(),
            MemoryStats {
                appends: 3,
                commits: 1,
                events: 3
            }
        );
    }

    #[test]
    fn crash_drops_what_was_not_committed() {
        let journal = MemoryJournal::new();
        let faults = journal.faults();
        let a = id("a");
        assert_eq!(
            journal.append(&a, 1, vec![vec![1]]).now_or_never().unwrap(),
            Ok(())
        );
        faults.hold_commits();
        faults.fail_nth_append(5);
        let mut held = journal.append(&a, 2, vec![vec![2]]);
        assert!((&mut held).now_or_never().is_none());
        faults.crash();
        assert!(matches!(
            held.now_or_never().unwrap(),
            Err(JournalError::Storage { .. })
        ));
        assert_eq!(faults.held(), 0);
        assert_eq!(journal.highest_seq(&a).now_or_never().unwrap(), Ok(1));
        // After the "restart" appends commit at once again.
        assert_eq!(
            journal.append(&a, 2, vec![vec![3]]).now_or_never().unwrap(),
            Ok(())
        );
        let events = journal.replay(&a, 1, 9, 9).now_or_never().unwrap().unwrap();
        assert_eq!(
            events[1],
            StoredEvent {
                seq: 2,
                payload: vec![3],
                manifest: Manifest::raw(),
            }
        );
    }
}
