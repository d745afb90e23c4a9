//! The trace of a run: a hash of every event (to prove that a seed replays identically) and
//! the last few events (to show what led to a failure).

use std::collections::VecDeque;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use super::stable_hash::StableHasher;

/// How many of the latest events a trace keeps for failure messages, unless the environment
/// variable `SIM_TRACE_TAIL` says otherwise (set it high to see a whole replayed run).
const TAIL: usize = 40;

/// Something that happened in a run. Producers are named by index, incarnations by their
/// lowest 16 bits (enough to tell them apart in a tail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceEvent {
    /// The simulator offered a message to a producer.
    Offered { producer: usize, body: u64 },
    /// A producer put a delivery on the forward link, which made `copies` of it arrive.
    Transmitted {
        producer: usize,
        incarnation: u16,
        seq: u64,
        window_start: u64,
        copies: usize,
    },
    /// A delivery (`forged`, or sent by the producer) reached the consumer, which decided
    /// `step`.
    Arrived {
        producer: usize,
        incarnation: u16,
        seq: u64,
        forged: bool,
        step: &'static str,
    },
    /// A forger injected `burst` deliveries speaking for a producer, from `seq` on.
    Forged {
        producer: usize,
        incarnation: u16,
        seq: u64,
        burst: u64,
    },
    /// The consumer started the handler.
    HandlerStarted {
        producer: usize,
        incarnation: u16,
        seq: u64,
        body: u64,
    },
    /// A handler run ended (`current`: false for a run the consumer abandoned, by a restart
    /// or `handler_timeout`).
    HandlerEnded {
        producer: usize,
        seq: u64,
        succeeded: bool,
        current: bool,
    },
    /// The consumer sent an ACK on the backward link, which made `copies` of it arrive.
    AckSent {
        producer: usize,
        seq: u64,
        copies: usize,
    },
    /// An ACK reached its producer.
    AckArrived {
        producer: usize,
        seq: u64,
        acted_on: bool,
    },
    /// A producer settled a message.
    Settled {
        producer: usize,
        body: u64,
        result: &'static str,
    },
    /// A producer's retransmission deadline fired.
    ProducerTimer { producer: usize },
    /// The consumer's deadline (idle sweep, handler timeout) fired.
    ConsumerTimer { swept: usize },
    /// A producer restarted with a new incarnation.
    ProducerRestarted { producer: usize, incarnation: u16 },
    /// The consumer restarted.
    ConsumerRestarted,
    /// A durable unit started a write that stores `stored` messages and records `recorded`
    /// settlements; it commits at `commits_at`.
    WriteStarted {
        unit: usize,
        stored: usize,
        recorded: usize,
        commits_at: Duration,
    },
    /// A durable unit's oldest write committed.
    Committed {
        unit: usize,
        stored: usize,
        recorded: usize,
    },
    /// A durable unit crashed, with a store and/or a record in flight: `never_stored` messages
    /// lost before their store committed, `unrecorded` settlements before their record.
    Crashed {
        unit: usize,
        mid_store: bool,
        mid_record: bool,
        never_stored: usize,
        unrecorded: usize,
    },
    /// A durable unit restarted, resuming `resumed` stored messages (`incarnation`: of its
    /// lanes, kept unless nothing was ever committed).
    Resumed {
        unit: usize,
        incarnation: u16,
        resumed: usize,
    },
    /// A durable unit's shell timer fired.
    UnitTimer { unit: usize },
}

