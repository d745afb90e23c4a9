//! The consumers a node exposes, by name: what an incoming batch is handed to, and which peers
//! may deliver to each. Apart from the receiving side (`inbound.rs`), which reads it, and the
//! node, which fills it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;

use crate::codec::schema::Schemas;
use crate::delivery::message::ReplyTo;
use crate::tcp::frame::DeliveryBatch;
use crate::tcp::peer::Identity;

/// Resolves when the consumer has taken a batch from its mailbox: `true`, or `false` if the
/// consumer is gone (stopped for good: the batch is lost, and retransmitted).
pub(crate) type Dispatched = Pin<Box<dyn Future<Output = bool> + Send>>;

/// What became of a batch handed to an exposed consumer.
pub(crate) struct Handed {
    /// Resolves once the consumer took the batch from its mailbox, its dead letters too
    /// (`None`: the batch was empty).
    pub taken: Option<Dispatched>,
    /// Deliveries whose body did not decode: handed over as dead letters, which count
    /// against the same bound as deliveries.
    pub undecodable: u64,
    /// Why the first of them did not decode, for the log.
    pub why: Option<String>,
}

/// A consumer exposed under a name: decodes the bodies of a batch into its message type.
pub(crate) trait Exposed: Send + Sync {
    /// Hands the batch's deliveries to the consumer, with `reply_to` for their ACKs, reading
    /// their bodies as the consumer's type declares in `schemas`; a delivery whose body
    /// cannot be read becomes a dead letter there (the others are delivered as usual). The
    /// batch was decoded from `frame`: a chunk of a large message is handed over as its view
    /// of it, not a copy.
    fn deliver(
        &self,
        frame: &Bytes,
        batch: &DeliveryBatch<'_>,
        reply_to: &ReplyTo,
        schemas: &Schemas,
    ) -> Handed;
}

/// An exposed consumer and who may deliver to it.
pub(crate) struct Entry {
    pub(crate) consumer: Box<dyn Exposed>,
    /// `None`: every peer the node accepts; otherwise peers with one of these identities.
    pub(crate) identities: Option<Vec<String>>,
}

impl Entry {
    /// Whether a peer with `identity` may deliver here.
    pub(crate) fn admits(&self, identity: Option<&Identity>) -> bool {
        match (&self.identities, identity) {
            (None, _) => true,
            (Some(allowed), Some(names)) => names
                .iter()
                .any(|name| allowed.iter().any(|a| a.eq_ignore_ascii_case(name))),
            (Some(_), None) => false,
        }
    }
}

/// The consumers exposed on a node, by name.
#[derive(Default)]
pub(crate) struct Registry(RwLock<HashMap<String, Arc<Entry>>>);

impl Registry {
    /// The consumer exposed under `name`.
    pub(crate) fn exposed(&self, name: &str) -> Option<Arc<Entry>> {
        self.read().get(name).cloned()
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<Entry>>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The exposed consumers, to change.
    pub(crate) fn exposed_mut(&self) -> RwLockWriteGuard<'_, HashMap<String, Arc<Entry>>> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}
