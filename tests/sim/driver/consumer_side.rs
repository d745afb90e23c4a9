//! The simulator's consumer side: deliveries reaching the consumer, handler runs and their
//! outcomes, ACKs sent back, and consumer restarts.

use std::time::Duration;

use actix_delivery::protocol::consumer::{Completion, HandlerOutcome, Inbound, Step};
use actix_delivery::protocol::envelope::{Ack, Header};
use actix_delivery::protocol::producer::Transmission;
use rand::Rng;

use super::{short, Body, Event, World};
use crate::sim::observe::{ConsumerRestartRecord, Key, Success};
use crate::sim::scenario::Disruption;
use crate::sim::trace::TraceEvent;

impl World<'_> {
    /// A copy of a delivery reaches the consumer, which decides what to do with it.
    pub(super) fn deliver(&mut self, producer: usize, transmission: Transmission<Body>) {
        let Transmission { header, body, .. } = transmission;
        let key = Key {
            producer,
            incarnation: header.incarnation.as_u128(),
            seq: header.seq,
        };
        let p = &mut self.producers[producer];
        if p.seen_incarnation
            .is_some_and(|seen| seen != header.incarnation)
        {
            p.incarnation_switches += 1;
        }
        p.seen_incarnation = Some(header.incarnation);
        let switches = p.incarnation_switches;
        let record = self.obs.keys.get_mut(&key).expect("transmitted before");
        record.in_transit -= 1;
        if record
            .first_arrivals
            .last()
            .is_none_or(|&(life, _)| life != self.life)
        {
            record.first_arrivals.push((self.life, switches));
        }
        let incarnation = short(header.incarnation);
        let inbound = Inbound {
            header,
            body,
            reply_to: Some(producer),
        };
        let now = self.instant();
        let step = match self.consumer.handle_delivery(inbound, now) {
            Step::Run(body) => {
                self.start_running(body);
                "run"
            }
            Step::Ack(reply_to, ack) => {
                self.obs.re_acks += 1;
                self.send_ack(reply_to, ack);
                "duplicate, re-ACK"
            }
            Step::Hold => {
                self.obs.holds += 1;
                "hold"
            }
            Step::DeadLetter(reason, _) => {
                self.obs.violation(
                    self.step,
                    format!("{key:?} refused as dead letter: {reason}"),
                );
                "dead letter"
            }
        };
        self.trace.record(
            self.now,
            TraceEvent::Arrived {
                producer,
                incarnation,
                seq: key.seq,
                step,
            },
        );
    }

    /// The key of a message the consumer names.
    fn key_of(&self, info: &Header) -> Key {
        let producer = self
            .producers
            .iter()
            .position(|p| p.id == info.producer_id)
            .unwrap_or_else(|| panic!("the consumer invented producer {:?}", info.producer_id));
        Key {
            producer,
            incarnation: info.incarnation.as_u128(),
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
        if let Some((running, _)) = self.running {
            self.obs.violation(
                self.step,
                format!("handler started for {key:?} while the one for {running:?} runs"),
            );
        }
        self.runs += 1;
        self.running = Some((key, self.runs));
        let sent = self.obs.keys.get(&key).map(|record| record.body);
        if sent != Some(body) {
            self.obs.violation(
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
        let duration = self.rng.random_range(Duration::ZERO..=handler.max_duration);
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
                switches_at_start: self.producers[key.producer].incarnation_switches,
                header: info,
                body,
                outcome,
            },
        );
    }

    /// A handler run ends: the consumer learns the outcome (unless it restarted, or abandoned
    /// the run, meanwhile).
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
        let current = life == self.life && self.running.is_some_and(|(_, r)| r == run);
        self.trace.record(
            self.now,
            TraceEvent::HandlerEnded {
                producer: key.producer,
                seq: key.seq,
                succeeded,
                current,
            },
        );
        if !current {
            // The consumer restarted, or timed the run out, while it ran: its future is gone.
            self.obs.abandoned_runs += 1;
            return;
        }
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
                        self.step,
                        format!("handler for {key:?} succeeded, ACK {ack:?} to p{reply_to}"),
                    );
                }
                self.send_ack(reply_to, ack);
            }
            (None, false) => {}
            (ack, _) => self.obs.violation(
                self.step,
                format!("handler for {key:?} succeeded={succeeded}, ACK {ack:?}"),
            ),
        }
        if let Some(body) = completion.next {
            self.start_running(body);
        }
    }

    /// The consumer abandoned the running handler (`handler_timeout`): its end event will be
    /// ignored, and the next waiting message runs.
    pub(super) fn handler_abandoned(&mut self, completion: Completion<Body, usize>) {
        match self.running.take() {
            Some((key, _)) => self.obs.timed_out.push(key),
            None => self
                .obs
                .violation(self.step, "a run timed out while none was running".into()),
        }
        if let Some(ack) = completion.ack {
            self.obs
                .violation(self.step, format!("an abandoned run was ACKed: {ack:?}"));
        }
        if let Some(body) = completion.next {
            self.start_running(body);
        }
    }

    /// Records a successful run and schedules the consumer restarts it triggers.
    fn record_success(&mut self, key: Key, body: Body, switches_at_start: u64) {
        let success = Success {
            step: self.step,
            life: self.life,
            switches_at_start,
        };
        if let Some(record) = self.obs.keys.get_mut(&key) {
            record.successes.push(success);
        }
        if let Some(record) = self.obs.bodies.get_mut(&body) {
            record.successes += 1;
        }
        self.handled += 1;
        for disruption in &self.scenario.disruptions {
            if let Disruption::ConsumerRestart {
                after_handled,
                delay,
            } = *disruption
            {
                if after_handled == self.handled {
                    self.queue.push(self.now + delay, Event::ConsumerRestart);
                }
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
        self.consumer.clear();
        self.life += 1;
        self.running = None;
        self.trace.record(self.now, TraceEvent::ConsumerRestarted);
    }
}
