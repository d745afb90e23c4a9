//! The pure core of a persistent actor: decisions, batching into appends, replies held until
//! their commit, fail-stop, and catching up after a conflicting writer. No Actix, no Tokio,
//! no I/O: the actor shell carries out the appends and the recovery this core asks for.
//!
//! Lifecycle: the core starts recovering (commands wait in a bounded queue); the shell replays
//! the journal into a [`Recovery`] and hands the result to
//! [`finish_recovery`](PersistentCore::finish_recovery). Then every command is decided on
//! arrival: its events are applied to the state at once and queued with its reply in the
//! *pending* batch. Whenever no append is in flight, [`poll_append`](PersistentCore::poll_append)
//! turns the pending batch into one journal append; everything decided meanwhile forms the
//! next one. A commit releases the batch's replies; a failure answers every waiting command with
//! the error and stops the core; a conflict (another writer appended first) sends the core back
//! to recovery, after which the same commands are decided again on the caught-up state.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::codec::CodecError;
use crate::codec::Manifest;
use crate::journal::by_tag::normalized;
use crate::journal::error::JournalError;
use crate::journal::event::{Snapshot, StoredEvent};
use crate::journal::id::PersistenceId;
use crate::journal::tag::Tag;
use crate::persistence::behavior::{Decision, EventSourced};
use crate::persistence::config::PersistentConfig;
use crate::persistence::delivery_record::{DeliveryRecord, Mark, Seen};
use crate::persistence::entry::{Entry, Manifests, SnapshotIn, SnapshotOut, Unreadable};
use crate::persistence::error::CommandError;
use crate::persistence::outbox_state::{OutboxState, Sent};
use crate::persistence::type_names::TypeNames;
use crate::protocol::envelope::{DeliveryInfo, Incarnation};

/// A command as the actor receives it: possibly from a delivery, whose processed mark is then
/// stored with the command's events.
#[derive(Debug)]
pub struct Command<C> {
    /// The entity's command.
    pub command: C,
    /// The delivery it came from, if any.
    pub delivery: Option<DeliveryInfo>,
    /// With must-follow: the seq of the delivery from the same producer that must be
    /// processed first (0 for none); `None` means the previous seq (`seq - 1`), as when the
    /// producer's stream goes to this entity alone.
    pub previous: Option<u64>,
}

/// What a command achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<R> {
    /// It was decided, and whatever it caused is durable: the decision's reply.
    Done(R),
    /// Its delivery had been processed before (the mark is durable): nothing was decided.
    AlreadyProcessed,
}

/// What a command's caller gets.
pub type Answer<E> =
    Result<Outcome<<E as EventSourced>::Reply>, CommandError<<E as EventSourced>::Rejection>>;

/// An append the shell must carry out.
#[derive(Debug)]
pub struct Append {
    /// The seq of the first entry.
    pub first_seq: u64,
    /// The encoded entries.
    pub payloads: Vec<Vec<u8>>,
    /// How they are written.
    pub manifest: Manifest,
    /// The tags of each entry (one list per payload, sorted, without repeats), or none if no
    /// entry has one.
    pub tags: Vec<Vec<Tag>>,
    /// A snapshot was due with this append but could not be encoded (too large, or the
    /// state's `Serialize` failed): the next one is due after another `snapshot_every`
    /// events. For the shell to warn about.
    pub snapshot_error: Option<CodecError>,
}

/// What a commit released.
#[derive(Debug)]
pub struct Committed<T, A> {
    /// Replies to deliver, in the order their commands arrived.
    pub answers: Vec<(T, A)>,
    /// Deliveries recorded by the batch: send them now.
    pub sent: Vec<Sent>,
    /// A snapshot of the state as of the committed batch, to save (then maybe delete the
    /// events it covers).
    pub snapshot: Option<Snapshot>,
}

/// What a failed append leads to.
#[derive(Debug)]
pub enum Failure<T, A> {
    /// Another writer appended first: recover (catch up) again; the same commands are then
    /// decided again.
    CatchUp,
    /// The core stopped; every waiting command gets its error.
    Stopped(Vec<(T, A)>),
}

/// Counters of a persistent actor since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PersistentStats {
    /// Commands decided (recomputed ones after a conflict count again).
    pub decided: u64,
    /// Events stored (committed).
    pub events: u64,
    /// Journal entries stored (one per command that caused events or carried a delivery).
    pub entries: u64,
    /// Appends committed (each one journal write).
    pub appends: u64,
    /// Commands whose delivery was processed before: answered without deciding.
    pub duplicates: u64,
    /// Commands whose delivery was stale: refused.
    pub stale: u64,
    /// Commands the entity rejected.
    pub rejected: u64,
    /// Appends refused because another writer had appended first (then caught up).
    pub conflicts: u64,
    /// Catch-ups without a conflict: outbox deliveries stalled, and the journal held entries
    /// of another writer.
    pub catch_ups: u64,
    /// Recoveries finished (the first one included).
    pub recoveries: u64,
    /// Snapshots taken (encoded with a committed append; saving one may still fail, see
    /// `snapshot_failures`).
    pub snapshots: u64,
    /// Snapshots that were due but failed: not encodable (larger than `max_snapshot_bytes`,
    /// or the state's `Serialize` failed) or not saved by the journal. Each is tried again
    /// only after another `snapshot_every` events.
    pub snapshot_failures: u64,
    /// Commands refused because a destination had `max_unconfirmed` deliveries open, or
    /// because their delivery did not follow its predecessor (`must_follow`).
    pub refused: u64,
    /// Commands refused as [`CommandError::Overloaded`]: beyond `max_recovery_buffer` during
    /// recovery, or beyond `max_pending_commands` / `max_pending_bytes` behind an append.
    pub overloaded: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Recovering,
    Ready,
    Stopped,
}

struct Decided<E: EventSourced, T> {
    command: Command<E::Command>,
    token: T,
    answer: Answer<E>,
}

/// Commands decided together, stored by one append.
struct Batch<E: EventSourced, T> {
    payloads: Vec<Vec<u8>>,
    /// The tags of each of `payloads`.
    tags: Vec<Vec<Tag>>,
    /// The payloads' total length.
    bytes: u64,
    entries: u64,
    events: u64,
    decided: Vec<Decided<E, T>>,
    snapshot: Option<Snapshot>,
    /// A snapshot was due with the batch and failed to encode.
    snapshot_failed: bool,
    /// Deliveries the batch records (sent once it is committed).
    sent: Vec<Sent>,
    /// Confirmations of deliveries the batch records.
    confirmed: Vec<(String, u64)>,
}

