//! The simulator's consumer side: deliveries reaching the consumer and the rules its decision
//! must keep at once, handler runs (their outcomes, durations and timeouts), ACKs sent back,
//! and consumer restarts.

use std::time::Duration;

use actix_delivery_proto::protocol::consumer::{Completion, HandlerOutcome, Inbound, Step};
use actix_delivery_proto::protocol::envelope::{Ack, Header};
use actix_delivery_proto::protocol::producer::Transmission;
use rand::Rng;

use super::{short, Body, Event, RunningRun, World};
use crate::sim::observe::{ConsumerRestartRecord, Key, Success};
use crate::sim::scenario::{Disruption, STUCK_DURATION};
use crate::sim::trace::TraceEvent;

/// The consumer's decision to re-ACK a duplicate, as [`World::arrive`] names it.
const RE_ACK: &str = "duplicate, re-ACK";

impl World<'_> {
    /// A copy of a delivery reaches the consumer, which decides what to do with it.
    pub(super) fn deliver(
        &mut self,
        producer: usize,
        transmission: Transmission<Body>,
        resent: bool,
    ) {
        let Transmission { header, body, .. } = transmission;
        let key = Key {
            producer,
            incarnation: header.incarnation.as_u128(),
            seq: header.seq,
        };
        let switches = self.note_incarnation(producer, &header);
        let life = self.life;
        let record = self.obs.keys.get_mut(&key).expect("transmitted before");
        record.in_transit -= 1;
        if record
            .first_arrivals
            .last()
            .is_none_or(|&(seen, _)| seen != life)
        {
            record.first_arrivals.push((life, switches));
        }
        let decision = self.arrive(key, header, body, false);
        if resent {
            self.obs.resend_arrivals += 1;
            self.obs.resend_duplicates += u64::from(decision == RE_ACK);
        }
    }

    /// Notes the incarnation of a delivery of `producer`'s id; returns how often the
    /// incarnations the consumer saw for that id switched so far.
    pub(super) fn note_incarnation(&mut self, producer: usize, header: &Header) -> u64 {
        let id = &mut self.id_switches[self.producers[producer].id_index];
        if id.seen.is_some_and(|seen| seen != header.incarnation) {
            id.switches += 1;
        }
        id.seen = Some(header.incarnation);
        id.switches
    }

    /// Hands a delivery that reaches the consumer (real, or `forged`; `key` names it) to the
    /// consumer, carries out its decision and checks two rules at once:
    ///
    /// - **stale is held**: a delivery at or below the floor the simulator predicts for its
    ///   window (the highest `window_start - 1` of the window's earlier arrivals in this
    ///   consumer life) is held — never run, never ACKed — and counted in `stats.stale`;
    /// - **re-ACK means handled**: a delivery is re-ACKed only if its key's handler succeeded
    ///   in this consumer life, and the ACK mirrors it and goes to its sender.
    pub(super) fn arrive(
        &mut self,
        key: Key,
        header: Header,
        body: Body,
        forged: bool,
    ) -> &'static str {
        let window = (key.producer, key.incarnation);
        let floor = self.floors.get(&window).copied().unwrap_or(0);
        let stale = key.seq <= floor;
        let settled = header.window_start - 1;
        self.obs.predicted_stale += u64::from(stale);
        if let Some(record) = self.obs.keys.get_mut(&key) {
            record.arrivals += 1;
            record.stale_arrivals += u32::from(stale);
        }
        let stale_before = self.consumer.stats().stale;
        let inbound = Inbound {
            header,
            body,
            reply_to: Some(key.producer),
        };
        let now = self.instant();
        let step = self.consumer.handle_delivery(inbound, now);
        let counted_stale = self.consumer.stats().stale > stale_before;
        if stale && !(matches!(step, Step::Hold) && counted_stale) {
            self.obs.violation(
                "stale is held",
                self.step,
                format!(
                    "{key:?} arrived at or below its window's floor {floor}, but the consumer \
                     decided {} (counted stale: {counted_stale})",
                    describe(&step)
                ),
            );
        }
        if settled > floor {
            self.floors.insert(window, settled);
        }
        self.note_dropped_windows();
        let decision = match step {
            Step::Run(body) => {
                self.start_running(body);
                "run"
            }
            Step::Ack(reply_to, ack) => {
                self.obs.re_acks += 1;
                self.check_re_ack(key, reply_to, &ack);
                self.send_ack(reply_to, ack);
                RE_ACK
            }
            Step::Hold => {
                self.obs.holds += 1;
                if stale {
                    "hold (stale)"
                } else {
                    "hold"
                }
            }
            Step::DeadLetter(reason, _) => {
                self.obs.violation(
                    "no dead letters",
                    self.step,
                    format!("{key:?} refused as dead letter: {reason}"),
                );
                "dead letter"
            }
        };
        self.trace.record(
            self.now,
            TraceEvent::Arrived {
                producer: key.producer,
                incarnation: key.incarnation as u16,
                seq: key.seq,
                forged,
                step: decision,
            },
        );
        decision
    }

    /// The rule **re-ACK means handled** (see [`arrive`](Self::arrive)).
    fn check_re_ack(&mut self, key: Key, reply_to: usize, ack: &Ack) {
        let life = self.life;
        let handled = match self.obs.keys.get(&key) {
            Some(record) => record.successes.iter().any(|s| s.life == life),
            None => self
                .obs
                .forged
                .get(&key)
                .is_some_and(|record| record.successes.contains(&life)),
        };
        let mirrored = reply_to == key.producer
            && ack.producer_id == self.producers[key.producer].id
            && ack.incarnation.as_u128() == key.incarnation
            && ack.seq == key.seq;
        if !handled || !mirrored {
            self.obs.violation(
                "re-ACK means handled",
                self.step,
                format!(
                    "{key:?} re-ACKed with {ack:?} to p{reply_to}, though its handler \
                     {} in consumer life {life}",
                    if handled {
                        "succeeded (the ACK does not mirror the delivery)"
                    } else {
                        "never succeeded"
                    }
                ),
            );
        }
    }

    /// Forgets the predicted floors once the consumer dropped windows (it does not say which:
    /// a fresh window starts from its first arrival's `window_start`).
    pub(super) fn note_dropped_windows(&mut self) {
        let stats = self.consumer.stats();
        let dropped = stats.evictions + stats.swept + stats.replaced_incarnations;
        if dropped != self.windows_dropped {
            self.windows_dropped = dropped;
            self.floors.clear();
        }
    }

    /// The rule **waiting bound**, after every step: per window, handled-above-contiguous
    /// plus waiting stays within `max_out_of_order` (plus the gap-closing seq), so the
    /// consumer's waiting queue never exceeds windows × (`max_out_of_order` + 1), whatever
    /// `window_start` does.
    pub(super) fn check_waiting(&mut self) {
        let Some(max) = self.scenario.consumer.max_out_of_order.get() else {
            return;
        };
        let stats = self.consumer.stats();
        let bound = stats.tracked_incarnations * (max + 1);
        if stats.waiting > bound {
            self.obs.violation(
                "waiting bound",
                self.step,
                format!(
                    "{} messages wait with {} windows tracked and max_out_of_order {max} \
                     (bound {bound})",
                    stats.waiting, stats.tracked_incarnations
                ),
            );
        }
    }

    /// The key of a message the consumer names: by its incarnation, checked against its id
    /// (several producers may share an id).
    fn key_of(&self, info: &Header) -> Key {
        let incarnation = info.incarnation.as_u128();
        let producer = self
            .id_index_of(&info.producer_id)
            .and_then(|id_index| self.owners.get(&(incarnation, id_index)).copied())
            .filter(|&producer| self.producers[producer].id == info.producer_id)
            .unwrap_or_else(|| {
                panic!(
                    "the consumer invented producer {:?} incarnation {:04x}",
                    info.producer_id, incarnation as u16
                )
            });
        Key {
            producer,
            incarnation,
            seq: info.seq,
        }
    }

    /// Starts the handler for the message the consumer just made the running one.
    fn start_running(&mut self, body: Body) {
        let info = self
            .consumer
            .running()
            .expect("Run names a running message")
            .clone();
        self.start_handler(info, body);
    }

    /// Starts the handler: its outcome and duration are drawn now, its end is an event.
    fn start_handler(&mut self, info: Header, body: Body) {
        let key = self.key_of(&info);
        if let Some(running) = self.running {
            self.obs.violation(
                "one handler at a time",
                self.step,
                format!(
                    "handler started for {key:?} while the one for {:?} runs",
                    running.key
                ),
            );
        }
        self.runs += 1;
        let sent = match self.obs.keys.get_mut(&key) {
            Some(record) => {
                record.runs += 1;
                Some(record.body)
            }
            None => self.obs.forged.get_mut(&key).map(|record| {
                record.runs += 1;
                record.body
            }),
        };
        if sent != Some(body) {
            self.obs.violation(
                "handler gets the body sent",
                self.step,
                format!("handler for {key:?} got body {body:#x}, producer sent {sent:x?}"),
            );
        }
        let handler = &self.scenario.handler;
        let outcome = if !self.rng.random_bool(handler.failure) {
            HandlerOutcome::Succeeded
        } else if self.rng.random_bool(0.25) {
            HandlerOutcome::Panicked("simulated panic".into())
        } else {
            HandlerOutcome::Failed("simulated failure".into())
        };
        let (duration, slow) = self.draw_duration();
        let timeout = self.scenario.consumer.handler_timeout.get();
        self.obs.overdue_runs += u64::from(timeout.is_some_and(|timeout| duration > timeout));
        self.running = Some(RunningRun {
            key,
            run: self.runs,
            started: self.now,
            duration,
            slow,
        });
        self.trace.record(
            self.now,
            TraceEvent::HandlerStarted {
                producer: key.producer,
                incarnation: short(info.incarnation),
                seq: key.seq,
                body,
            },
        );
        self.queue.push(
            self.now + duration,
            Event::HandlerEnd {
                life: self.life,
                run: self.runs,
                switches_at_start: self.id_switches[self.producers[key.producer].id_index].switches,
                header: info,
                body,
                outcome,
            },
        );
    }

    /// How long a handler run takes, and whether it is slow. Stuck and slow runs draw only
    /// where the scenario configures them, so other scenarios keep their random sequence.
    fn draw_duration(&mut self) -> (Duration, bool) {
        let handler = &self.scenario.handler;
        if handler.stuck > 0.0 && self.rng.random_bool(handler.stuck) {
            return (STUCK_DURATION, false);
        }
        if handler.slow > 0.0 && self.rng.random_bool(handler.slow) {
            return (self.rng.random_range(handler.slow_range.clone()), true);
        }
        let normal = self.rng.random_range(Duration::ZERO..=handler.max_duration);
        (normal, false)
    }

    /// A handler run ends: the consumer learns the outcome (unless it restarted, or abandoned
    /// the run, meanwhile: then nothing changes). A run that outlasted `handler_timeout` must
    /// have been abandoned at its deadline (rule **overdue runs are abandoned**).
    pub(super) fn handler_ends(
        &mut self,
        (life, run): (u32, u64),
        switches_at_start: u64,
        info: Header,
        body: Body,
        outcome: HandlerOutcome,
    ) {
        let key = self.key_of(&info);
        let succeeded = outcome == HandlerOutcome::Succeeded;
        let running = self
            .running
            .filter(|running| life == self.life && running.run == run);
        self.trace.record(
            self.now,
            TraceEvent::HandlerEnded {
                producer: key.producer,
                seq: key.seq,
                succeeded,
                current: running.is_some(),
            },
        );
        let Some(running) = running else {
            // The consumer restarted, or timed the run out, while it ran: its future is gone.
            self.obs.abandoned_runs += 1;
            return;
        };
        if let Some(timeout) = self.scenario.consumer.handler_timeout.get()
            && running.duration > timeout
        {
            self.obs.violation(
                "overdue runs are abandoned",
                self.step,
                format!(
                    "the run for {key:?} took {:?}, more than handler_timeout {timeout:?}, \
                         yet it was still the current run when it ended",
                    running.duration
                ),
            );
        }
        self.obs.slow_completed += u64::from(running.slow);
        self.running = None;
        if succeeded {
            self.record_success(key, body, switches_at_start);
        } else {
            self.obs.handler_failures += 1;
        }
        let now = self.instant();
        let completion = self.consumer.handle_outcome(&outcome, now);
        match (completion.ack, succeeded) {
            (Some((reply_to, ack)), true) => {
                if reply_to != key.producer || ack != Ack::from(info) {
                    self.obs.violation(
                        "ACK mirrors the delivery",
                        self.step,
                        format!("handler for {key:?} succeeded, ACK {ack:?} to p{reply_to}"),
                    );
                }
                self.send_ack(reply_to, ack);
            }
            (None, false) => {}
            (ack, _) => self.obs.violation(
                "ACK if and only if handled",
                self.step,
                format!("handler for {key:?} succeeded={succeeded}, ACK {ack:?}"),
            ),
        }
        if let Some(body) = completion.next {
            self.start_running(body);
        }
    }

    /// A consumer restart abandons the running run. If it outlasts `handler_timeout`, its
    /// timeout will not fire, unless it should have fired already (rule **overdue runs are
    /// abandoned**: its deadline passed, yet the consumer had not abandoned it).
    fn restart_cuts_the_running_run(&mut self) {
        let Some(timeout) = self.scenario.consumer.handler_timeout.get() else {
            return;
        };
        let Some(running) = self.running.filter(|running| running.duration > timeout) else {
            return;
        };
        if running.started + timeout < self.now {
            self.obs.violation(
                "overdue runs are abandoned",
                self.step,
                format!(
                    "the run for {:?} (started at {:?}, taking {:?}) was still running at a \
                     consumer restart after its handler_timeout {timeout:?} expired",
                    running.key, running.started, running.duration
                ),
            );
        } else {
            self.obs.overdue_cut_by_restart += 1;
        }
    }

    /// The consumer abandoned the running handler (`handler_timeout`): its end event will be
    /// ignored, and the next waiting message runs. Rule **abandoned at its deadline**: only a
    /// run that outlasts the timeout is abandoned, exactly when the timeout expires, and
    /// without an ACK.
    pub(super) fn handler_abandoned(&mut self, completion: Completion<Body, usize>) {
        const RULE: &str = "abandoned at its deadline";
        match self.running.take() {
            Some(running) => {
                let timeout = self.scenario.consumer.handler_timeout.get();
                let on_time = timeout.is_some_and(|timeout| {
                    running.duration > timeout && self.now == running.started + timeout
                });
                if !on_time {
                    self.obs.violation(
                        RULE,
                        self.step,
                        format!(
                            "the run for {:?} (started at {:?}, taking {:?}) was abandoned at \
                             {:?} with handler_timeout {timeout:?}",
                            running.key, running.started, running.duration, self.now
                        ),
                    );
                }
                self.obs.timed_out.push(running.key);
            }
            None => self.obs.violation(
                RULE,
                self.step,
                "a run timed out while none was running".into(),
            ),
        }
        if let Some(ack) = completion.ack {
            self.obs.violation(
                RULE,
                self.step,
                format!("an abandoned run was ACKed: {ack:?}"),
            );
        }
        if let Some(body) = completion.next {
            self.start_running(body);
        }
    }

    /// Records a successful run (of the body sent under its key) and schedules the consumer
    /// restarts it triggers.
    fn record_success(&mut self, key: Key, body: Body, switches_at_start: u64) {
        if let Some(record) = self.obs.forged.get_mut(&key) {
            record.successes.push(self.life);
            return;
        }
        let success = Success {
            step: self.step,
            life: self.life,
            switches_at_start,
        };
        if let Some(record) = self.obs.keys.get_mut(&key)
            && record.body == body
        {
            record.successes.push(success);
        }
        if let Some(record) = self.obs.bodies.get_mut(&body) {
            record.successes += 1;
        }
        self.handled += 1;
        for (index, disruption) in self.scenario.disruptions.iter().enumerate() {
            if let Disruption::ConsumerRestart {
                after_handled,
                delay,
            } = *disruption
                && after_handled == self.handled
                && !self.struck[index]
            {
                self.queue.push(self.now + delay, Event::ConsumerRestart);
            }
        }
    }

    /// Puts an ACK on the backward link: dropped, or arriving once or twice.
    fn send_ack(&mut self, producer: usize, ack: Ack) {
        let seq = ack.seq;
        let copies = self.backward.transmit(&mut self.rng);
        let mut arriving = 0;
        for delay in copies.into_iter().flatten() {
            arriving += 1;
            self.queue.push(
                self.now + delay,
                Event::AckArrival {
                    producer,
                    ack: ack.clone(),
                },
            );
        }
        self.trace.record(
            self.now,
            TraceEvent::AckSent {
                producer,
                seq,
                copies: arriving,
            },
        );
    }

    /// Restarts the consumer: `clear()` drops its dedup state, waiting messages and running
    /// handler (the run's end event is ignored), as a fresh core would start. What is on
    /// the forward link at this moment is recorded for the re-run invariant.
    pub(super) fn restart_consumer(&mut self) {
        let mut in_transit: Vec<Key> = self
            .obs
            .keys
            .iter()
            .filter(|(_, record)| record.in_transit > 0)
            .map(|(&key, _)| key)
            .collect();
        in_transit.sort_unstable();
        self.obs.consumer_restarts.push(ConsumerRestartRecord {
            step: self.step,
            in_transit,
        });
        self.restart_cuts_the_running_run();
        self.consumer.clear();
        self.floors.clear();
        self.life += 1;
        self.running = None;
        self.trace.record(self.now, TraceEvent::ConsumerRestarted);
    }
}

/// A consumer decision, for failure messages.
fn describe(step: &Step<Body, usize>) -> String {
    match step {
        Step::Run(_) => "Run".into(),
        Step::Ack(reply_to, ack) => format!("Ack({ack:?} to p{reply_to})"),
        Step::Hold => "Hold".into(),
        Step::DeadLetter(reason, _) => format!("DeadLetter({reason})"),
    }
}
