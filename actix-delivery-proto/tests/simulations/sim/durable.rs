//! The simulated durable storage: per durable producer, or per outbox entity (whose lanes
//! share it), a journal that commits one write at a time, each a seeded latency after it
//! starts (or after the write before it committed), and the shell's memory: what waits to be
//! stored or recorded, what is stored and not durably settled, what was resumed. A crash
//! loses everything not committed: the memory, the writes in flight and the messages waiting
//! for a store.
//!
//! Pure bookkeeping, written after the shells (`src/durable/producer.rs` and
//! `src/persistence/{outbox,outbox_state,core}.rs`); the driver (`driver::durable_side`)
//! feeds it what the cores settle and hands the cores what it commits, when the shells do.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use actix_delivery_proto::protocol::envelope::Incarnation;

use super::scenario::{CapRule, CrashMoment};

/// A message body (see `driver::Body`).
type Body = u64;

/// What a unit of durable storage serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitKind {
    /// One durable producer: a store per burst of messages and a settlement record per batch
    /// of settlements, at most one of each in flight.
    Producer,
    /// A persistent entity's outbox, one lane per destination: one append in flight, carrying
    /// the deliveries decided and the confirmations settled since the previous one.
    Outbox,
}

/// A write issued to a journal and not committed yet.
#[derive(Clone, Debug)]
pub struct Write {
    /// The messages it stores: (lane, seq, body).
    pub stored: Vec<(usize, u64, Body)>,
    /// The settlements it records: (lane, seq, body).
    pub settled: Vec<(usize, u64, Body)>,
    /// When it commits.
    pub commits_at: Duration,
}

impl Write {
    /// Whether a crash during this write is a crash at `moment`.
    pub fn is(&self, moment: CrashMoment) -> bool {
        match moment {
            CrashMoment::Anytime => true,
            CrashMoment::MidStore => !self.stored.is_empty(),
            CrashMoment::MidRecord => !self.settled.is_empty(),
        }
    }
}

/// What a committed write changed.
#[derive(Debug, Default)]
pub struct Committed {
    /// Messages now stored, in seq order per lane: (lane, seq, body). They go to the lanes'
    /// cores now.
    pub stored: Vec<(usize, u64, Body)>,
    /// Settlements now recorded: (lane, seq, body, whether it was resumed after a restart, so
    /// that its confirmation goes to the sink).
    pub settled: Vec<(usize, u64, Body, bool)>,
}

/// What a crash lost.
#[derive(Debug, Default)]
pub struct Loss {
    /// Messages whose store had not committed (waiting for it, or in a write in flight):
    /// never stored (their senders got an error).
    pub never_stored: Vec<(usize, Body)>,
    /// Messages the cores had settled whose record had not committed: still unsettled in the
    /// journal, so the restarted lane sends them again. (lane, seq, body).
    pub unrecorded: Vec<(usize, u64, Body)>,
    /// A store was in flight.
    pub mid_store: bool,
    /// A settlement record was in flight.
    pub mid_record: bool,
}

/// What the journal holds for one lane (committed writes only).
#[derive(Clone, Debug)]
struct Journaled {
    /// The seq the next stored message gets.
    next_seq: u64,
    /// Stored and not settled.
    unsettled: BTreeMap<u64, Body>,
}

/// What the shell holds in memory for one lane (lost in a crash).
#[derive(Clone, Debug, Default)]
struct Memory {
    /// The seq the next message gets: messages are numbered when their store starts (durable
    /// producer) or when they are decided (outbox), before they are committed.
    next_seq: u64,
    /// Durable producer: handed over, waiting for a store.
    to_store: Vec<Body>,
    /// Durable producer: stored, settlement not recorded (the shell's `unsettled`). Outbox:
    /// decided, confirmation not in an append yet (the outbox state's `unconfirmed`,
    /// uncommitted deliveries included).
    unsettled: BTreeSet<u64>,
    /// Outbox: confirmations in the append in flight (the outbox state's `recording`).
    recording: BTreeSet<u64>,
    /// Settled by the core, waiting for the next record (durable producer) or append
    /// (outbox): (seq, body).
    to_record: Vec<(u64, Body)>,
    /// Resumed after the latest restart and not durably settled yet: their confirmations go to
    /// the sink.
    resumed: BTreeSet<u64>,
}

impl Memory {
    fn new(next_seq: u64) -> Self {
        Self {
            next_seq,
            ..Self::default()
        }
    }
}

