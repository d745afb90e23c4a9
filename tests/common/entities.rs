//! Small event-sourced entities shared by the persistence tests.

use std::collections::BTreeMap;

use actix_delivery::journal::PersistenceId;
use actix_delivery::persistence::{Decision, EventSourced};
use serde::{Deserialize, Serialize};

/// A ledger: how often each id was applied, and how many applications in all.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    pub applied: BTreeMap<u64, u32>,
    pub total: i64,
}

/// Apply an id (persists one event), or read the total.
#[derive(Debug)]
pub enum Op {
    Apply(u64),
    Total,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Applied(pub u64);

impl EventSourced for Ledger {
    type Command = Op;
    type Event = Applied;
    type Reply = i64;
    type Rejection = String;

    fn decide(&self, command: &Op) -> Result<Decision<Self>, String> {
        match *command {
            Op::Apply(id) => Ok(Decision::persist([Applied(id)], self.total + 1)),
            Op::Total => Ok(Decision::reply(self.total)),
        }
    }

    fn apply(&mut self, Applied(id): &Applied) {
        *self.applied.entry(*id).or_default() += 1;
        self.total += 1;
    }
}

pub fn ledger_id() -> PersistenceId {
    PersistenceId::new("ledger").unwrap()
}

/// Orders placed; each places one event and sends one [`Ship`] through its outbox's
/// `shipping` destination.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Orders {
    pub placed: Vec<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Placed(pub u64);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ship(pub u64);

impl EventSourced for Orders {
    type Command = u64;
    type Event = Placed;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &order: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Placed(order)], ()).deliver("shipping", &Ship(order)))
    }

    fn apply(&mut self, Placed(order): &Placed) {
        self.placed.push(*order);
    }
}

pub fn orders_id() -> PersistenceId {
    PersistenceId::new("orders").unwrap()
}

/// The commands an entity applied, in the order it applied them.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Sequence(pub Vec<u64>);

#[derive(Debug, Serialize, Deserialize)]
pub struct Appended(pub u64);

impl EventSourced for Sequence {
    type Command = u64;
    type Event = Appended;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &command: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Appended(command)], ()))
    }

    fn apply(&mut self, Appended(command): &Appended) {
        self.0.push(*command);
    }
}