impl<E: EventSourced, T> Default for Batch<E, T> {
    fn default() -> Self {
        Self {
            payloads: Vec::new(),
            tags: Vec::new(),
            bytes: 0,
            entries: 0,
            events: 0,
            decided: Vec::new(),
            snapshot: None,
            snapshot_failed: false,
            sent: Vec::new(),
            confirmed: Vec::new(),
        }
    }
}

/// The persistent actor's state machine. `T` is the token a caller's reply goes to.
pub struct PersistentCore<E: EventSourced, T> {
    id: PersistenceId,
    config: PersistentConfig,
    state: E,
    record: DeliveryRecord,
    /// The highest committed seq.
    durable_seq: u64,
    phase: Phase,
    /// Commands waiting to be decided (during recovery).
    queue: VecDeque<(Command<E::Command>, T)>,
    pending: Batch<E, T>,
    in_flight: Option<Batch<E, T>>,
    events_since_snapshot: u64,
    outbox: OutboxState,
    /// The outbox destinations decisions may deliver to.
    destinations: BTreeSet<String>,
    /// The outbox's incarnation if it has none yet.
    fresh_incarnation: Incarnation,
    stats: PersistentStats,
    manifests: Manifests,
}

impl<E: EventSourced, T> PersistentCore<E, T> {
    /// A core about to recover stream `id`. `epoch` is any instant (its delivery record ignores
    /// time; the shell reads the clock).
    pub fn new(id: PersistenceId, config: PersistentConfig, epoch: Instant) -> Self {
        Self {
            record: DeliveryRecord::new(config.max_producers, epoch),
            id,
            state: E::default(),
            durable_seq: 0,
            phase: Phase::Recovering,
            queue: VecDeque::new(),
            pending: Batch::default(),
            in_flight: None,
            events_since_snapshot: 0,
            outbox: OutboxState::default(),
            destinations: BTreeSet::new(),
            fresh_incarnation: Incarnation::from_u128(0),
            stats: PersistentStats::default(),
            manifests: Manifests::of::<E>(&TypeNames::of::<E>(), config.codec),
            config,
        }
    }

    /// Writes entries and snapshots under `names` (instead of `E`'s own).
    pub fn with_type_names(mut self, names: &TypeNames) -> Self {
        self.manifests = Manifests::of::<E>(names, self.config.codec);
        self
    }

    /// Lets decisions deliver to `destinations`; an outbox that has none yet sends under
    /// `incarnation` (drawn by the caller from the OS CSPRNG).
    pub fn with_outbox(
        mut self,
        destinations: impl IntoIterator<Item = String>,
        incarnation: Incarnation,
    ) -> Self {
        self.destinations = destinations.into_iter().collect();
        self.fresh_incarnation = incarnation;
        self
    }

    /// A delivery of the outbox was confirmed by its destination: the confirmation is recorded
    /// with the next append.
    pub fn handle_confirmed(&mut self, destination: &str, seq: u64) {
        if self.phase == Phase::Ready {
            self.pending.confirmed.push((destination.to_owned(), seq));
        }
    }

    /// The outbox as recovered and decided so far.
    pub fn outbox(&self) -> &OutboxState {
        &self.outbox
    }

    /// A command arrived. `Some` is an answer to give at once; otherwise the answer comes with
    /// a later commit, failure or recovery.
    pub fn handle_command(
        &mut self,
        command: Command<E::Command>,
        token: T,
    ) -> Option<(T, Answer<E>)> {
        match self.phase {
            Phase::Stopped => Some((token, Err(CommandError::Stopped))),
            Phase::Recovering if self.queue.len() >= self.config.max_recovery_buffer => {
                self.stats.overloaded += 1;
                let buffered = self.queue.len();
                Some((token, Err(CommandError::Overloaded { buffered })))
            }
            Phase::Recovering => {
                self.queue.push_back((command, token));
                None
            }
            Phase::Ready if self.is_full() => {
                self.stats.overloaded += 1;
                let buffered = self.waiting_for_commit();
                Some((token, Err(CommandError::Overloaded { buffered })))
            }
            Phase::Ready => self.decide(command, token),
        }
    }

    /// Commands decided and waiting for their commit (in the append in flight or the next).
    fn waiting_for_commit(&self) -> usize {
        self.pending.decided.len() + self.in_flight.as_ref().map_or(0, |b| b.decided.len())
    }

    /// Whether an arriving command must be refused: `max_pending_commands` wait for their
    /// commit, or the next append holds `max_pending_bytes` already.
    fn is_full(&self) -> bool {
        self.waiting_for_commit() >= self.config.max_pending_commands
            || self.pending.bytes >= self.config.max_pending_bytes
    }

    /// The next append to carry out: the pending batch, if no append is in flight (one at a
    /// time keeps the entries in order and the fence meaningful).
    pub fn poll_append(&mut self) -> Option<Append> {
        let nothing = self.pending.entries == 0 && self.pending.confirmed.is_empty();
        if self.phase != Phase::Ready || self.in_flight.is_some() || nothing {
            return None;
        }
        let mut batch = std::mem::take(&mut self.pending);
        if !batch.confirmed.is_empty() {
            let mut entry = Entry::<E::Event>::new(Vec::new(), None);
            entry.record.confirmed = batch.confirmed.clone();
            match entry.encode(self.config.codec) {
                Ok(payload) => {
                    batch.payloads.push(payload);
                    batch.tags.push(Vec::new());
                    batch.entries += 1;
                    self.outbox.apply_confirmed(&batch.confirmed, true);
                }
                Err(error) => {
                    log::warn!("stream `{}`: confirmations not recorded: {error}", self.id);
                    batch.confirmed.clear();
                }
            }
        }
        let first_seq = self.durable_seq + 1;
        let due = self.config.snapshot_every.is_some_and(|every| {
            self.events_since_snapshot + batch.events >= every.max(self.state.snapshot_weight())
        });
        let mut snapshot_error = None;
        if due {
            // The state now holds exactly what is committed plus this batch.
            let seq = first_seq + batch.entries - 1;
            let snapshot = SnapshotOut::new(&self.state, self.record.to_records(), &self.outbox);
            match snapshot.encode(self.config.codec, self.config.max_snapshot_bytes) {
                Ok(payload) => {
                    batch.snapshot = Some(Snapshot {
                        seq,
                        payload,
                        manifest: self.manifests.state.clone(),
                    });
                }
                Err(error) => {
                    // Counted as an attempt: not tried again with every append.
                    self.stats.snapshot_failures += 1;
                    batch.snapshot_failed = true;
                    snapshot_error = Some(error);
                }
            }
        }
        let payloads = std::mem::take(&mut batch.payloads);
        let tags = normalized(std::mem::take(&mut batch.tags));
        self.in_flight = Some(batch);
        Some(Append {
            first_seq,
            payloads,
            manifest: self.manifests.events.clone(),
            tags,
            snapshot_error,
        })
    }