/// The durable storage of one durable producer or one outbox entity.
#[derive(Debug)]
pub struct Unit {
    /// What it serves.
    pub kind: UnitKind,
    /// The producers (lanes) it serves, by index: lane `i` is producer `lanes[i]`.
    pub lanes: Vec<usize>,
    /// The incarnation every lane sends under, kept across crashes.
    pub incarnation: Incarnation,
    /// Whether anything was ever committed (an outbox records its incarnation with its first
    /// delivery: before that, a restart draws a new one).
    pub committed_any: bool,
    /// Crashes so far: the life of the shell's memory.
    pub life: u32,
    /// While crashed: when it restarts.
    pub down_until: Option<Duration>,
    /// Crashes triggered for `MidStore` or `MidRecord`, waiting for such a write to start.
    pub armed: Vec<(usize, CrashMoment)>,
    /// The shell's one timer: the earliest deadline armed and not fired (arming a later one
    /// leaves it; nothing disarms it), as `src/alarm.rs` does.
    pub alarm: Option<Duration>,
    journal: Vec<Journaled>,
    writes: VecDeque<Write>,
    memory: Vec<Memory>,
    /// Outbox: deliveries decided since the latest append: (lane, seq, body).
    decided: Vec<(usize, u64, Body)>,
}

impl Unit {
    /// Fresh storage for `lanes`, whose stream is created with `incarnation`.
    pub fn new(kind: UnitKind, lanes: Vec<usize>, incarnation: Incarnation) -> Self {
        let count = lanes.len();
        Self {
            kind,
            lanes,
            incarnation,
            committed_any: false,
            life: 0,
            down_until: None,
            armed: Vec::new(),
            alarm: None,
            journal: vec![
                Journaled {
                    next_seq: 1,
                    unsettled: BTreeMap::new(),
                };
                count
            ],
            writes: VecDeque::new(),
            memory: vec![Memory::new(1); count],
            decided: Vec::new(),
        }
    }

    /// A message is handed over (durable producer: it waits for a store) or decided (outbox:
    /// numbered now, appended with the next append).
    pub fn offer(&mut self, lane: usize, body: Body) {
        let memory = &mut self.memory[lane];
        match self.kind {
            UnitKind::Producer => memory.to_store.push(body),
            UnitKind::Outbox => {
                let seq = memory.next_seq;
                memory.next_seq += 1;
                memory.unsettled.insert(seq);
                self.decided.push((lane, seq, body));
            }
        }
    }

    /// The core settled stored message `seq`: its record goes with the next record or append.
    pub fn settled(&mut self, lane: usize, seq: u64, body: Body) {
        self.memory[lane].to_record.push((seq, body));
    }

    /// Starts the writes that are due, as the shells do: a durable producer starts a store if
    /// none is in flight and messages wait, and a record likewise; an outbox starts an append
    /// if none is in flight and anything was decided or settled. Each commits one drawn
    /// latency after it starts or after the write before it commits, whichever is later.
    /// Returns the writes started.
    pub fn start_writes(
        &mut self,
        now: Duration,
        mut latency: impl FnMut() -> Duration,
    ) -> Vec<Write> {
        let mut started: Vec<(Vec<_>, Vec<_>)> = Vec::new();
        match self.kind {
            UnitKind::Producer => {
                let memory = &mut self.memory[0];
                if !self.writes.iter().any(|w| !w.stored.is_empty()) && !memory.to_store.is_empty()
                {
                    let first_seq = memory.next_seq;
                    memory.next_seq += memory.to_store.len() as u64;
                    let stored = (first_seq..).zip(memory.to_store.drain(..));
                    started.push((stored.map(|(seq, body)| (0, seq, body)).collect(), vec![]));
                }
                if !self.writes.iter().any(|w| !w.settled.is_empty())
                    && !memory.to_record.is_empty()
                {
                    let settled = memory.to_record.drain(..);
                    started.push((vec![], settled.map(|(seq, body)| (0, seq, body)).collect()));
                }
            }
            UnitKind::Outbox => {
                let any_settled = self.memory.iter().any(|m| !m.to_record.is_empty());
                if self.writes.is_empty() && (!self.decided.is_empty() || any_settled) {
                    let mut settled = Vec::new();
                    for (lane, memory) in self.memory.iter_mut().enumerate() {
                        for (seq, body) in memory.to_record.drain(..) {
                            memory.unsettled.remove(&seq);
                            memory.recording.insert(seq);
                            settled.push((lane, seq, body));
                        }
                    }
                    started.push((std::mem::take(&mut self.decided), settled));
                }
            }
        }
        let count = started.len();
        for (stored, settled) in started {
            let after = self.writes.back().map_or(now, |w| w.commits_at.max(now));
            self.writes.push_back(Write {
                stored,
                settled,
                commits_at: after + latency(),
            });
        }
        self.writes
            .range(self.writes.len() - count..)
            .cloned()
            .collect()
    }

    /// The oldest write in flight commits.
    ///
    /// # Panics
    /// If none is in flight.
    pub fn commit(&mut self) -> Committed {
        let write = self.writes.pop_front().expect("a write is in flight");
        let mut committed = Committed::default();
        for &(lane, seq, body) in &write.stored {
            let journal = &mut self.journal[lane];
            journal.unsettled.insert(seq, body);
            journal.next_seq = journal.next_seq.max(seq + 1);
            if self.kind == UnitKind::Producer {
                self.memory[lane].unsettled.insert(seq);
            }
            self.committed_any = true;
            committed.stored.push((lane, seq, body));
        }
        for &(lane, seq, body) in &write.settled {
            self.journal[lane].unsettled.remove(&seq);
            let memory = &mut self.memory[lane];
            match self.kind {
                UnitKind::Producer => memory.unsettled.remove(&seq),
                UnitKind::Outbox => memory.recording.remove(&seq),
            };
            let resumed = memory.resumed.remove(&seq);
            committed.settled.push((lane, seq, body, resumed));
        }
        committed
    }

