//! The entity of the compatibility suite's sharded cluster, shared by its node
//! (`node.rs`, built against both releases) and its checks (`main.rs`).

use actix_delivery::persistence::{Decision, EventSourced};
use serde::{Deserialize, Serialize};

/// The sharded cluster's entity: an account and the deposits applied to it, in order.
#[derive(Default, Serialize, Deserialize)]
pub struct Account {
    pub deposits: Vec<u64>,
}

/// The one event of an [`Account`].
#[derive(Serialize, Deserialize)]
pub struct Deposited(pub u64);

impl EventSourced for Account {
    type Command = u64;
    type Event = Deposited;
    type Reply = ();
    type Rejection = String;
    /// The nodes (crate `compat_node`) write the events; the checks (crate `compat`) read them.
    const FORMER_TYPE_NAMES: &'static [&'static str] = &[
        "compat_node::account::Deposited",
        "compat_node::account::Account",
    ];

    fn decide(&self, &deposit: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Deposited(deposit)], ()))
    }

    fn apply(&mut self, Deposited(deposit): &Deposited) {
        self.deposits.push(*deposit);
    }
}

/// The shards of the cluster.
pub const SHARDS: u32 = 8;