    /// The append in flight committed.
    pub fn handle_committed(&mut self) -> Committed<T, Answer<E>> {
        let Some(batch) = self.in_flight.take() else {
            debug_assert!(false, "a commit arrived with no append in flight");
            return Committed {
                answers: Vec::new(),
                snapshot: None,
                sent: Vec::new(),
            };
        };
        self.durable_seq += batch.entries;
        self.stats.appends += 1;
        self.stats.entries += batch.entries;
        self.stats.events += batch.events;
        if batch.snapshot.is_some() {
            self.events_since_snapshot = 0;
            self.stats.snapshots += 1;
        } else if batch.snapshot_failed {
            self.events_since_snapshot = 0; // the next attempt after another interval
        } else {
            self.events_since_snapshot += batch.events;
        }
        self.outbox.committed(&batch.confirmed);
        Committed {
            answers: batch
                .decided
                .into_iter()
                .map(|d| (d.token, d.answer))
                .collect(),
            snapshot: batch.snapshot,
            sent: batch.sent,
        }
    }

    /// A snapshot [`Committed`] handed out could not be saved (it is only counted: the
    /// events it covers are still in the journal).
    pub fn handle_snapshot_failed(&mut self) {
        self.stats.snapshot_failures += 1;
    }

    /// The append in flight failed.
    pub fn handle_append_failed(&mut self, error: JournalError) -> Failure<T, Answer<E>> {
        let in_flight = self.in_flight.take().unwrap_or_default();
        let pending = std::mem::take(&mut self.pending);
        let decided = in_flight.decided.into_iter().chain(pending.decided);
        if let JournalError::Conflict { .. } = error {
            // Decided on a state another writer has moved past: decide again after catching up.
            self.stats.conflicts += 1;
            let requeued: Vec<_> = decided.map(|d| (d.command, d.token)).collect();
            for waiting in requeued.into_iter().rev() {
                self.queue.push_front(waiting);
            }
            self.phase = Phase::Recovering;
            return Failure::CatchUp;
        }
        let mut answers: Vec<(T, Answer<E>)> = decided
            .map(|d| (d.token, Err(CommandError::Journal(error.clone()))))
            .collect();
        answers.extend(
            self.queue
                .drain(..)
                .map(|(_, token)| (token, Err(CommandError::Journal(error.clone())))),
        );
        self.phase = Phase::Stopped;
        Failure::Stopped(answers)
    }

    /// Recovery produced the durable state: take it, and decide the commands that waited.
    /// Returns the answers to give at once.
    pub fn finish_recovery(&mut self, recovered: Recovered<E>) -> Vec<(T, Answer<E>)> {
        self.state = recovered.state;
        self.record = recovered.record;
        self.outbox = recovered.outbox;
        self.durable_seq = recovered.highest_seq;
        self.events_since_snapshot = recovered.events_since_snapshot;
        self.stats.recoveries += 1;
        self.phase = Phase::Ready;
        let waiting: Vec<_> = self.queue.drain(..).collect();
        waiting
            .into_iter()
            .filter_map(|(command, token)| self.decide(command, token))
            .collect()
    }

    /// The journal's highest seq is `highest_seq`: if another writer appended beyond what
    /// this core committed, and nothing is being decided or stored, the core starts catching
    /// up (recover, then go on) and returns `true`. An idle second instance of an
    /// entity learns this way of what the other one wrote, confirmations included.
    pub fn catch_up_if_behind(&mut self, highest_seq: u64) -> bool {
        if highest_seq <= self.durable_seq || !self.is_ready() || !self.is_idle() {
            return false;
        }
        self.stats.catch_ups += 1;
        self.phase = Phase::Recovering;
        true
    }

    /// Recovery failed: every waiting command gets the error, and the core stops.
    pub fn fail_recovery(&mut self, error: &JournalError) -> Vec<(T, Answer<E>)> {
        self.phase = Phase::Stopped;
        self.queue
            .drain(..)
            .map(|(_, token)| (token, Err(CommandError::Recovery(error.clone()))))
            .collect()
    }

    /// Stops the core: commands still waiting (not yet decided, or decided but not appended)
    /// are answered [`CommandError::Stopped`]; those of an append in flight (its entries may
    /// or may not be stored) [`CommandError::InDoubt`].
    pub fn stop(&mut self) -> Vec<(T, Answer<E>)> {
        self.phase = Phase::Stopped;
        let in_flight = self.in_flight.take().unwrap_or_default();
        let pending = std::mem::take(&mut self.pending);
        let in_doubt = in_flight
            .decided
            .into_iter()
            .map(|d| (d.token, Err(CommandError::InDoubt)));
        let queued = self.queue.drain(..).map(|(_, token)| token);
        let unstored = pending.decided.into_iter().map(|d| d.token).chain(queued);
        in_doubt
            .chain(unstored.map(|token| (token, Err(CommandError::Stopped))))
            .collect()
    }

