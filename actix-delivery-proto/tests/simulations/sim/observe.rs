//! What the simulator saw happen, from the outside of the cores: per message, which handler
//! runs succeeded and when it was confirmed; per body, how it was settled; per forged message,
//! how often it ran; and the violations (of named rules) that can only be seen while the run is
//! going on.

use super::stable_hash::StableMap;

/// The identity of a message on the wire: producer (by index), incarnation and seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    /// Index of the producer (`p0`, `p1`, …).
    pub producer: usize,
    /// The producer's incarnation when it sent the message.
    pub incarnation: u128,
    /// The message's seq within that incarnation.
    pub seq: u64,
}

/// A handler run that succeeded.
#[derive(Clone, Copy, Debug)]
pub struct Success {
    /// The simulation step it completed in (steps order everything, even at equal times).
    pub step: u64,
    /// The consumer life (0, then +1 per consumer restart) it ran in.
    pub life: u32,
    /// How often the consumer had seen the producer switch incarnations when the run
    /// started (each switch replaces the producer's dedup window).
    pub switches_at_start: u64,
}

/// Everything observed about one message key.
#[derive(Debug)]
pub struct KeyRecord {
    /// The body the producer transmitted under this key.
    pub body: u64,
    /// Successful handler runs, in order.
    pub successes: Vec<Success>,
    /// Per consumer life in which a copy arrived: the producer's incarnation switches seen
    /// when the first copy arrived in that life.
    pub first_arrivals: Vec<(u32, u64)>,
    /// The step in which the producer confirmed the key `Ok`.
    pub confirmed_at: Option<u64>,
    /// Copies of the delivery on the forward link right now.
    pub in_transit: u32,
    /// Copies that reached the consumer.
    pub arrivals: u32,
    /// Copies that reached the consumer at or below the floor the simulator predicts for
    /// their window (stale: they must be held).
    pub stale_arrivals: u32,
    /// Handler runs started for the key (any outcome).
    pub runs: u32,
}

impl KeyRecord {
    /// A key first transmitted with `body`.
    pub fn new(body: u64) -> Self {
        Self {
            body,
            successes: Vec::new(),
            first_arrivals: Vec::new(),
            confirmed_at: None,
            in_transit: 0,
            arrivals: 0,
            stale_arrivals: 0,
            runs: 0,
        }
    }
}

/// Everything observed about one forged message key (see `Forgery`).
#[derive(Debug)]
pub struct ForgedRecord {
    /// The forged body (distinct from every real body).
    pub body: u64,
    /// Handler runs started for it (any outcome).
    pub runs: u32,
    /// The consumer life of each successful run.
    pub successes: Vec<u32>,
}

/// How one body (one message of the user's) ended up.
#[derive(Clone, Copy, Debug, Default)]
pub struct BodyRecord {
    /// Producer that sent it.
    pub producer: usize,
    /// Confirmations with `Ok`.
    pub ok: u32,
    /// Settlements as stopped (each followed by a re-send).
    pub stopped: u32,
    /// Settlements with `GaveUp`.
    pub gave_up: u32,
    /// Any other settlement (a bug: e.g. `QueueFull`).
    pub other: u32,
    /// Successful handler runs, under any key.
    pub successes: u32,
    /// Settlements `Ok` by a core (for a durable producer these are in memory: their record
    /// may be lost in a crash, and the message settled again after the restart).
    pub acked: u32,
    /// Times a producer transmitted it (first transmissions and retransmissions).
    pub transmissions: u32,
    /// `transmissions` when it was last handed to a producer core as a new message.
    pub transmissions_before: u32,
    /// Durable: confirmations `Ok` that went to the sink (the message was resumed after a
    /// restart; `ok` counts those that reached the callback of the life that stored it).
    pub sink: u32,
    /// Durable: the seq its store committed under, and the life of its storage then.
    pub stored: Option<(u64, u32)>,
    /// Durable: its store had not committed when its producer crashed (never stored: the
    /// sender got an error). Final.
    pub never_stored: u32,
    /// Durable: times it was resumed by a restarted producer.
    pub resumed: u32,
    /// Durable: the life of its storage when its confirmation fired.
    pub confirmed_life: Option<u32>,
}

