//! The forger (see [`Forgery`](crate::sim::scenario::Forgery)): it speaks for a victim
//! producer with the victim's id and current incarnation, injecting bursts of deliveries
//! whose `seq == window_start` jumps far above every seq the victim sends, straight into the
//! consumer (no link: it may replay them, it does not lose them). Their ACKs go to the victim,
//! which must ignore them.

use std::time::Duration;

use actix_delivery_proto::protocol::envelope::{Header, MAX_SEQ};
use rand::Rng;

use super::{short, Body, Event, World, FORGED_BODY};
use crate::sim::observe::{ForgedRecord, Key};
use crate::sim::trace::TraceEvent;

/// Replays of a forged delivery reach the consumer up to this long after its first copy.
const REPLAY_SPREAD: Duration = Duration::from_millis(20);

/// Time between consecutive forged seqs of a burst.
const BURST_SPACING: Duration = Duration::from_millis(1);

impl World<'_> {
    /// Producer `producer` transmitted `seq` for the first time: schedules the forgeries of
    /// it that this triggers.
    pub(super) fn trigger_forgeries(&mut self, producer: usize, seq: u64) {
        for (index, forgery) in self.scenario.forgeries.iter().enumerate() {
            if forgery.victim == producer
                && forgery.after_seq == seq
                && !self.forgeries_triggered[index]
            {
                self.forgeries_triggered[index] = true;
                self.queue
                    .push(self.now + forgery.delay, Event::Forge { forgery: index });
            }
        }
    }

    /// Injects forgery number `index`: its burst of forged deliveries for the victim's current
    /// incarnation, each with its copies.
    pub(super) fn forge(&mut self, index: usize) {
        let forgery = self.scenario.forgeries[index];
        let victim = &self.producers[forgery.victim];
        let (id, incarnation) = (victim.id.clone(), victim.core.incarnation());
        // Above every seq the victim ever uses (no incarnation sends more than its messages).
        let above_victim = victim.total as u64 + 1;
        let first = victim
            .highest_seq
            .saturating_add(forgery.jump)
            .max(above_victim)
            .min(MAX_SEQ - forgery.burst + 1);
        self.obs.forgeries += 1;
        self.trace.record(
            self.now,
            TraceEvent::Forged {
                producer: forgery.victim,
                incarnation: short(incarnation),
                seq: first,
                burst: forgery.burst,
            },
        );
        for offset in 0..forgery.burst {
            let key = Key {
                producer: forgery.victim,
                incarnation: incarnation.as_u128(),
                seq: first + offset,
            };
            let body = self.forged_body(key);
            let header = Header {
                producer_id: id.clone(),
                incarnation,
                seq: key.seq,
                window_start: key.seq,
                trace_context: None,
                chunk: None,
            };
            let at = self.now + BURST_SPACING * offset as u32;
            for copy in 0..forgery.copies {
                let replay = if copy == 0 {
                    Duration::ZERO
                } else {
                    self.rng.random_range(Duration::ZERO..=REPLAY_SPREAD)
                };
                self.queue.push(
                    at + replay,
                    Event::ForgedDelivery {
                        victim: forgery.victim,
                        header: header.clone(),
                        body,
                    },
                );
            }
        }
    }

    /// The forged body of `key`: the one forged before for it (the forger replays its own
    /// deliveries), or a new one.
    fn forged_body(&mut self, key: Key) -> Body {
        if let Some(record) = self.obs.forged.get(&key) {
            return record.body;
        }
        if self.obs.keys.contains_key(&key) {
            self.obs.violation(
                "forged keys are not real",
                self.step,
                format!("forged {key:?} is a key the victim transmitted"),
            );
        }
        let body = FORGED_BODY | self.forged_bodies;
        self.forged_bodies += 1;
        self.obs.forged.insert(
            key,
            ForgedRecord {
                body,
                runs: 0,
                successes: Vec::new(),
            },
        );
        body
    }

    /// A forged delivery reaches the consumer.
    pub(super) fn forged_arrives(&mut self, victim: usize, header: Header, body: Body) {
        let key = Key {
            producer: victim,
            incarnation: header.incarnation.as_u128(),
            seq: header.seq,
        };
        self.obs.forged_arrivals += 1;
        self.note_incarnation(victim, &header);
        self.arrive(key, header, body, true);
    }
}