    /// Whether the state is recovered and commands are decided (not recovering, not stopped).
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Whether nothing waits: no command queued, decided but unstored, or in flight.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.pending.decided.is_empty()
            && self.pending.confirmed.is_empty()
            && self.in_flight.is_none()
    }

    /// The stream.
    pub fn persistence_id(&self) -> &PersistenceId {
        &self.id
    }

    /// Counters since start.
    pub fn stats(&self) -> PersistentStats {
        self.stats
    }

    fn decide(&mut self, command: Command<E::Command>, token: T) -> Option<(T, Answer<E>)> {
        self.stats.decided += 1;
        if let Some(info) = &command.delivery {
            let follows = self.config.must_follow.then(|| {
                command
                    .previous
                    .unwrap_or(info.seqs().start().saturating_sub(1))
            });
            match self.record.seen(info, follows) {
                Seen::New => {}
                Seen::OutOfOrder { expected } => {
                    self.stats.refused += 1;
                    let error = CommandError::OutOfOrder { expected };
                    return self.attach(command, token, Err(error));
                }
                Seen::Duplicate => {
                    self.stats.duplicates += 1;
                    return self.attach(command, token, Ok(Outcome::AlreadyProcessed));
                }
                Seen::Stale => {
                    self.stats.stale += 1;
                    return self.attach(command, token, Err(CommandError::Stale));
                }
            }
        }
        let decision = match self.state.decide(&command.command) {
            Ok(decision) => decision,
            Err(rejection) => {
                self.stats.rejected += 1;
                return self.attach(command, token, Err(CommandError::Rejected(rejection)));
            }
        };
        let Decision {
            events,
            reply,
            deliveries,
        } = decision;
        let sent = match self.outgoing(deliveries) {
            Ok(sent) => sent,
            Err(error) => return self.attach(command, token, Err(error)),
        };
        let processed = command.delivery.as_ref().map(Mark::from);
        if events.is_empty() && processed.is_none() && sent.is_empty() {
            return self.attach(command, token, Ok(Outcome::Done(reply)));
        }
        let mut entry = Entry::new(events, processed);
        if !sent.is_empty() && self.outbox.incarnation.is_none() {
            entry.record.outbox_incarnation = Some(self.fresh_incarnation);
        }
        entry.record.sent = sent;
        let payload = match entry.encode(self.config.codec) {
            Ok(payload) => payload,
            Err(error) => return self.attach(command, token, Err(CommandError::Encoding(error))),
        };
        for event in &entry.events {
            self.state.apply(event);
        }
        let record = entry.record;
        if let Some(mark) = &record.processed {
            self.record.record(mark);
        }
        if let Some(incarnation) = record.outbox_incarnation {
            self.outbox.incarnation = Some(incarnation);
        }
        for sent in &record.sent {
            self.outbox.apply_sent(sent);
        }
        self.pending.sent.extend(record.sent);
        self.pending.bytes += payload.len() as u64;
        self.pending.payloads.push(payload);
        self.pending
            .tags
            .push(entry.events.iter().flat_map(E::tags).collect());
        self.pending.entries += 1;
        self.pending.events += entry.events.len() as u64;
        self.pending.decided.push(Decided {
            command,
            token,
            answer: Ok(Outcome::Done(reply)),
        });
        None
    }

    /// The deliveries of a decision, numbered per destination; refused if a destination is
    /// unknown, a message did not encode, or a destination has `max_unconfirmed` open.
    fn outgoing(
        &mut self,
        deliveries: Vec<(String, Result<Vec<u8>, crate::codec::CodecError>)>,
    ) -> Result<Vec<Sent>, CommandError<E::Rejection>> {
        let mut next: BTreeMap<String, u64> = BTreeMap::new();
        let mut sent = Vec::with_capacity(deliveries.len());
        for (destination, message) in deliveries {
            if !self.destinations.contains(&destination) {
                return Err(CommandError::UnknownDestination(destination));
            }
            let message = message.map_err(CommandError::Encoding)?;
            let lane = self.outbox.lanes.get(&destination);
            let seq = next
                .entry(destination.clone())
                .or_insert_with(|| lane.map_or(1, |lane| lane.next_seq.max(1)));
            let unconfirmed = self.outbox.unconfirmed(&destination);
            let counted = sent
                .iter()
                .filter(|s: &&Sent| s.destination == destination)
                .count();
            if unconfirmed + counted >= self.config.max_unconfirmed {
                self.stats.refused += 1;
                return Err(CommandError::OutboxFull {
                    destination,
                    unconfirmed,
                });
            }
            sent.push(Sent {
                destination,
                seq: *seq,
                message,
            });
            *seq += 1;
        }
        Ok(sent)
    }

    /// Holds an answer that stores nothing until what was decided before it is durable.
    fn attach(
        &mut self,
        command: Command<E::Command>,
        token: T,
        answer: Answer<E>,
    ) -> Option<(T, Answer<E>)> {
        let batch = if self.pending.entries > 0 {
            &mut self.pending
        } else if let Some(in_flight) = &mut self.in_flight {
            in_flight
        } else {
            return Some((token, answer));
        };
        batch.decided.push(Decided {
            command,
            token,
            answer,
        });
        None
    }
}

/// The durable state of a stream, as a recovery rebuilt it.
pub struct Recovered<E> {
    /// The state.
    pub state: E,
    record: DeliveryRecord,
    outbox: OutboxState,
    highest_seq: u64,
    events_since_snapshot: u64,
}

impl<E> Recovered<E> {
    /// The recovered outbox: what was recorded as delivered and not confirmed (committed).
    pub fn outbox(&self) -> &OutboxState {
        &self.outbox
    }
}

/// Rebuilds a stream's state: from its snapshot (if one decodes), then every later entry in
/// order. Pure: the caller reads the journal.
pub struct Recovery<E> {
    id: PersistenceId,
    /// The stored names it reads as its own: others are another application's, refused.
    names: TypeNames,
    state: E,
    record: DeliveryRecord,
    outbox: OutboxState,
    from_seq: u64,
    last_seq: u64,
    events: u64,
}

impl<E: EventSourced> Recovery<E> {
    /// A recovery of stream `id`, starting from the empty state, reading what is stored under
    /// `names`. `epoch` is any instant (its delivery record ignores time).
    pub fn new(
        id: PersistenceId,
        config: &PersistentConfig,
        names: TypeNames,
        epoch: Instant,
    ) -> Self {
        Self {
            id,
            names,
            state: E::default(),
            record: DeliveryRecord::new(config.max_producers, epoch),
            outbox: OutboxState::default(),
            from_seq: 1,
            last_seq: 0,
            events: 0,
        }
    }

    /// Starts from `snapshot` if it can be read. A snapshot that does not decode, or is of an
    /// older version of the state that [`EventSourced::upcast_state`] does not read, is
    /// skipped with a warning: the recovery replays from the beginning instead. Returns the
    /// first seq to replay.
    ///
    /// # Errors
    /// [`JournalError::Incompatible`] for a snapshot of a newer version of the state than
    /// this code's (a rollback), [`JournalError::ForeignType`] for one of another type:
    /// fail-stop, never a silent skip.
    pub fn restore_snapshot(
        &mut self,
        snapshot: Option<Snapshot>,
        config: &PersistentConfig,
    ) -> Result<u64, JournalError> {
        let Some(snapshot) = snapshot else {
            return Ok(1);
        };
        self.check_name(&snapshot.manifest, snapshot.seq, true)?;
        if snapshot.manifest.version() > E::STATE_VERSION {
            return Err(JournalError::Incompatible {
                persistence_id: self.id.clone(),
                seq: snapshot.seq,
                reason: format!(
                    "the snapshot is written as {}, newer than this code's version {} of the \
                     state (was the code rolled back?)",
                    snapshot.manifest,
                    E::STATE_VERSION
                ),
            });
        }
        let decoded = SnapshotIn::<E>::decode(
            &snapshot.payload,
            &snapshot.manifest,
            E::STATE_VERSION,
            E::upcast_state,
        );
        match decoded {
            Ok(decoded) => {
                self.state = decoded.state;
                self.record = DeliveryRecord::from_records(
                    config.max_producers,
                    decoded.delivered,
                    self.record.epoch(),
                );
                self.outbox = decoded.outbox;
                self.from_seq = snapshot.seq + 1;
                self.last_seq = snapshot.seq;
            }
            Err(reason) => log::warn!(
                "stream `{}`: the snapshot at seq {} cannot be read ({reason}); replaying all \
                 events instead",
                self.id,
                snapshot.seq
            ),
        }
        Ok(self.from_seq)
    }