/// The hash and tail of a run's events.
#[derive(Clone, Debug)]
pub struct Trace {
    hash: u64,
    events: u64,
    tail: VecDeque<(Duration, TraceEvent)>,
    tail_len: usize,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        let tail_len = std::env::var("SIM_TRACE_TAIL")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(TAIL);
        Self {
            hash: StableHasher::default().finish(),
            events: 0,
            tail: VecDeque::with_capacity(tail_len.min(TAIL)),
            tail_len,
        }
    }

    /// Records `event` at `at` (time since the start of the run).
    pub fn record(&mut self, at: Duration, event: TraceEvent) {
        let mut hasher = StableHasher::resume(self.hash);
        (at, event).hash(&mut hasher);
        self.hash = hasher.finish();
        self.events += 1;
        if self.tail.len() == self.tail_len {
            self.tail.pop_front();
        }
        self.tail.push_back((at, event));
    }

    /// A digest of every event so far, in order.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// How many events were recorded.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The latest events, oldest first.
    pub fn tail(&self) -> impl Iterator<Item = &(Duration, TraceEvent)> {
        self.tail.iter()
    }
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Offered { producer, body } => write!(f, "p{producer} offered body {body:#x}"),
            Self::Transmitted {
                producer,
                incarnation,
                seq,
                window_start,
                copies,
            } => write!(
                f,
                "p{producer}/{incarnation:04x} seq {seq} (window_start {window_start}) \
                 transmitted, {copies} cop{} arrive",
                if copies == 1 { "y" } else { "ies" }
            ),
            Self::Arrived {
                producer,
                incarnation,
                seq,
                forged,
                step,
            } => write!(
                f,
                "{}p{producer}/{incarnation:04x} seq {seq} arrived: {step}",
                if forged { "FORGED " } else { "" }
            ),
            Self::Forged {
                producer,
                incarnation,
                seq,
                burst,
            } => write!(
                f,
                "forger injects {burst} deliveries as p{producer}/{incarnation:04x} from seq \
                 {seq} (window_start = seq)"
            ),
            Self::HandlerStarted {
                producer,
                incarnation,
                seq,
                body,
            } => write!(
                f,
                "handler started for p{producer}/{incarnation:04x} seq {seq} (body {body:#x})"
            ),
            Self::HandlerEnded {
                producer,
                seq,
                succeeded,
                current,
            } => write!(
                f,
                "handler for p{producer} seq {seq} {}{}",
                if succeeded { "succeeded" } else { "failed" },
                if current { "" } else { " (abandoned: ignored)" }
            ),
            Self::AckSent {
                producer,
                seq,
                copies,
            } => write!(f, "ACK p{producer} seq {seq} sent, {copies} arrive"),
            Self::AckArrived {
                producer,
                seq,
                acted_on,
            } => write!(
                f,
                "ACK p{producer} seq {seq} arrived ({})",
                if acted_on { "confirmed" } else { "ignored" }
            ),
            Self::Settled {
                producer,
                body,
                result,
            } => write!(f, "p{producer} settled body {body:#x}: {result}"),
            Self::ProducerTimer { producer } => write!(f, "p{producer} retransmission timer"),
            Self::ConsumerTimer { swept } => write!(f, "consumer timer: {swept} swept"),
            Self::ProducerRestarted {
                producer,
                incarnation,
            } => write!(f, "p{producer} restarted as incarnation {incarnation:04x}"),
            Self::ConsumerRestarted => f.write_str("consumer restarted (dedup state lost)"),
            Self::WriteStarted {
                unit,
                stored,
                recorded,
                commits_at,
            } => write!(
                f,
                "unit {unit} starts a write: {stored} stored, {recorded} recorded, commits at \
                 {:.6}s",
                commits_at.as_secs_f64()
            ),
            Self::Committed {
                unit,
                stored,
                recorded,
            } => write!(
                f,
                "unit {unit} committed: {stored} stored, {recorded} recorded"
            ),
            Self::Crashed {
                unit,
                mid_store,
                mid_record,
                never_stored,
                unrecorded,
            } => write!(
                f,
                "unit {unit} CRASHED (store in flight: {mid_store}, record in flight: \
                 {mid_record}): {never_stored} never stored, {unrecorded} settlements unrecorded"
            ),
            Self::Resumed {
                unit,
                incarnation,
                resumed,
            } => write!(
                f,
                "unit {unit} restarted as {incarnation:04x}, resuming {resumed} stored messages"
            ),
            Self::UnitTimer { unit } => write!(f, "unit {unit} shell timer"),
        }
    }
}
