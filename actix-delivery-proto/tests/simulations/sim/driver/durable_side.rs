//! The simulator's durable side: durable producers and outbox lanes over the simulated
//! storage (`sim::durable`), driven as their shells drive their cores, and their crashes.
//!
//! - **A durable producer** (as `ProducerController::flush` and `src/durable/producer.rs`):
//!   each flush first starts the writes that are due (a store of the messages handed over, a
//!   record of the settlements held back, one of each in flight), then drains the core's
//!   transmissions and settlements (settlements are held back for the next record: their
//!   confirmations fire once it commits), then arms the shell's one timer. A committed store
//!   hands its messages to the core (which numbers them with the seqs they were stored under);
//!   a committed record fires its confirmations (to the callback of the life that stored the
//!   message, or to the sink) and sets the `window_start` cap (`CapRule`). A settlement held
//!   back after the flush's writes started waits for the next flush: when none follows (the
//!   last ACK of a burst), only the shell's stale retransmission timer (never disarmed) starts
//!   its record, up to a `resend_timeout` later; the simulator models that timer and counts
//!   such records.
//! - **An outbox entity** (as `PersistentActor::flush` and `src/persistence/outbox.rs`): a
//!   decision numbers its delivery at once; each flush drains every lane (settlements become
//!   pending confirmations, then the lane's cap is set from the outbox state), arms the timer,
//!   then starts the next append if none is in flight. A committed append hands its
//!   deliveries to the lanes' cores and settles its confirmations.
//! - **A crash** loses everything not committed (`Unit::crash`): messages whose store had not
//!   committed are never stored (final: their senders got an error); settlements whose record
//!   had not committed stay unsettled in the journal. ACKs reaching a crashed producer are
//!   lost, offers wait for its restart. The restart resumes every lane with the kept
//!   incarnation, the journal's next seq and its stored unsettled messages.
//!
//! Rules checked at once: **write-ahead** and **resent under the stored seq** (every
//! transmission of a durable message carries the seq its store committed under), **incarnation
//! kept**, **window_start capped** (never past the lowest seq not durably settled),
//! **resends first, in seq order** (a life's first transmissions are its resumed seqs, then
//! consecutive new seqs from the journal's next seq), **unrecorded settlements are resent**.
//!
//! Not modelled: journal failures (a refused write), the stream's creation (a new stream is
//! open at time zero), snapshots and compaction, an outbox's `max_unconfirmed` refusals, and a
//! crash between a commit and the shell hearing of it (a commit and its reply are one event
//! here: with it, a message would be stored without its sender knowing, and a recorded
//! settlement's confirmation would reach neither callback nor sink).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use actix_delivery_proto::config::ProducerConfig;
use actix_delivery_proto::error::DeliveryError;
use actix_delivery_proto::protocol::envelope::{Incarnation, ProducerId};
use actix_delivery_proto::protocol::producer::{ProducerCore, ProducerStats, Transmission};
use rand::Rng;

use super::{short, Body, Event, SimProducer, World};
use crate::sim::durable::{Unit, UnitKind, Write};
use crate::sim::scenario::{CapRule, CrashMoment, Disruption, DurableKind, Scenario};
use crate::sim::trace::TraceEvent;

/// `now` plus the counters of a producer's earlier lives.
pub(super) fn summed(earlier: &ProducerStats, now: &ProducerStats) -> ProducerStats {
    let mut stats = *now;
    stats.sent += earlier.sent;
    stats.retransmitted += earlier.retransmitted;
    stats.confirmed += earlier.confirmed;
    stats.ignored_acks += earlier.ignored_acks;
    stats.given_up += earlier.given_up;
    stats.refused += earlier.refused;
    stats
}