    /// Applies the next stored entry.
    ///
    /// # Errors
    /// [`JournalError::Corrupt`], naming the stream and seq, if the entry does not decode or
    /// is not the next one (events missing, for instance deleted before a snapshot that no
    /// longer decodes); [`JournalError::ForeignType`] if it is another type's.
    pub fn apply(&mut self, stored: StoredEvent) -> Result<(), JournalError> {
        if stored.seq != self.last_seq + 1 {
            return Err(self.corrupt(
                self.last_seq + 1,
                format!(
                    "missing (the journal holds seq {} next; were events deleted before an \
                     unreadable snapshot?)",
                    stored.seq
                ),
            ));
        }
        self.check_name(&stored.manifest, stored.seq, false)?;
        let entry = Entry::<E::Event>::decode(
            &stored.payload,
            &stored.manifest,
            E::EVENT_VERSION,
            E::upcast_events,
        )
        .map_err(|reason| self.unreadable(stored.seq, reason))?;
        for event in &entry.events {
            self.state.apply(event);
        }
        let record = entry.record;
        if let Some(mark) = &record.processed {
            self.record.record(mark);
        }
        if let Some(incarnation) = record.outbox_incarnation {
            self.outbox.incarnation = Some(incarnation);
        }
        for sent in &record.sent {
            self.outbox.apply_sent(sent);
        }
        self.outbox.apply_confirmed(&record.confirmed, false);
        self.last_seq = stored.seq;
        self.events += entry.events.len() as u64;
        Ok(())
    }

    /// The recovered state, once every entry up to `highest_seq` was applied.
    ///
    /// # Errors
    /// [`JournalError::Corrupt`] if entries up to `highest_seq` are missing.
    pub fn finish(self, highest_seq: u64) -> Result<Recovered<E>, JournalError> {
        if self.last_seq != highest_seq {
            let missing = self.last_seq + 1;
            return Err(self.corrupt(
                missing,
                format!("missing: the stream's highest seq is {highest_seq}"),
            ));
        }
        Ok(Recovered {
            state: self.state,
            record: self.record,
            outbox: self.outbox,
            highest_seq,
            events_since_snapshot: self.events,
        })
    }

    /// Refuses an entry (or, `snapshot`, a snapshot) stored under another type's name.
    fn check_name(
        &self,
        manifest: &Manifest,
        seq: u64,
        snapshot: bool,
    ) -> Result<(), JournalError> {
        self.names
            .check(manifest, snapshot)
            .map_err(|foreign| JournalError::ForeignType {
                persistence_id: self.id.clone(),
                seq,
                stored: foreign.stored,
                expected: foreign.expected,
            })
    }

    fn unreadable(&self, seq: u64, unreadable: Unreadable) -> JournalError {
        match unreadable {
            Unreadable::Corrupt(reason) => self.corrupt(seq, reason),
            Unreadable::Incompatible(reason) => JournalError::Incompatible {
                persistence_id: self.id.clone(),
                seq,
                reason,
            },
        }
    }

