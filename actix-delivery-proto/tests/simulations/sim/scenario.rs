//! The configuration of one simulation run. Everything that decides what happens is in a
//! [`Scenario`]: the seed, the settings of both cores, the producers' ids, the faults of both
//! links and of the handler, the traffic pattern, the disruptions, the forgeries and the
//! durable storage. A failing run prints it in full, so the run can be replayed exactly.

use std::ops::RangeInclusive;
use std::time::Duration;

use actix_delivery_proto::config::{ConsumerConfig, Limit, ProducerConfig};
use actix_delivery_proto::protocol::envelope::MAX_SEQ;

/// How many incarnation windows per producer id the consumer promises to keep (the core's
/// constant of that name, stated here rather than imported so that a core keeping fewer
/// fails the simulation instead of lowering its expectations).
pub const INCARNATIONS_KEPT_PER_ID: usize = 4;

/// An idle TTL at least this long never sweeps a window that is still needed in a simulation:
/// a producer with messages in flight retransmits far more often than this, and no copy spends
/// this long on a link.
const HARMLESS_IDLE_TTL: Duration = Duration::from_secs(60);

/// The faults of one direction of the network.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkFaults {
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a message that is not lost arrives twice.
    pub duplicate: f64,
    /// Each copy is delayed by a latency drawn uniformly from `min_latency..=max_latency`;
    /// copies of different (or the same) messages overtake each other when it varies.
    pub min_latency: Duration,
    /// See `min_latency`.
    pub max_latency: Duration,
}

impl LinkFaults {
    /// A link that loses and duplicates nothing, with the given latency range.
    pub fn reliable(min_latency: Duration, max_latency: Duration) -> Self {
        Self {
            drop: 0.0,
            duplicate: 0.0,
            min_latency,
            max_latency,
        }
    }
}

/// How long a stuck handler run takes: far beyond any `handler_timeout` a scenario configures
/// and any retransmission interval, so only the timeout ends it.
pub const STUCK_DURATION: Duration = Duration::from_secs(3_600);

/// How the user's handler behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct HandlerFaults {
    /// Probability that a handler run fails (a quarter of the failures are panics).
    pub failure: f64,
    /// A run takes a duration drawn uniformly from `0..=max_duration`, unless it is stuck or
    /// slow.
    pub max_duration: Duration,
    /// Probability that a run is stuck: it takes [`STUCK_DURATION`] (a lost reply, a deadlock).
    pub stuck: f64,
    /// Probability that a run (not stuck) is slow: it takes a duration drawn from `slow_range`
    /// (e.g. just under `handler_timeout`).
    pub slow: f64,
    /// See `slow`.
    pub slow_range: RangeInclusive<Duration>,
}

impl HandlerFaults {
    /// A handler that never fails and takes no time.
    pub const NONE: HandlerFaults = HandlerFaults {
        failure: 0.0,
        max_duration: Duration::ZERO,
        stuck: 0.0,
        slow: 0.0,
        slow_range: Duration::ZERO..=Duration::ZERO,
    };
}

/// How each producer's messages are offered to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    /// A producer's next message follows its previous one after a gap drawn uniformly from
    /// `0..=max_gap` (zero: the whole stream is offered at once).
    pub max_gap: Duration,
    /// Probability that a gap is followed by an idle `pause` (to let dedup windows expire).
    pub pause_probability: f64,
    /// See `pause_probability`.
    pub pause: Duration,
}

impl Traffic {
    /// Every message offered at time zero.
    pub const BURST: Traffic = Traffic {
        max_gap: Duration::ZERO,
        pause_probability: 0.0,
        pause: Duration::ZERO,
    };
}