impl World<'_> {
    /// The durable units of `scenario`: one per durable producer, one per outbox entity (its
    /// lanes in producer order); notes each producer's unit and lane.
    pub(super) fn units(scenario: &Scenario, producers: &mut [SimProducer]) -> Vec<Unit> {
        let Some(durable) = &scenario.durable else {
            return Vec::new();
        };
        assert_eq!(
            durable.kinds.len(),
            scenario.producers,
            "one durable kind per producer"
        );
        assert!(
            scenario.attempts_are_unbounded() && !scenario.restarts_producers(),
            "durable producers retry forever and restart only by DurableCrash"
        );
        let mut lanes: Vec<(UnitKind, Vec<usize>)> = Vec::new();
        let mut entities: BTreeMap<usize, usize> = BTreeMap::new();
        for (producer, kind) in durable.kinds.iter().enumerate() {
            let unit = match *kind {
                DurableKind::Producer => {
                    lanes.push((UnitKind::Producer, Vec::new()));
                    lanes.len() - 1
                }
                DurableKind::Outbox { entity } => *entities.entry(entity).or_insert_with(|| {
                    lanes.push((UnitKind::Outbox, Vec::new()));
                    lanes.len() - 1
                }),
            };
            producers[producer].unit = Some((unit, lanes[unit].1.len()));
            lanes[unit].1.push(producer);
        }
        for (_, lanes) in &lanes {
            let ids: BTreeSet<usize> = lanes.iter().map(|&p| producers[p].id_index).collect();
            assert_eq!(
                ids.len(),
                lanes.len(),
                "an entity's lanes have distinct ids"
            );
        }
        lanes
            .into_iter()
            .map(|(kind, lanes)| {
                let incarnation = producers[lanes[0]].core.incarnation();
                Unit::new(kind, lanes, incarnation)
            })
            .collect()
    }

    /// The configuration of producer `producer`'s core.
    fn config_of(&self, producer: usize) -> ProducerConfig {
        ProducerConfig {
            producer_id: Some(format!("p{}", self.producers[producer].id_index)),
            ..self.scenario.producer.clone()
        }
    }

    /// How durable producers cap `window_start`.
    fn cap_rule(&self) -> CapRule {
        self.scenario
            .durable
            .as_ref()
            .map_or(CapRule::LowestNotDurablySettled, |d| d.cap)
    }

    /// When the unit of durable producer `producer` is crashed: when it restarts.
    pub(super) fn down_until(&self, producer: usize) -> Option<Duration> {
        let (unit, _) = self.producers[producer].unit?;
        self.units[unit].down_until
    }

    /// A durable producer is offered `body`: its unit stores it (or, an outbox, decides it).
    pub(super) fn offer_durable(&mut self, producer: usize, body: Body) {
        let (unit, lane) = self.producers[producer].unit.expect("a durable producer");
        self.units[unit].offer(lane, body);
        self.flush_unit(unit);
        self.trigger_durable_crashes(producer);
    }

    /// Flushes a durable unit as its shell does (see the module docs); returns the writes
    /// it started.
    pub(super) fn flush_unit(&mut self, unit: usize) -> Vec<Write> {
        if self.units[unit].down_until.is_some() {
            return Vec::new();
        }
        let lanes = self.units[unit].lanes.clone();
        match self.units[unit].kind {
            UnitKind::Producer => {
                // As the shell: settlements first, so their record starts in this flush.
                self.settle_lane(unit, 0);
                let started = self.start_writes(unit);
                self.drain_lane(unit, 0);
                let deadline = self.producers[lanes[0]].core.next_deadline();
                let deadline = deadline.map(|d| self.since_epoch(d));
                self.units[unit].arm(deadline);
                started
            }
            UnitKind::Outbox => {
                let mut earliest: Option<Duration> = None;
                for (lane, &producer) in lanes.iter().enumerate() {
                    self.drain_lane(unit, lane);
                    let cap = self.units[unit].cap(lane, CapRule::LowestNotDurablySettled);
                    let core = &mut self.producers[producer].core;
                    core.set_durably_settled_below(cap);
                    let deadline = core.next_deadline().map(|d| self.since_epoch(d));
                    earliest = match (earliest, deadline) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                self.units[unit].arm(earliest);
                self.start_writes(unit)
            }
        }
    }

    /// Drains one lane's core: transmissions go on the link, settlements to the unit.
    fn drain_lane(&mut self, unit: usize, lane: usize) {
        let producer = self.units[unit].lanes[lane];
        let now = self.instant();
        while let Some(transmission) = self.producers[producer].core.poll_transmit(now) {
            self.transmit(producer, transmission);
        }
        self.settle_lane(unit, lane);
    }

    /// Takes one lane's settlements from its core.
    fn settle_lane(&mut self, unit: usize, lane: usize) {
        let producer = self.units[unit].lanes[lane];
        while let Some((body, result)) = self.producers[producer].core.poll_settled() {
            self.settled_in_memory(producer, (unit, lane), body, result);
        }
    }

    /// The core settled `body`: held back for its record.
    fn settled_in_memory(
        &mut self,
        producer: usize,
        (unit, lane): (usize, usize),
        body: Body,
        result: Result<(), DeliveryError>,
    ) {
        let record = self.obs.bodies.get_mut(&body).expect("offered before");
        let stored = record.stored;
        let ok = result.is_ok();
        if ok {
            record.acked += 1;
        } else {
            record.other += 1;
        }
        self.trace.record(
            self.now,
            TraceEvent::Settled {
                producer,
                body,
                result: if ok { "ok in memory" } else { "refused" },
            },
        );
        match (ok, stored) {
            (true, Some((seq, _))) => self.units[unit].settled(lane, seq, body),
            _ => {
                self.settled_for_good();
                self.obs.violation(
                    "durable messages settle Ok",
                    self.step,
                    format!("p{producer} settled body {body:#x} ({stored:?}) with {result:?}"),
                );
            }
        }
    }

    /// Starts the unit's due writes, with their commits and the armed crashes they satisfy
    /// (scheduled before the commit, so that they strike first even at the same instant).
    fn start_writes(&mut self, unit: usize) -> Vec<Write> {
        let latency = self
            .scenario
            .durable
            .as_ref()
            .expect("durable")
            .commit_latency
            .clone();
        let (now, rng) = (self.now, &mut self.rng);
        let started = self.units[unit].start_writes(now, || rng.random_range(latency.clone()));
        let life = self.units[unit].life;
        for write in &started {
            self.trace.record(
                self.now,
                TraceEvent::WriteStarted {
                    unit,
                    stored: write.stored.len(),
                    recorded: write.settled.len(),
                    commits_at: write.commits_at,
                },
            );
            let armed = std::mem::take(&mut self.units[unit].armed);
            let (hit, waiting) = armed.into_iter().partition(|&(_, m)| write.is(m));
            self.units[unit].armed = waiting;
            for (disruption, _) in hit {
                let at = self.crash_time(write.commits_at);
                let life = Some(life);
                let crash = Event::Crash {
                    unit,
                    disruption,
                    life,
                };
                self.queue.push(at, crash);
            }
            self.queue
                .push(write.commits_at, Event::Commit { unit, life });
        }
        started
    }

    /// A random instant from now until just before `commits_at` (now, if that is now).
    fn crash_time(&mut self, commits_at: Duration) -> Duration {
        if commits_at > self.now {
            self.rng.random_range(self.now..commits_at)
        } else {
            self.now
        }
    }

    /// The oldest write in flight of `unit` commits (unless the unit crashed since `life`):
    /// stored messages go to their cores, recorded settlements are confirmed.
    pub(super) fn commit(&mut self, unit: usize, life: u32) {
        if self.units[unit].life != life {
            return; // lost with a crash
        }
        let committed = self.units[unit].commit();
        self.trace.record(
            self.now,
            TraceEvent::Committed {
                unit,
                stored: committed.stored.len(),
                recorded: committed.settled.len(),
            },
        );
        let lanes = self.units[unit].lanes.clone();
        let kind = self.units[unit].kind;
        for &(lane, seq, body) in &committed.stored {
            let record = self.obs.bodies.get_mut(&body).expect("offered before");
            record.stored = Some((seq, life));
            // As the shells do: under its stored seq, never refused.
            let core = &mut self.producers[lanes[lane]].core;
            if core.handle_stored(seq, body, body).is_err() {
                self.obs.violation(
                    "stored under the core's next seq",
                    self.step,
                    format!("lane p{} refused body {body:#x} at seq {seq}", lanes[lane]),
                );
            }
        }
        for &(lane, _, body, resumed) in &committed.settled {
            self.confirm_durable(lanes[lane], body, resumed);
        }
        if kind == UnitKind::Producer && !committed.settled.is_empty() {
            let cap = self.units[unit].cap(0, self.cap_rule());
            self.producers[lanes[0]].core.set_durably_settled_below(cap);
        }
        self.flush_unit(unit);
    }

    /// A durable message's settlement is recorded: its confirmation fires, to the callback of
    /// the life that stored it or (resumed after a restart) to the sink.
    fn confirm_durable(&mut self, producer: usize, body: Body, to_sink: bool) {
        self.trace.record(
            self.now,
            TraceEvent::Settled {
                producer,
                body,
                result: if to_sink {
                    "ok recorded, to the sink"
                } else {
                    "ok recorded, to its callback"
                },
            },
        );
        let (unit, _) = self.producers[producer].unit.expect("durable");
        let life = self.units[unit].life;
        let record = self.obs.bodies.get_mut(&body).expect("offered before");
        if to_sink {
            record.sink += 1;
        } else {
            record.ok += 1;
        }
        record.confirmed_life = Some(life);
        self.confirmed_for_good(body);
    }

    /// Schedules or arms the durable crashes this producer's latest offer triggers.
    fn trigger_durable_crashes(&mut self, producer: usize) {
        let offered = self.producers[producer].offered;
        let (unit, _) = self.producers[producer].unit.expect("durable");
        for (index, disruption) in self.scenario.disruptions.iter().enumerate() {
            if let Disruption::DurableCrash {
                producer: target,
                after_offered,
                moment,
                delay,
                ..
            } = *disruption
            {
                if target != producer || after_offered != offered {
                    continue;
                }
                if moment == CrashMoment::Anytime {
                    let crash = Event::Crash {
                        unit,
                        disruption: index,
                        life: None,
                    };
                    self.queue.push(self.now + delay, crash);
                } else {
                    self.arm_crash(unit, index, moment);
                }
            }
        }
    }

    /// A crash at `moment`: during the write of that kind in flight, or the next one started.
    fn arm_crash(&mut self, unit: usize, disruption: usize, moment: CrashMoment) {
        match self.units[unit].in_flight(moment) {
            Some(commits_at) if commits_at > self.now => {
                let at = self.crash_time(commits_at);
                let life = Some(self.units[unit].life);
                let crash = Event::Crash {
                    unit,
                    disruption,
                    life,
                };
                self.queue.push(at, crash);
            }
            _ => self.units[unit].armed.push((disruption, moment)),
        }
    }

    /// At quiescence, with durable storage, a disruption whose trigger can no longer be
    /// reached strikes now, on streams where everything is settled: a crash still waiting for
    /// its moment (no such write started since it was armed: a later crash lost the messages
    /// it waited for), or a consumer restart after more successful runs than there are
    /// messages left that were ever stored. Returns whether one did.
    pub(super) fn strike_unreached_disruptions(&mut self) -> bool {
        if self.scenario.durable.is_none() {
            return false;
        }
        let armed = self
            .units
            .iter_mut()
            .enumerate()
            .find_map(|(index, unit)| Some((index, unit.armed.pop()?.0)));
        if let Some((unit, disruption)) = armed {
            let crash = Event::Crash {
                unit,
                disruption,
                life: None,
            };
            self.queue.push(self.now, crash);
            return true;
        }
        let handled = self.handled;
        let unreached = self.scenario.disruptions.iter().enumerate().position(|(i, d)| {
            !self.struck[i]
                && matches!(*d, Disruption::ConsumerRestart { after_handled, .. } if after_handled > handled)
        });
        let Some(index) = unreached else {
            return false;
        };
        self.struck[index] = true;
        self.queue.push(self.now, Event::ConsumerRestart);
        true
    }

    /// A scheduled crash is due. One meant for a write that a crash meanwhile lost waits for
    /// its moment again; one that finds the unit crashed strikes right after its restart.
    pub(super) fn crash_event(&mut self, unit: usize, disruption: usize, life: Option<u32>) {
        if life.is_some_and(|life| life != self.units[unit].life) {
            let Disruption::DurableCrash { moment, .. } = self.scenario.disruptions[disruption]
            else {
                unreachable!("a durable crash");
            };
            return self.arm_crash(unit, disruption, moment);
        }
        if let Some(until) = self.units[unit].down_until {
            let crash = Event::Crash {
                unit,
                disruption,
                life: None,
            };
            return self.queue.push(until, crash);
        }
        self.crash(unit, disruption);
    }

    /// The unit's process crashes: everything not committed is lost.
    fn crash(&mut self, unit: usize, disruption: usize) {
        let Disruption::DurableCrash { down, .. } = self.scenario.disruptions[disruption] else {
            unreachable!("a durable crash");
        };
        let loss = self.units[unit].crash();
        self.obs.durable_crashes += 1;
        self.obs.crashes_mid_store += u64::from(loss.mid_store);
        self.obs.crashes_mid_record += u64::from(loss.mid_record);
        self.obs.unrecorded_at_crash += loss.unrecorded.len() as u64;
        self.trace.record(
            self.now,
            TraceEvent::Crashed {
                unit,
                mid_store: loss.mid_store,
                mid_record: loss.mid_record,
                never_stored: loss.never_stored.len(),
                unrecorded: loss.unrecorded.len(),
            },
        );
        let lanes = self.units[unit].lanes.clone();
        for &(lane, body) in &loss.never_stored {
            let record = self.obs.bodies.get_mut(&body).expect("offered before");
            record.never_stored += 1;
            self.settled_for_good();
            self.trace.record(
                self.now,
                TraceEvent::Settled {
                    producer: lanes[lane],
                    body,
                    result: "never stored (crash)",
                },
            );
        }
        self.unrecorded[unit] = loss.unrecorded;
        let incarnation = self.units[unit].incarnation;
        for &producer in &lanes {
            // An idle stand-in until the restart: nothing reaches it (see `down_until`).
            let stand_in = ProducerCore::seeded(&self.config_of(producer), incarnation, || 0);
            let p = &mut self.producers[producer];
            let dead = std::mem::replace(&mut p.core, stand_in);
            p.retired = summed(&p.retired, &dead.stats());
        }
        let until = self.now + down;
        self.units[unit].down_until = Some(until);
        self.queue.push(until, Event::Restart { unit });
    }

    /// The unit restarts: every lane resumes the journal's next seq and its stored unsettled
    /// messages, under the kept incarnation (an outbox that never committed a delivery has
    /// none recorded: it draws a new one).
    pub(super) fn restart_unit(&mut self, unit: usize) {
        let lanes = self.units[unit].lanes.clone();
        if self.units[unit].kind == UnitKind::Outbox && !self.units[unit].committed_any {
            let value: u128 = self.rng.random();
            for &producer in &lanes {
                let id_index = self.producers[producer].id_index;
                assert!(
                    self.owners.insert((value, id_index), producer).is_none(),
                    "incarnations collide"
                );
            }
            self.units[unit].incarnation = Incarnation::from_u128(value);
        }
        let incarnation = self.units[unit].incarnation;
        let resumed = self.units[unit].resume();
        let mut resumed_seqs: Vec<BTreeSet<u64>> = Vec::new();
        let mut count = 0;
        for (lane, (next_seq, messages)) in resumed.into_iter().enumerate() {
            let producer = lanes[lane];
            for &(_, body) in &messages {
                let record = self.obs.bodies.get_mut(&body).expect("offered before");
                record.resumed += 1;
            }
            count += messages.len();
            resumed_seqs.push(messages.iter().map(|&(seq, _)| seq).collect());
            let config = self.config_of(producer);
            let jitter = self.rng.random();
            let p = &mut self.producers[producer];
            p.expect_resumed = messages.iter().map(|&(seq, _)| seq).collect();
            p.expect_next = next_seq;
            let resumed = messages.into_iter().map(|(seq, body)| (seq, body, body));
            p.core = ProducerCore::resume(&config, incarnation, next_seq, resumed, || jitter);
        }
        self.obs.resumed += count as u64;
        for (lane, seq, body) in std::mem::take(&mut self.unrecorded[unit]) {
            if !resumed_seqs[lane].contains(&seq) {
                self.obs.violation(
                    "unrecorded settlements are resent",
                    self.step,
                    format!(
                        "p{} settled seq {seq} (body {body:#x}) in memory before the crash, its \
                         record was lost, but the restart did not resume it",
                        lanes[lane]
                    ),
                );
            }
        }
        self.trace.record(
            self.now,
            TraceEvent::Resumed {
                unit,
                incarnation: short(incarnation),
                resumed: count,
            },
        );
        self.flush_unit(unit);
    }

    /// The unit's shell timer fires: every lane's core handles its deadlines, then the unit
    /// flushes. A record it starts while nothing was due for retransmission waited for this
    /// stale timer.
    pub(super) fn unit_timer(&mut self, unit: usize) {
        self.trace.record(self.now, TraceEvent::UnitTimer { unit });
        self.units[unit].alarm = None;
        let now = self.instant();
        let lanes = self.units[unit].lanes.clone();
        let retransmitted = |world: &Self| -> u64 {
            let stats = lanes.iter().map(|&p| world.producers[p].core.stats());
            stats.map(|s| s.retransmitted).sum()
        };
        let before = retransmitted(self);
        for &producer in &lanes {
            self.producers[producer].core.handle_timeout(now);
        }
        let started = self.flush_unit(unit);
        if retransmitted(self) == before && started.iter().any(|w| !w.settled.is_empty()) {
            self.obs.records_by_stale_alarm += 1;
        }
    }

    /// The rules a durable producer's transmission must keep at once (see the module docs);
    /// returns whether it is a resend (by a later life than the one that stored it).
    pub(super) fn check_durable_transmission(
        &mut self,
        producer: usize,
        (unit, lane): (usize, usize),
        transmission: &Transmission<Body>,
    ) -> bool {
        let header = &transmission.header;
        let body = transmission.body;
        let stored = self.obs.bodies.get(&body).and_then(|record| record.stored);
        match stored {
            None => self.obs.violation(
                "write-ahead",
                self.step,
                format!(
                    "p{producer} transmitted body {body:#x} as seq {} before its store committed",
                    header.seq
                ),
            ),
            Some((seq, _)) if seq != header.seq => self.obs.violation(
                "resent under the stored seq",
                self.step,
                format!(
                    "p{producer} transmitted body {body:#x} as seq {}, stored as seq {seq}",
                    header.seq
                ),
            ),
            Some(_) => {}
        }
        let unit_state = &self.units[unit];
        if header.incarnation != unit_state.incarnation {
            self.obs.violation(
                "incarnation kept",
                self.step,
                format!(
                    "p{producer} transmitted under incarnation {:04x}, its stream's is {:04x}",
                    short(header.incarnation),
                    short(unit_state.incarnation)
                ),
            );
        }
        let lowest = unit_state.lowest_not_durably_settled(lane);
        if header.window_start > lowest {
            self.obs.violation(
                "window_start capped",
                self.step,
                format!(
                    "p{producer} transmitted seq {} with window_start {}, but seq {lowest} is \
                     not durably settled: a crash now and the consumer refuses its resend as \
                     stale",
                    header.seq, header.window_start
                ),
            );
        }
        if transmission.attempt == 1 {
            let p = &mut self.producers[producer];
            let expected = p.expect_resumed.pop_front().unwrap_or_else(|| {
                p.expect_next += 1;
                p.expect_next - 1
            });
            if header.seq != expected {
                self.obs.violation(
                    "resends first, in seq order",
                    self.step,
                    format!(
                        "p{producer}'s next first transmission in this life should be seq \
                         {expected} (its resumed seqs first, then new ones from the journal's \
                         next seq), it was seq {}",
                        header.seq
                    ),
                );
            }
        }
        stored.is_some_and(|(_, life)| life < self.units[unit].life)
    }

    /// Whether `id` is producer `producer`'s id (for the owners of incarnations).
    pub(super) fn id_index_of(&self, id: &ProducerId) -> Option<usize> {
        let producer = self.producers.iter().find(|p| p.id == *id)?;
        Some(producer.id_index)
    }
}