    fn corrupt(&self, seq: u64, reason: String) -> JournalError {
        JournalError::Corrupt {
            persistence_id: self.id.clone(),
            seq,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persistence::behavior::Decision;
    use crate::protocol::envelope::{IncarnationId, ProducerId};

    /// A counter: `Add(n)` stores `Added(n)` and replies the new total; negatives are rejected;
    /// `Get` stores nothing.
    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    struct Counter {
        total: i64,
        adds: u32,
    }

    #[derive(Debug)]
    enum Op {
        Add(i64),
        /// Two events in one entry.
        AddBoth(i64, i64),
        Get,
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Added(i64);

    impl EventSourced for Counter {
        type Command = Op;
        type Event = Added;
        type Reply = i64;
        type Rejection = String;

        fn decide(&self, command: &Op) -> Result<Decision<Self>, String> {
            match *command {
                Op::Add(n) if n < 0 => Err(format!("negative: {n}")),
                Op::Add(n) => Ok(Decision::persist([Added(n)], self.total + n)),
                Op::AddBoth(a, b) => Ok(Decision::persist([Added(a), Added(b)], a + b)),
                Op::Get => Ok(Decision::reply(self.total)),
            }
        }

        fn apply(&mut self, Added(n): &Added) {
            self.total += n;
            self.adds += 1;
        }

        /// Every event is an addition; one of 100 or more is also big; 0 is untagged.
        fn tags(Added(n): &Added) -> Vec<Tag> {
            match *n {
                0 => Vec::new(),
                n if n >= 100 => vec![Tag::from_static("big"), Tag::from_static("added")],
                _ => vec![Tag::from_static("added")],
            }
        }
    }

    type Core = PersistentCore<Counter, u32>;

    /// What a test journal holds: the entries of one stream, and its snapshot.
    #[derive(Default)]
    struct Stream {
        entries: Vec<(Vec<u8>, Manifest)>,
        snapshot: Option<Snapshot>,
        deleted_to: u64,
    }

    impl Stream {
        fn append(&mut self, append: Append) {
            assert_eq!(
                append.first_seq,
                self.entries.len() as u64 + 1,
                "appends in order"
            );
            let manifest = append.manifest;
            self.entries
                .extend(append.payloads.into_iter().map(|p| (p, manifest.clone())));
        }

        fn recover(&self, config: &PersistentConfig) -> Result<Recovered<Counter>, JournalError> {
            let mut recovery =
                Recovery::new(id(), config, TypeNames::of::<Counter>(), Instant::now());
            let from = recovery.restore_snapshot(self.snapshot.clone(), config)?;
            for (index, (payload, manifest)) in self.entries.iter().enumerate() {
                let seq = index as u64 + 1;
                if seq >= from && seq > self.deleted_to {
                    recovery.apply(StoredEvent {
                        seq,
                        payload: payload.clone(),
                        manifest: manifest.clone(),
                    })?;
                }
            }
            recovery.finish(self.entries.len() as u64)
        }
    }

    fn id() -> PersistenceId {
        PersistenceId::new("counter").unwrap()
    }

    fn ready(stream: &Stream, config: PersistentConfig) -> Core {
        let mut core = Core::new(id(), config.clone(), Instant::now());
        assert!(core
            .finish_recovery(stream.recover(&config).unwrap())
            .is_empty());
        core
    }

    fn plain(op: Op) -> Command<Op> {
        Command {
            command: op,
            delivery: None,
            previous: None,
        }
    }

    fn delivered(op: Op, seq: u64, window_start: u64) -> Command<Op> {
        Command {
            command: op,
            delivery: Some(DeliveryInfo {
                producer_id: ProducerId::from("p"),
                incarnation: IncarnationId::from_u128(1),
                seq,
                window_start,
                trace_context: None,
                first_seq: None,
            }),
            previous: None,
        }
    }

    /// Commits the append in flight into `stream`; the tokens answered and how.
    fn commit(core: &mut Core, stream: &mut Stream) -> Vec<(u32, Answer<Counter>)> {
        let append = core.poll_append().expect("an append is due");
        stream.append(append);
        core.handle_committed().answers
    }

    fn done(answers: &[(u32, Answer<Counter>)]) -> Vec<(u32, i64)> {
        answers
            .iter()
            .map(|(token, answer)| match answer {
                Ok(Outcome::Done(reply)) => (*token, *reply),
                other => panic!("token {token}: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn commands_during_recovery_wait_in_order_and_beyond_the_bound_are_refused() {
        let config = PersistentConfig {
            max_recovery_buffer: 2,
            ..Default::default()
        };
        let mut core = Core::new(id(), config.clone(), Instant::now());
        assert!(core.handle_command(plain(Op::Add(1)), 1).is_none());
        assert!(core.handle_command(plain(Op::Add(2)), 2).is_none());
        let refused = core.handle_command(plain(Op::Add(3)), 3).unwrap();
        assert!(matches!(
            refused,
            (3, Err(CommandError::Overloaded { buffered: 2 }))
        ));
        assert_eq!(core.stats().overloaded, 1);
        assert!(
            core.poll_append().is_none(),
            "nothing is appended while recovering"
        );
        let mut stream = Stream::default();
        assert!(core
            .finish_recovery(stream.recover(&config).unwrap())
            .is_empty());
        assert_eq!(done(&commit(&mut core, &mut stream)), [(1, 1), (2, 3)]);
    }

    #[test]
    fn commands_waiting_for_their_commit_are_bounded_in_number_and_bytes() {
        let config = PersistentConfig {
            max_pending_commands: 3,
            ..Default::default()
        };
        let mut stream = Stream::default();
        let mut core = ready(&stream, config);
        assert!(core.handle_command(plain(Op::Add(1)), 1).is_none());
        let first = core.poll_append().unwrap();
        // Behind the append in flight: its command and two more wait, a read included.
        assert!(core.handle_command(plain(Op::Add(2)), 2).is_none());
        assert!(core.handle_command(plain(Op::Get), 3).is_none());
        let refused = core.handle_command(plain(Op::Add(4)), 4);
        assert!(matches!(
            refused,
            Some((4, Err(CommandError::Overloaded { buffered: 3 })))
        ));
        assert_eq!(core.stats().overloaded, 1);
        stream.append(first);
        assert_eq!(done(&core.handle_committed().answers), [(1, 1)]);
        // The commit made room again.
        assert!(core.handle_command(plain(Op::Add(5)), 5).is_none());
        assert_eq!(
            done(&commit(&mut core, &mut stream)),
            [(2, 3), (3, 3), (5, 8)]
        );

        let config = PersistentConfig {
            max_pending_bytes: 1,
            ..Default::default()
        };
        let mut core = ready(&Stream::default(), config);
        assert!(core.handle_command(plain(Op::Add(1)), 1).is_none());
        assert!(
            matches!(
                core.handle_command(plain(Op::Add(2)), 2),
                Some((2, Err(CommandError::Overloaded { buffered: 1 })))
            ),
            "the next append is full"
        );
        core.poll_append().unwrap();
        assert!(
            core.handle_command(plain(Op::Add(3)), 3).is_none(),
            "a new batch"
        );
        assert_eq!(core.stats().overloaded, 1);
    }

    #[test]
    fn an_entry_is_filed_under_the_tags_of_its_events_each_once_in_the_same_append() {
        let stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        for (token, op) in [(1, Op::AddBoth(1, 200)), (2, Op::Add(0)), (3, Op::Add(5))] {
            assert!(core.handle_command(plain(op), token).is_none());
        }
        let append = core.poll_append().unwrap();
        let (added, big) = (Tag::from_static("added"), Tag::from_static("big"));
        assert_eq!(append.payloads.len(), 3);
        assert_eq!(
            append.tags,
            [vec![added.clone(), big], vec![], vec![added]],
            "one list per entry, sorted, without repeats"
        );
        let mut untagged = ready(&stream, PersistentConfig::default());
        assert!(untagged.handle_command(plain(Op::Add(0)), 1).is_none());
        assert!(
            untagged.poll_append().unwrap().tags.is_empty(),
            "no tags at all: none"
        );
    }

    #[test]
    fn replies_wait_for_the_commit_and_commands_decided_meanwhile_share_the_next_append() {
        let mut stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        for (token, n) in [(1, 10), (2, 20)] {
            assert!(core.handle_command(plain(Op::Add(n)), token).is_none());
        }
        let first = core.poll_append().unwrap();
        assert_eq!((first.first_seq, first.payloads.len()), (1, 2));
        // While it is in flight: three more commands, one of them stores nothing.
        assert!(core.handle_command(plain(Op::Add(1)), 3).is_none());
        assert!(
            core.handle_command(plain(Op::Get), 4).is_none(),
            "held: 3 is not durable"
        );
        assert!(core.handle_command(plain(Op::Add(2)), 5).is_none());
        assert!(
            core.poll_append().is_none(),
            "one append in flight at a time"
        );
        stream.append(first);
        assert_eq!(done(&core.handle_committed().answers), [(1, 10), (2, 30)]);
        assert_eq!(
            done(&commit(&mut core, &mut stream)),
            [(3, 31), (4, 31), (5, 33)]
        );
        assert!(core.is_idle());
        // Nothing pending or in flight: a read is answered at once.
        assert_eq!(
            core.handle_command(plain(Op::Get), 6)
                .map(|(t, a)| (t, a.ok())),
            Some((6, Some(Outcome::Done(33))))
        );
        let stats = core.stats();
        assert_eq!((stats.appends, stats.entries, stats.events), (2, 4, 4));
        assert_eq!(
            stream
                .recover(&PersistentConfig::default())
                .unwrap()
                .state
                .total,
            33
        );
    }

    #[test]
    fn a_failed_append_never_answers_ok_and_stops_the_core() {
        let stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        core.handle_command(plain(Op::Add(1)), 1);
        let _lost = core.poll_append().unwrap();
        core.handle_command(plain(Op::Add(2)), 2);
        core.handle_command(plain(Op::Get), 3);
        let error = JournalError::storage(Some(&id()), "disk full");
        let Failure::Stopped(answers) = core.handle_append_failed(error.clone()) else {
            panic!("a storage error stops the core");
        };
        let tokens: Vec<u32> = answers.iter().map(|(t, _)| *t).collect();
        assert_eq!(tokens, [1, 2, 3]);
        assert!(answers
            .iter()
            .all(|(_, a)| matches!(a, Err(CommandError::Journal(e)) if *e == error)));
        assert!(matches!(
            core.handle_command(plain(Op::Add(1)), 4),
            Some((4, Err(CommandError::Stopped)))
        ));
    }

    #[test]
    fn a_delivery_is_processed_once_and_its_duplicate_answered_after_the_mark_is_durable() {
        let mut stream = Stream::default();
        let config = PersistentConfig::default();
        let mut core = ready(&stream, config.clone());
        assert!(core
            .handle_command(delivered(Op::Add(5), 1, 1), 1)
            .is_none());
        // A retransmission before the commit: held, then answered as a duplicate.
        assert!(core
            .handle_command(delivered(Op::Add(5), 1, 1), 2)
            .is_none());
        let answers = commit(&mut core, &mut stream);
        assert!(matches!(answers[0], (1, Ok(Outcome::Done(5)))));
        assert!(matches!(answers[1], (2, Ok(Outcome::AlreadyProcessed))));
        // After the commit: answered at once.
        let at_once = core.handle_command(delivered(Op::Add(5), 1, 1), 3);
        assert!(matches!(at_once, Some((3, Ok(Outcome::AlreadyProcessed)))));
        // And after a recovery (a consumer crash), from the journal alone.
        let mut recovered = ready(&stream, config);
        let after_crash = recovered.handle_command(delivered(Op::Add(5), 1, 1), 4);
        assert!(matches!(
            after_crash,
            Some((4, Ok(Outcome::AlreadyProcessed)))
        ));
        assert_eq!(stream.entries.len(), 1, "the event is stored once");
        assert_eq!(core.stats().duplicates, 2);
    }

    #[test]
    fn with_must_follow_a_delivery_waits_for_its_explicit_predecessor_not_seq_minus_one() {
        let config = PersistentConfig {
            must_follow: true,
            ..Default::default()
        };
        let mut stream = Stream::default();
        let mut core = ready(&stream, config);
        // The producer's seqs 2 and 5 came to this entity (the others went elsewhere).
        let following = |seq, previous| Command {
            previous: Some(previous),
            ..delivered(Op::Add(1), seq, 1)
        };
        let early = core.handle_command(following(5, 2), 1);
        assert!(matches!(
            early,
            Some((1, Err(CommandError::OutOfOrder { expected: 2 })))
        ));
        assert!(
            core.handle_command(following(2, 0), 2).is_none(),
            "no predecessor"
        );
        assert!(
            core.handle_command(following(5, 2), 3).is_none(),
            "2 is decided"
        );
        assert_eq!(done(&commit(&mut core, &mut stream)), [(2, 1), (3, 2)]);
        assert_eq!(core.stats().refused, 1);
    }

    #[test]
    fn a_delivery_without_events_still_stores_its_mark_and_a_stale_one_is_refused() {
        let mut stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        core.handle_command(delivered(Op::Get, 1, 1), 1);
        core.handle_command(delivered(Op::Add(1), 5, 5), 2); // the producer settled 2..=4
        assert_eq!(done(&commit(&mut core, &mut stream)), [(1, 0), (2, 1)]);
        let stale = core.handle_command(delivered(Op::Add(1), 3, 3), 3);
        assert!(matches!(stale, Some((3, Err(CommandError::Stale)))));
        let duplicate = core.handle_command(delivered(Op::Get, 5, 5), 4);
        assert!(
            matches!(duplicate, Some((4, Ok(Outcome::AlreadyProcessed)))),
            "mark stored"
        );
        // Seq 1 was processed, but is below the window start now: stale like 3, not re-run.
        let below = core.handle_command(delivered(Op::Get, 1, 1), 5);
        assert!(matches!(below, Some((5, Err(CommandError::Stale)))));
        assert_eq!(core.stats().stale, 2);
    }

    #[test]
    fn a_rejection_stores_nothing_and_waits_for_what_was_decided_before() {
        let mut stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        core.handle_command(plain(Op::Add(1)), 1);
        assert!(core
            .handle_command(delivered(Op::Add(-1), 1, 1), 2)
            .is_none());
        let answers = commit(&mut core, &mut stream);
        assert!(matches!(&answers[1], (2, Err(CommandError::Rejected(r))) if r == "negative: -1"));
        assert_eq!(stream.entries.len(), 1);
        // The delivery was not processed: a retransmission is decided again.
        core.handle_command(delivered(Op::Add(-1), 1, 1), 3);
        assert_eq!(core.stats().rejected, 2);
    }

    #[test]
    fn a_conflict_catches_up_and_decides_again_so_the_other_writers_delivery_is_a_duplicate() {
        let config = PersistentConfig::default();
        let mut stream = Stream::default();
        let mut ours = ready(&stream, config.clone());
        let mut theirs = ready(&stream, config.clone());
        // Both instances get the same delivery; theirs stores it first.
        theirs.handle_command(delivered(Op::Add(7), 1, 1), 10);
        commit(&mut theirs, &mut stream);
        ours.handle_command(delivered(Op::Add(7), 1, 1), 1);
        ours.handle_command(plain(Op::Add(1)), 2);
        let append = ours.poll_append().unwrap();
        assert_eq!(append.first_seq, 1, "ours does not know about theirs yet");
        let conflict = JournalError::Conflict {
            persistence_id: id(),
            first_seq: 1,
            highest_seq: 1,
        };
        assert!(matches!(
            ours.handle_append_failed(conflict),
            Failure::CatchUp
        ));
        assert!(
            ours.handle_command(plain(Op::Get), 3).is_none(),
            "waits for the catch-up"
        );
        let at_once = ours.finish_recovery(stream.recover(&config).unwrap());
        assert!(
            matches!(at_once[..], [(1, Ok(Outcome::AlreadyProcessed))]),
            "their mark is durable: answered at once"
        );
        assert_eq!(done(&commit(&mut ours, &mut stream)), [(2, 8), (3, 8)]);
        let recovered = stream.recover(&config).unwrap().state;
        assert_eq!((recovered.total, recovered.adds), (8, 2), "7 once, then 1");
        assert_eq!(ours.stats().conflicts, 1);
    }

    #[test]
    fn an_idle_core_behind_the_journal_catches_up_a_busy_or_current_one_does_not() {
        let config = PersistentConfig::default();
        let mut stream = Stream::default();
        let mut ours = ready(&stream, config.clone());
        let mut theirs = ready(&stream, config.clone());
        theirs.handle_command(plain(Op::Add(5)), 1);
        commit(&mut theirs, &mut stream);
        assert!(!ours.catch_up_if_behind(0), "not behind");
        ours.handle_command(plain(Op::Add(1)), 2);
        assert!(
            !ours.catch_up_if_behind(1),
            "busy: its append will conflict"
        );
        let _ = ours.stop();
        let mut ours = ready(&Stream::default(), config.clone());
        assert!(ours.catch_up_if_behind(1));
        assert!(ours.handle_command(plain(Op::Get), 3).is_none(), "waits");
        let answers = ours.finish_recovery(stream.recover(&config).unwrap());
        assert!(
            matches!(answers[..], [(3, Ok(Outcome::Done(5)))]),
            "{answers:?}"
        );
        assert_eq!(ours.stats().catch_ups, 1);
    }

    #[test]
    fn snapshots_bound_recovery_and_recover_the_same_state_and_record() {
        let config = PersistentConfig {
            snapshot_every: Some(3),
            ..Default::default()
        };
        let mut stream = Stream::default();
        let mut core = ready(&stream, config.clone());
        let mut snapshots = 0;
        for seq in 1..=10u64 {
            core.handle_command(delivered(Op::Add(seq as i64), seq, 1), seq as u32);
            let append = core.poll_append().unwrap();
            stream.append(append);
            if let Some(snapshot) = core.handle_committed().snapshot {
                assert_eq!(snapshot.seq, seq, "as of the committed entry");
                stream.snapshot = Some(snapshot);
                snapshots += 1;
            }
        }
        assert_eq!(snapshots, 3, "after events 3, 6 and 9");
        stream.deleted_to = 9; // delete_events_on_snapshot
        let mut recovered = ready(&stream, config.clone());
        assert_eq!(recovered.stats().recoveries, 1);
        let full = Stream {
            entries: stream.entries.clone(),
            ..Default::default()
        };
        let replayed = full.recover(&config).unwrap().state;
        assert_eq!(stream.recover(&config).unwrap().state, replayed);
        assert_eq!(replayed.total, 55);
        // The record came back with the snapshot: every delivery is a duplicate.
        let again = recovered.handle_command(delivered(Op::Add(1), 4, 1), 99);
        assert!(matches!(again, Some((99, Ok(Outcome::AlreadyProcessed)))));
    }

    #[test]
    fn a_snapshot_too_large_to_encode_is_counted_and_tried_again_only_an_interval_later() {
        let config = PersistentConfig {
            snapshot_every: Some(3),
            max_snapshot_bytes: 1,
            ..Default::default()
        };
        let mut stream = Stream::default();
        let mut core = ready(&stream, config);
        let mut failed = Vec::new();
        for seq in 1..=10u64 {
            core.handle_command(plain(Op::Add(1)), seq as u32);
            let append = core.poll_append().unwrap();
            if let Some(error) = &append.snapshot_error {
                assert_eq!(*error, CodecError::TooLarge { limit: 1 });
                failed.push(seq);
            }
            stream.append(append);
            assert!(core.handle_committed().snapshot.is_none());
        }
        assert_eq!(
            failed,
            [3, 6, 9],
            "once per interval, not with every append"
        );
        let stats = core.stats();
        assert_eq!((stats.snapshots, stats.snapshot_failures), (0, 3));
        core.handle_snapshot_failed(); // the shell: the journal did not save one
        assert_eq!(core.stats().snapshot_failures, 4);
    }

    #[test]
    fn an_unreadable_snapshot_falls_back_to_full_replay_unless_events_were_deleted() {
        let config = PersistentConfig::default();
        let mut stream = Stream::default();
        let mut core = ready(&stream, config.clone());
        core.handle_command(plain(Op::Add(4)), 1);
        commit(&mut core, &mut stream);
        stream.snapshot = Some(Snapshot::new(1, vec![9, 9, 9]));
        assert_eq!(
            stream.recover(&config).unwrap().state.total,
            4,
            "replayed instead"
        );
        stream.deleted_to = 1;
        let error = stream.recover(&config).err().expect("cannot recover");
        assert!(
            matches!(&error, JournalError::Corrupt { seq: 1, .. }),
            "{error}"
        );
    }

    #[test]
    fn an_undecodable_entry_stops_recovery_naming_stream_and_seq() {
        let config = PersistentConfig::default();
        let mut stream = Stream::default();
        let mut core = ready(&stream, config.clone());
        core.handle_command(plain(Op::Add(1)), 1);
        commit(&mut core, &mut stream);
        stream
            .entries
            .push((vec![1, 0xff, 0xff], Manifest::legacy()));
        let error = stream.recover(&config).err().expect("corrupt");
        assert!(
            matches!(&error, JournalError::Corrupt { seq: 2, .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains("stream `counter`, seq 2"),
            "{error}"
        );
        let mut waiting = Core::new(id(), config, Instant::now());
        waiting.handle_command(plain(Op::Get), 7);
        let answers = waiting.fail_recovery(&error);
        assert!(matches!(answers[..], [(7, Err(CommandError::Recovery(_)))]));
    }

    #[test]
    fn stopping_answers_everything_that_waits_in_doubt_only_when_its_append_is_in_flight() {
        let stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        core.handle_command(plain(Op::Add(1)), 1);
        core.poll_append();
        core.handle_command(plain(Op::Add(1)), 2);
        let answers = core.stop();
        assert_eq!(answers.iter().map(|(t, _)| *t).collect::<Vec<_>>(), [1, 2]);
        assert!(
            matches!(answers[0].1, Err(CommandError::InDoubt)),
            "in flight"
        );
        assert!(
            matches!(answers[1].1, Err(CommandError::Stopped)),
            "never appended"
        );
    }

    #[test]
    fn a_confirmation_waiting_for_its_record_keeps_the_core_busy() {
        let stream = Stream::default();
        let mut core = ready(&stream, PersistentConfig::default());
        assert!(core.is_idle());
        core.handle_confirmed("shipping", 1);
        assert!(!core.is_idle(), "the record is still to be appended");
    }
}