/// A restart, triggered by progress so that it always happens mid-stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Disruption {
    /// `delay` after `producer` has had `after_confirmed` messages confirmed, it restarts with
    /// a new incarnation; the simulator re-sends its unconfirmed messages as new messages.
    ProducerRestart {
        /// Index of the producer.
        producer: usize,
        /// Confirmations (from 1) that trigger the restart.
        after_confirmed: usize,
        /// Time between the trigger and the restart.
        delay: Duration,
    },
    /// `delay` after the `after_handled`-th successful handler run, the consumer restarts: its
    /// dedup state, waiting messages and running handler are lost.
    ConsumerRestart {
        /// Successful handler runs (from 1) that trigger the restart.
        after_handled: usize,
        /// Time between the trigger and the restart.
        delay: Duration,
    },
    /// Once `producer` (durable) has been offered `after_offered` messages, its process
    /// crashes at `moment`: everything not committed to its journal is lost (the durable
    /// producer, or the whole outbox entity of the lane). It restarts `down` later, with the
    /// same incarnation and next seq, resuming its stored unsettled messages under their seqs.
    DurableCrash {
        /// Index of the producer (a lane: its entity crashes).
        producer: usize,
        /// Offers (from 1) that trigger the crash.
        after_offered: usize,
        /// When the crash strikes, once triggered.
        moment: CrashMoment,
        /// For [`CrashMoment::Anytime`]: time between the trigger and the crash.
        delay: Duration,
        /// Time between the crash and the restart (offers wait for it).
        down: Duration,
    },
}

/// When a durable crash ([`Disruption::DurableCrash`]) strikes, once triggered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrashMoment {
    /// `delay` after the trigger, whatever is in flight then.
    Anytime,
    /// At a random instant while a store (a write with messages or deliveries) is in flight,
    /// before it commits: the one in flight at the trigger, or the next one started.
    MidStore,
    /// At a random instant while a settlement record (a write with settlements or
    /// confirmations) is in flight, before it commits: the one in flight at the trigger, or
    /// the next one started.
    MidRecord,
}

impl CrashMoment {
    /// Every moment.
    pub const ALL: [CrashMoment; 3] = [Self::Anytime, Self::MidStore, Self::MidRecord];
}

/// How a durable producer stores its messages (see `sim::durable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DurableKind {
    /// A durable producer (`src/durable/`): its own journal; a store per burst of messages
    /// (numbered when the store starts, handed to the core once it commits) and a settlement
    /// record per batch of settlements, one of each in flight; confirmations fire once their
    /// record commits; the `window_start` cap is set after each record commits.
    Producer,
    /// A lane of the outbox of persistent entity `entity` (`src/persistence/outbox.rs`): the
    /// entity's lanes share its journal, its incarnation and its crashes; each offer is a
    /// decision whose delivery is numbered when it is decided and handed to the lane's core
    /// once its append commits; confirmations ride in the entity's next append (one append
    /// in flight); the cap is set after every flush of the lanes.
    Outbox {
        /// The entity (several lanes may belong to one).
        entity: usize,
    },
}

/// How a durable producer's shell computes the lowest seq not durably settled, the cap of its
/// `window_start` (`ProducerCore::set_durably_settled_below`), after a record commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapRule {
    /// As `src/durable/producer.rs` does: the lowest stored seq whose settlement is not
    /// recorded, else the next seq to number. While a store is in flight the next seq is
    /// already past it; the core clamps the cap at its own next seq, without which
    /// `window_start` would pass that store's seqs and a crash before their record would make
    /// the consumer refuse their resends as stale forever.
    AsShipped,
    /// The lowest seq not durably settled: as `AsShipped`, but never past the first seq of a
    /// store still in flight (the outbox's rule: its uncommitted deliveries count as
    /// unconfirmed).
    LowestNotDurablySettled,
}

/// Durable storage for every producer of a scenario: journals with a commit latency, and
/// crashes that lose everything not committed ([`Disruption::DurableCrash`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Durability {
    /// How each producer stores its messages (one per producer).
    pub kinds: Vec<DurableKind>,
    /// Each write of a journal commits this long after it starts (drawn uniformly); a
    /// journal commits one write at a time, in the order they were issued.
    pub commit_latency: RangeInclusive<Duration>,
    /// How durable producers (not outbox lanes) cap `window_start`.
    pub cap: CapRule,
}

