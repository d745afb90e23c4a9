//! The simulator's producer side: offering messages, draining a producer's transmissions
//! and settlements, ACK arrivals (forged ones must be ignored), producer restarts, and the
//! window check.

use std::time::Duration;

use actix_delivery_proto::error::DeliveryError;
use actix_delivery_proto::protocol::envelope::{Ack, Incarnation};
use actix_delivery_proto::protocol::producer::Transmission;
use rand::Rng;

use super::{short, Body, Event, World};
use crate::sim::observe::{BodyRecord, Key, KeyRecord};
use crate::sim::scenario::Disruption;
use crate::sim::trace::TraceEvent;

impl World<'_> {
    /// Offers the producer its next message and schedules the one after. A crashed durable
    /// producer's next offer waits for its restart.
    pub(super) fn offer(&mut self, producer: usize) {
        if let Some(until) = self.down_until(producer) {
            self.queue.push(until, Event::Offer { producer });
            return;
        }
        let p = &mut self.producers[producer];
        let body = ((producer as u64) << 32) | p.offered as u64;
        p.offered += 1;
        let more = p.offered < p.total;
        self.obs.bodies.insert(
            body,
            BodyRecord {
                producer,
                ..BodyRecord::default()
            },
        );
        self.trace
            .record(self.now, TraceEvent::Offered { producer, body });
        if self.producers[producer].unit.is_some() {
            self.offer_durable(producer, body);
        } else {
            self.send(producer, body);
        }
        if more {
            let traffic = &self.scenario.traffic;
            let mut gap = self.rng.random_range(Duration::ZERO..=traffic.max_gap);
            if self.rng.random_bool(traffic.pause_probability) {
                gap += traffic.pause;
            }
            self.queue.push(self.now + gap, Event::Offer { producer });
        }
    }

    /// Hands `body` to producer `producer` and carries out what it asks.
    fn send(&mut self, producer: usize, body: Body) {
        self.hand_over(producer, body);
        self.flush_producer(producer);
    }

    /// Gives `body` to the producer core (which must accept it: the pending queue is large).
    fn hand_over(&mut self, producer: usize, body: Body) {
        if let Some(record) = self.obs.bodies.get_mut(&body) {
            record.transmissions_before = record.transmissions;
        }
        if self.producers[producer]
            .core
            .handle_send(body, body)
            .is_err()
        {
            self.obs.violation(
                "no refused sends",
                self.step,
                format!("p{producer} refused body {body:#x} (pending queue full)"),
            );
        }
    }

    /// Drains the producer's transmissions and settlements; re-sends the messages a restart
    /// settled with `ProducerStopped` (as new messages, as a user would).
    pub(super) fn flush_producer(&mut self, producer: usize) {
        loop {
            let now = self.instant();
            while let Some(transmission) = self.producers[producer].core.poll_transmit(now) {
                self.transmit(producer, transmission);
            }
            let mut stopped = Vec::new();
            while let Some((body, result)) = self.producers[producer].core.poll_settled() {
                if self.settle(producer, body, result) {
                    stopped.push(body);
                }
            }
            if stopped.is_empty() {
                return;
            }
            for body in stopped {
                self.hand_over(producer, body);
            }
        }
    }

    /// Puts a delivery on the forward link: dropped, or arriving once or twice.
    pub(super) fn transmit(&mut self, producer: usize, transmission: Transmission<Body>) {
        let header = &transmission.header;
        let key = Key {
            producer,
            incarnation: header.incarnation.as_u128(),
            seq: header.seq,
        };
        let body = transmission.body;
        if header.producer_id != self.producers[producer].id {
            self.obs.violation(
                "producer id",
                self.step,
                format!("p{producer} transmitted under id {:?}", header.producer_id),
            );
        }
        self.current_key.insert(body, key);
        let resent = match self.producers[producer].unit {
            Some(unit) => self.check_durable_transmission(producer, unit, &transmission),
            None => false,
        };
        if let Some(record) = self.obs.bodies.get_mut(&body) {
            record.transmissions += 1;
        }
        if key.seq > self.producers[producer].highest_seq {
            self.producers[producer].highest_seq = key.seq;
            self.trigger_forgeries(producer, key.seq);
        }
        let copies: Vec<Duration> = self
            .forward
            .transmit(&mut self.rng)
            .into_iter()
            .flatten()
            .collect();
        let record = self.obs.keys.entry(key).or_insert(KeyRecord::new(body));
        record.in_transit += copies.len() as u32;
        if record.body != body {
            let first = record.body;
            self.obs.violation(
                "one body per key",
                self.step,
                format!("{key:?} transmitted with body {body:#x}, earlier with {first:#x}"),
            );
        }
        self.trace.record(
            self.now,
            TraceEvent::Transmitted {
                producer,
                incarnation: short(header.incarnation),
                seq: key.seq,
                window_start: header.window_start,
                copies: copies.len(),
            },
        );
        for delay in copies {
            self.queue.push(
                self.now + delay,
                Event::Delivery {
                    producer,
                    transmission: transmission.clone(),
                    resent,
                },
            );
        }
    }

    /// Records a settlement; returns whether the body must be re-sent.
    fn settle(&mut self, producer: usize, body: Body, result: Result<(), DeliveryError>) -> bool {
        let text = match &result {
            Ok(()) => "ok",
            Err(DeliveryError::ProducerStopped) => "producer stopped",
            Err(DeliveryError::StoppedUnconfirmed) => "producer stopped, unconfirmed",
            Err(DeliveryError::GaveUp { .. }) => "gave up",
            Err(_) => "refused",
        };
        self.trace.record(
            self.now,
            TraceEvent::Settled {
                producer,
                body,
                result: text,
            },
        );
        let Some(record) = self.obs.bodies.get_mut(&body) else {
            self.obs.violation(
                "settled exactly once",
                self.step,
                format!("p{producer} settled body {body:#x}, which it was never given"),
            );
            return false;
        };
        match result {
            Ok(()) => {
                record.ok += 1;
                record.acked += 1;
                self.confirmed_for_good(body);
                self.producers[producer].confirmed += 1;
                self.trigger_producer_restart(producer);
                false
            }
            Err(stopped @ (DeliveryError::ProducerStopped | DeliveryError::StoppedUnconfirmed)) => {
                record.stopped += 1;
                let sent = record.transmissions > record.transmissions_before;
                if sent && stopped == DeliveryError::ProducerStopped {
                    self.obs.violation(
                        "stopped before it was sent",
                        self.step,
                        format!("p{producer} body {body:#x}: sent, then settled ProducerStopped"),
                    );
                }
                true
            }
            Err(DeliveryError::GaveUp { attempts }) => {
                record.gave_up += 1;
                self.settled_for_good();
                if self.scenario.producer.max_attempts.get() != Some(attempts) {
                    self.obs.violation(
                        "max_attempts",
                        self.step,
                        format!("body {body:#x} given up after {attempts} attempts"),
                    );
                }
                false
            }
            Err(other) => {
                record.other += 1;
                self.settled_for_good();
                self.obs.violation(
                    "settled exactly once",
                    self.step,
                    format!("body {body:#x} settled with {other:?}"),
                );
                false
            }
        }
    }

    /// Counts the final confirmation of `body`, and notes it for the key it was last sent
    /// under (rule **settled exactly once**: a key is confirmed once).
    pub(super) fn confirmed_for_good(&mut self, body: Body) {
        self.settled_for_good();
        let key = self.current_key[&body];
        let record = self.obs.keys.get_mut(&key).expect("transmitted before");
        if record.confirmed_at.replace(self.step).is_some() {
            self.obs.violation(
                "settled exactly once",
                self.step,
                format!("{key:?} confirmed twice"),
            );
        }
    }

    /// Counts a final settlement (progress).
    pub(super) fn settled_for_good(&mut self) {
        self.settled += 1;
        self.last_settled = (self.step, self.now);
    }

    /// An ACK reaches its producer. Rule **forged ACKs are ignored**: the ACK of a forged
    /// delivery confirms nothing.
    pub(super) fn ack_arrives(&mut self, producer: usize, ack: &Ack) {
        let down = self.down_until(producer).is_some();
        self.obs.acks_while_down += u64::from(down);
        // A crashed producer's process is gone: the ACK is lost.
        let acted_on = !down && self.producers[producer].core.handle_ack(ack);
        let key = Key {
            producer,
            incarnation: ack.incarnation.as_u128(),
            seq: ack.seq,
        };
        if acted_on && self.obs.forged.contains_key(&key) {
            self.obs.violation(
                "forged ACKs are ignored",
                self.step,
                format!("p{producer} acted on the ACK of forged {key:?}"),
            );
        }
        self.trace.record(
            self.now,
            TraceEvent::AckArrived {
                producer,
                seq: ack.seq,
                acted_on,
            },
        );
        match self.producers[producer].unit {
            // Its shell flushes only when the ACK was acted on.
            Some((unit, _)) if acted_on => {
                self.flush_unit(unit);
            }
            Some(_) => {}
            None => self.flush_producer(producer),
        }
    }

    /// Restarts a producer with a fresh incarnation; its unsettled messages are re-sent.
    pub(super) fn restart_producer(&mut self, producer: usize) {
        let value: u128 = self.rng.random();
        let id_index = self.producers[producer].id_index;
        assert!(
            self.owners.insert((value, id_index), producer).is_none(),
            "incarnations collide"
        );
        let incarnation = Incarnation::from_u128(value);
        self.producers[producer].core.restart(incarnation);
        self.producers[producer].highest_seq = 0;
        self.obs.producer_restarts += 1;
        self.trace.record(
            self.now,
            TraceEvent::ProducerRestarted {
                producer,
                incarnation: short(incarnation),
            },
        );
        self.flush_producer(producer);
    }

    /// Schedules the producer restarts that this producer's latest confirmation triggers.
    fn trigger_producer_restart(&mut self, producer: usize) {
        let confirmed = self.producers[producer].confirmed;
        for disruption in &self.scenario.disruptions {
            if let Disruption::ProducerRestart {
                producer: target,
                after_confirmed,
                delay,
            } = *disruption
                && target == producer
                && after_confirmed == confirmed
            {
                self.queue
                    .push(self.now + delay, Event::ProducerRestart { producer });
            }
        }
    }

    /// In-flight never exceeds the window, after every step.
    pub(super) fn check_windows(&mut self) {
        for (index, p) in self.producers.iter().enumerate() {
            let in_flight = p.core.stats().in_flight;
            if in_flight > p.window_size {
                self.obs.violation(
                    "window",
                    self.step,
                    format!(
                        "p{index} has {in_flight} messages in flight, window is {}",
                        p.window_size
                    ),
                );
            }
        }
    }
}