impl BodyRecord {
    /// Final settlements (re-sent stopped ones are not final; a durable message's
    /// loss with an uncommitted store is).
    pub fn finals(&self) -> u32 {
        self.ok + self.sink + self.gave_up + self.other + self.never_stored
    }
}

/// The state of the world when the consumer restarted.
#[derive(Debug)]
pub struct ConsumerRestartRecord {
    /// The step of the restart.
    pub step: u64,
    /// Keys with a copy on the forward link at that moment.
    pub in_transit: Vec<Key>,
}

/// Everything the simulator observed in a run.
#[derive(Debug, Default)]
pub struct Observations {
    /// Per message key.
    pub keys: StableMap<Key, KeyRecord>,
    /// Per body.
    pub bodies: StableMap<u64, BodyRecord>,
    /// Per forged message key.
    pub forged: StableMap<Key, ForgedRecord>,
    /// Forgeries that happened.
    pub forgeries: usize,
    /// Forged copies that reached the consumer.
    pub forged_arrivals: u64,
    /// Arrivals (real or forged) at or below their window's predicted floor.
    pub predicted_stale: u64,
    /// Handler runs whose drawn duration exceeds `handler_timeout`.
    pub overdue_runs: u64,
    /// Of those, the runs a consumer restart cut short before their deadline fired.
    pub overdue_cut_by_restart: u64,
    /// Slow handler runs (see `HandlerFaults::slow`) that ended as the current run.
    pub slow_completed: u64,
    /// Consumer restarts, in order.
    pub consumer_restarts: Vec<ConsumerRestartRecord>,
    /// Producer restarts that happened.
    pub producer_restarts: usize,
    /// Handler runs that failed or panicked (of the current consumer life).
    pub handler_failures: u64,
    /// Handler runs cut short by a consumer restart or `handler_timeout` (counted when their
    /// ignored end arrives).
    pub abandoned_runs: u64,
    /// The messages whose runs the consumer abandoned after `handler_timeout`, in order.
    pub timed_out: Vec<Key>,
    /// Consumer decisions: re-ACKs of duplicates.
    pub re_acks: u64,
    /// Consumer decisions: deliveries held (in progress or refused).
    pub holds: u64,
    /// Durable crashes that happened.
    pub durable_crashes: usize,
    /// Of those, crashes while a store was in flight.
    pub crashes_mid_store: u64,
    /// Of those, crashes while a settlement record was in flight.
    pub crashes_mid_record: u64,
    /// Messages resumed by restarted durable producers.
    pub resumed: u64,
    /// Messages a core had settled whose record a crash lost (resumed after the restart).
    pub unrecorded_at_crash: u64,
    /// Arrivals of resends (a message transmitted by a later life of its storage than the one
    /// that stored it).
    pub resend_arrivals: u64,
    /// Of those, the ones the consumer recognised as duplicates and re-ACKed.
    pub resend_duplicates: u64,
    /// ACKs that reached a producer while it was crashed (lost with it).
    pub acks_while_down: u64,
    /// Settlement records started only by the shell's timer when it fired with nothing to
    /// retransmit (the settlement waited for a stale alarm: see `driver::durable_side`).
    pub records_by_stale_alarm: u64,
    /// Rule breaks seen during the run, with the rule's name (capped at
    /// [`Observations::MAX_VIOLATIONS`]).
    pub violations: Vec<(&'static str, String)>,
    /// Rule breaks beyond the cap.
    pub more_violations: usize,
}

impl Observations {
    /// Violations kept verbatim; further ones are only counted.
    pub const MAX_VIOLATIONS: usize = 60;

    /// Records a break of `rule` seen in `step`.
    pub fn violation(&mut self, rule: &'static str, step: u64, message: String) {
        if self.violations.len() < Self::MAX_VIOLATIONS {
            self.violations
                .push((rule, format!("step {step}: {message}")));
        } else {
            self.more_violations += 1;
        }
    }
}