/// A forger that holds the id and the current incarnation of producer `victim` (anyone who
/// ever saw one of its deliveries may) injects forged deliveries straight into the consumer:
/// a burst of consecutive seqs, each with `window_start == seq`, far above everything the
/// victim will ever send, and bodies distinct from every real body. Each raises the victim's
/// floor at the consumer past all of its real seqs: from then on they are stale, so the
/// victim's later messages can only be given up (never confirmed without a handler run).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Forgery {
    /// Index of the producer impersonated.
    pub victim: usize,
    /// The forgery is triggered when the victim first transmits this seq (from 1)…
    pub after_seq: u64,
    /// …and injected this long after that.
    pub delay: Duration,
    /// The first forged seq is the victim's highest transmitted seq plus `jump` (up to 2^53),
    /// lifted above the highest seq the victim will ever use (a forged copy of a seq it will
    /// still send makes that message a duplicate: the capability's holder speaks for the
    /// producer, no protocol can tell them apart) and capped so the burst fits within
    /// `MAX_SEQ`.
    pub jump: u64,
    /// Consecutive forged seqs, one per millisecond.
    pub burst: u64,
    /// Each forged delivery reaches the consumer this many times (replays up to 20 ms later).
    pub copies: u32,
}

impl Forgery {
    /// Jumps worth trying: just above the victim, a little, far, and as far as seqs go.
    pub const JUMPS: [u64; 7] = [1, 2, 16, 1_000, 1 << 20, 1 << 40, MAX_SEQ];
}

/// One simulation run, fully determined by these fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Seeds the one RNG that drives links, handler and traffic.
    pub seed: u64,
    /// Messages in total, dealt round-robin to the producers.
    pub messages: usize,
    /// Producers (ids `p0`, `p1`, …, see `shared_ids`) sending into the one consumer.
    pub producers: usize,
    /// `Some(n)`: the producers are configured with only `n` ids (a configuration error),
    /// producer `i` sending as `p{i % n}`, each with its own incarnation; `None`: every
    /// producer `i` has its own id `p{i}`.
    pub shared_ids: Option<usize>,
    /// Settings of every producer (`producer_id` is set by the simulator).
    pub producer: ProducerConfig,
    /// Settings of the consumer.
    pub consumer: ConsumerConfig,
    /// The producer → consumer link (deliveries).
    pub forward: LinkFaults,
    /// The consumer → producer link (ACKs).
    pub backward: LinkFaults,
    /// The handler's failures and durations.
    pub handler: HandlerFaults,
    /// When messages are offered to the producers.
    pub traffic: Traffic,
    /// Restarts during the run.
    pub disruptions: Vec<Disruption>,
    /// Forged deliveries during the run.
    pub forgeries: Vec<Forgery>,
    /// `Some`: the producers are durable (then attempts are unbounded and producers restart
    /// only by [`Disruption::DurableCrash`]).
    pub durable: Option<Durability>,
}

impl Scenario {
    /// A fault-free baseline to derive scenarios from: one producer with the default
    /// settings, a consumer with the default settings, links with 1–20 ms latency, an
    /// instantaneous handler that never fails, all messages offered at once.
    pub fn baseline(seed: u64, messages: usize) -> Self {
        let latency = LinkFaults::reliable(Duration::from_millis(1), Duration::from_millis(20));
        Self {
            seed,
            messages,
            producers: 1,
            shared_ids: None,
            producer: ProducerConfig::default(),
            consumer: ConsumerConfig::default(),
            forward: latency.clone(),
            backward: latency,
            handler: HandlerFaults::NONE,
            traffic: Traffic::BURST,
            disruptions: Vec::new(),
            forgeries: Vec::new(),
            durable: None,
        }
    }

    /// How producer `producer` stores its messages (`None`: in memory only).
    pub fn durable_kind(&self, producer: usize) -> Option<DurableKind> {
        self.durable.as_ref().map(|d| d.kinds[producer])
    }

    /// How many messages producer `producer` sends.
    pub fn messages_of(&self, producer: usize) -> usize {
        self.messages / self.producers + usize::from(producer < self.messages % self.producers)
    }

    /// Whether no message can be given up (every message must end confirmed `Ok`).
    pub fn attempts_are_unbounded(&self) -> bool {
        self.producer.max_attempts == Limit::Unbounded
    }