    /// The `window_start` cap the shell sets for `lane`: a durable producer's after a record
    /// commits (per `rule`), an outbox lane's after every flush (the lowest seq decided and not
    /// confirmed, or confirmed in an append not committed yet).
    pub fn cap(&self, lane: usize, rule: CapRule) -> u64 {
        let memory = &self.memory[lane];
        let first = |set: &BTreeSet<u64>| set.first().copied().unwrap_or(memory.next_seq);
        match self.kind {
            UnitKind::Producer => {
                let shipped = first(&memory.unsettled);
                match rule {
                    CapRule::AsShipped => shipped,
                    CapRule::LowestNotDurablySettled => shipped.min(self.first_unstored(lane)),
                }
            }
            UnitKind::Outbox => first(&memory.unsettled).min(first(&memory.recording)),
        }
    }

    /// The first seq of `lane` in a store in flight or decided for the next append (else
    /// `u64::MAX`).
    fn first_unstored(&self, lane: usize) -> u64 {
        let in_flight = self.writes.iter().flat_map(|w| &w.stored);
        in_flight
            .chain(&self.decided)
            .filter(|&&(l, _, _)| l == lane)
            .map(|&(_, seq, _)| seq)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The lowest seq of `lane` not durably settled: stored and unsettled in the journal, in a
    /// store not committed yet, or not numbered yet. No `window_start` may pass it: a consumer
    /// that lives through a crash would refuse the resends below it as stale.
    pub fn lowest_not_durably_settled(&self, lane: usize) -> u64 {
        let journaled = self.journal[lane].unsettled.keys().next().copied();
        journaled
            .unwrap_or(u64::MAX)
            .min(self.first_unstored(lane))
            .min(self.memory[lane].next_seq)
    }

    /// When the earliest write in flight that a crash at `moment` would hit commits.
    pub fn in_flight(&self, moment: CrashMoment) -> Option<Duration> {
        self.writes
            .iter()
            .find(|w| w.is(moment))
            .map(|w| w.commits_at)
    }

    /// The process crashes: everything not committed is lost.
    pub fn crash(&mut self) -> Loss {
        let mut loss = Loss {
            mid_store: self.in_flight(CrashMoment::MidStore).is_some(),
            mid_record: self.in_flight(CrashMoment::MidRecord).is_some(),
            ..Loss::default()
        };
        for write in self.writes.drain(..) {
            let stored = write.stored.into_iter().map(|(lane, _, body)| (lane, body));
            loss.never_stored.extend(stored);
            loss.unrecorded.extend(write.settled);
        }
        loss.never_stored
            .extend(self.decided.drain(..).map(|(lane, _, body)| (lane, body)));
        for (lane, memory) in self.memory.iter_mut().enumerate() {
            loss.never_stored
                .extend(memory.to_store.drain(..).map(|body| (lane, body)));
            let unrecorded = memory.to_record.drain(..);
            loss.unrecorded
                .extend(unrecorded.map(|(seq, body)| (lane, seq, body)));
            *memory = Memory::default();
        }
        self.alarm = None;
        self.life += 1;
        loss
    }

    /// The restarted process recovers: per lane, the next seq and the stored unsettled
    /// messages (ascending), which it resumes.
    pub fn resume(&mut self) -> Vec<(u64, Vec<(u64, Body)>)> {
        self.down_until = None;
        let mut lanes = Vec::with_capacity(self.journal.len());
        for (journal, memory) in self.journal.iter().zip(&mut self.memory) {
            let resumed: Vec<(u64, Body)> =
                journal.unsettled.iter().map(|(&s, &b)| (s, b)).collect();
            *memory = Memory::new(journal.next_seq);
            memory.unsettled = journal.unsettled.keys().copied().collect();
            memory.resumed = memory.unsettled.clone();
            lanes.push((journal.next_seq, resumed));
        }
        lanes
    }

    /// Whether nothing waits to be stored, recorded or committed.
    pub fn is_idle(&self) -> bool {
        self.writes.is_empty()
            && self.decided.is_empty()
            && self
                .memory
                .iter()
                .all(|m| m.to_store.is_empty() && m.to_record.is_empty())
    }

    /// How many stored messages the journal holds unsettled.
    pub fn journaled_unsettled(&self) -> usize {
        self.journal.iter().map(|j| j.unsettled.len()).sum()
    }

    /// Arms the shell's timer for `deadline` (a later deadline than the armed one leaves it).
    pub fn arm(&mut self, deadline: Option<Duration>) {
        if let Some(deadline) = deadline
            && self.alarm.is_none_or(|armed| deadline < armed)
        {
            self.alarm = Some(deadline);
        }
    }
}
