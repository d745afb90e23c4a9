//! Shards over TCP: a sender finds each shard's owner in the lease table (its address is
//! published with its heartbeat) and sends to the host consumer that owner's node exposes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::Serialize;

use crate::delivery::message::ConsumerRef;
use crate::sharding::entity_id::ShardId;
use crate::sharding::envelope::EntityEnvelope;
use crate::sharding::lease_store::LeaseStore;
use crate::tcp::{NodeHandle, PeerAddr};

/// Where each shard's owner is reached, as a [`LeaseStore`] says: read again every
/// `refresh`, on the arbiter that started it, as long as a clone of it (or a destination made
/// from it) lives. For senders over TCP: host nodes expose their
/// [`EntityHostHandle::consumer`](crate::sharding::EntityHostHandle::consumer) on their
/// [`NodeHandle`](crate::tcp::NodeHandle) under one name and publish their address
/// ([`CoordinatorOptionsBuilder::address`](crate::sharding::CoordinatorOptionsBuilder::address));
/// the coordinator needs no transport then ([`NoTransport`](crate::sharding::NoTransport)):
/// a host refuses deliveries for shards it does not own (no ACK), and they are retransmitted
/// until this directory names the new owner.
#[derive(Clone, Debug)]
pub struct ShardDirectory(Arc<RwLock<BTreeMap<ShardId, String>>>);

impl ShardDirectory {
    /// Starts reading the owners' addresses of `namespace`'s shards from `store`, now and
    /// every `refresh`.
    ///
    /// # Panics
    /// Outside a running Actix system (or arbiter).
    pub fn start(store: Arc<dyn LeaseStore>, namespace: &str, refresh: Duration) -> Self {
        let owners = Arc::new(RwLock::new(BTreeMap::new()));
        let weak = Arc::downgrade(&owners);
        let namespace = namespace.to_owned();
        actix::spawn(async move {
            loop {
                match store.view(&namespace).await {
                    Ok(view) => {
                        let Some(owners) = weak.upgrade() else { return };
                        let addresses = view
                            .leases
                            .into_iter()
                            .filter_map(|(shard, lease)| Some((shard, lease.address?)))
                            .collect();
                        *owners.write().unwrap_or_else(PoisonError::into_inner) = addresses;
                    }
                    Err(error) => {
                        log::warn!("sharding `{namespace}`: reading owners failed: {error}")
                    }
                }
                if weak.strong_count() == 0 {
                    return;
                }
                actix::clock::sleep(refresh).await;
            }
        });
        Self(owners)
    }

    /// The address of `shard`'s owner, if it has one.
    pub fn owner(&self, shard: ShardId) -> Option<String> {
        let owners = self.0.read().unwrap_or_else(PoisonError::into_inner);
        owners.get(&shard).cloned()
    }

    /// Where a sharded producer reaches shard `s`'s entities through `node`: the consumer
    /// exposed as `name` on the node at the address of `s`'s owner now (for
    /// [`ShardedProducerOptions::per_shard`](crate::sharding::ShardedProducerOptions::per_shard)).
    /// A batch for a shard without an owner, or whose owner's address does not parse, is
    /// dropped (and retransmitted by its stream).
    pub fn destination<T: Serialize + Send + 'static>(
        &self,
        node: &NodeHandle,
        name: &str,
    ) -> impl Fn(ShardId) -> ConsumerRef<EntityEnvelope<T>> + Send + Sync + 'static + use<T> {
        let refs: Arc<Mutex<HashMap<String, ConsumerRef<EntityEnvelope<T>>>>> = Arc::default();
        let (directory, node, name) = (self.clone(), node.clone(), name.to_owned());
        move |shard| {
            let (directory, node, name, refs) =
                (directory.clone(), node.clone(), name.clone(), refs.clone());
            ConsumerRef::from_fn(move |deliveries| {
                let Some(address) = directory.owner(shard) else {
                    return; // moving: retransmitted once it has an owner
                };
                let mut refs = refs.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(target) = refs.get(&address) {
                    target.do_send_all(deliveries.into_iter());
                    return;
                }
                let target = address
                    .parse::<PeerAddr>()
                    .map_err(|e| e.to_string())
                    .and_then(|peer| node.consumer_ref(peer, &name).map_err(|e| e.to_string()));
                match target {
                    Ok(target) => {
                        target.do_send_all(deliveries.into_iter());
                        refs.insert(address, target);
                    }
                    Err(error) => log::warn!("shard {shard}: owner address {address:?}: {error}"),
                }
            })
        }
    }
}