    /// The index of the id producer `producer` sends under (`p{index}`).
    pub fn id_of(&self, producer: usize) -> usize {
        self.shared_ids.map_or(producer, |ids| producer % ids)
    }

    /// How many distinct ids the producers send under.
    pub fn ids(&self) -> usize {
        self.shared_ids
            .map_or(self.producers, |ids| ids.min(self.producers))
    }

    /// The most incarnations one id has over the run: its producers' lives (1 + restarts).
    pub fn most_incarnations_per_id(&self) -> usize {
        (0..self.ids())
            .map(|id| {
                (0..self.producers)
                    .filter(|&producer| self.id_of(producer) == id)
                    .map(|producer| 1 + self.restarts_of(producer))
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }

    /// How often producer `producer` restarts.
    fn restarts_of(&self, producer: usize) -> usize {
        self.disruptions
            .iter()
            .filter(
                |d| matches!(d, Disruption::ProducerRestart { producer: p, .. } if *p == producer),
            )
            .count()
    }

    /// Whether the consumer may lose a producer's dedup window while the producer still
    /// needs it: LRU eviction (more ids than `max_producers`), an idle sweep (a TTL short
    /// enough to expire between a producer's deliveries), or more live producers sharing an id
    /// than it keeps incarnation windows for.
    pub fn windows_can_vanish(&self) -> bool {
        let too_many = self
            .consumer
            .max_producers
            .get()
            .is_some_and(|max| max < self.ids());
        let short_ttl = self
            .consumer
            .producer_idle_ttl
            .get()
            .is_some_and(|ttl| ttl < HARMLESS_IDLE_TTL);
        let crowded = (0..self.ids())
            .map(|id| (0..self.producers).filter(|&p| self.id_of(p) == id).count())
            .any(|sharing| sharing > INCARNATIONS_KEPT_PER_ID);
        too_many || short_ttl || crowded
    }

    /// Whether the consumer keeps every dedup window it needs for the whole run: no restart
    /// on either side and no window lost. Only then must each message's handler succeed
    /// exactly once. A durable crash is no restart here: the producer keeps its incarnation
    /// and seqs, so the consumer's window still recognises what it handled.
    pub fn dedup_is_kept(&self) -> bool {
        !self.restarts_producers() && !self.restarts_consumer() && !self.windows_can_vanish()
    }

    /// Whether the consumer can keep a window for every incarnation of every producer: no
    /// window can vanish, no consumer restart, and no id has more incarnations (lives of its
    /// producers) than an id keeps windows for. Then each message key's handler succeeds at
    /// most once, even across producer restarts (a straggler of an old incarnation resets
    /// nothing).
    pub fn incarnation_windows_suffice(&self) -> bool {
        !self.restarts_consumer()
            && !self.windows_can_vanish()
            && self.most_incarnations_per_id() <= INCARNATIONS_KEPT_PER_ID
    }

    /// Whether the consumer restarts during the run.
    pub fn restarts_consumer(&self) -> bool {
        self.disruptions
            .iter()
            .any(|d| matches!(d, Disruption::ConsumerRestart { .. }))
    }

    /// Whether producer incarnations change during the run.
    pub fn restarts_producers(&self) -> bool {
        self.disruptions
            .iter()
            .any(|d| matches!(d, Disruption::ProducerRestart { .. }))
    }

    /// The most steps a healthy run may take: a backstop far above what the heaviest
    /// scenario needs (a few hundred steps per message at worst).
    pub fn step_cap(&self) -> u64 {
        20_000 + 1_000 * self.messages as u64
    }
}

/// A healthy run settles some message at least every this many steps while messages are
/// unsettled; more means a livelock (retransmissions that never get anywhere, or a deadline
/// that fires at the same instant forever).
pub const PROGRESS_STEPS: u64 = 200_000;

/// A healthy run settles some message at least every this long in simulated time while
/// messages are unsettled: far beyond any retransmission interval, latency, handler run or
/// traffic pause a scenario configures.
pub const PROGRESS_TIME: Duration = Duration::from_secs(600);
