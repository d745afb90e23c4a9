//! Where shard leases live: the [`LeaseStore`] trait, and [`MemoryLeaseStore`] for tests and
//! for several coordinators in one process. The one for several processes is
//! `PostgresLeaseStore` (feature `postgres`), in the shared journal's database.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::sharding::entity_id::ShardId;

/// The future of a lease store operation.
pub type LeaseFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LeaseError>> + Send + 'a>>;

/// Why a lease store operation failed. The operation may or may not have taken effect: a
/// coordinator treats its leases as valid only as long as their last successful renewal
/// says.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// The store could not be reached, or refused the operation: why (for PostgreSQL, the
    /// server's message and SQLSTATE, or the cause of a failed connection).
    #[error("the lease store failed: {0}")]
    Storage(String),
}

/// A live member: a node of the sharded type, under its id for this start, with the address
/// other nodes reach it at (for transports that look owners up), if any.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// The member's id (`<node name>#<random>`: a restarted node is a new member).
    pub id: String,
    /// Where it is reached.
    pub address: Option<String>,
}

/// A live lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The member that holds it.
    pub owner: String,
    /// Its fencing token: it grows with every acquisition of the shard.
    pub token: u64,
    /// The owner's address, if it is a live member with one.
    pub address: Option<String>,
}

/// What a lease store holds for one sharded type now: its live members and live leases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// The live members.
    pub members: BTreeSet<Member>,
    /// The live leases, by shard.
    pub leases: BTreeMap<ShardId, Lease>,
}

/// A lease as its store holds it, live or not: what an operator reads (see
/// [`LeaseStore::leases`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRecord {
    /// The shard.
    pub shard: ShardId,
    /// The member that holds it, or last held it.
    pub owner: String,
    /// Its fencing token.
    pub token: u64,
    /// The time left on it by the store's clock, in ms: negative once it has expired; `None`
    /// when it was released, or the store cannot tell.
    pub expires_in_ms: Option<i64>,
}

/// A store of shard leases with fencing tokens: one owner per shard at a time, as long as it
/// renews its lease before the lease's TTL ends; and of members, each live as long as it
/// renews its heartbeat. Every operation names the sharded type (`namespace`: its entity
/// type), so that types share a store. Expiry is judged by the store's clock alone. A shard
/// (or lease) named more than once in one call counts as named once: it is taken, renewed or
/// released once and answered once.
pub trait LeaseStore: Send + Sync + 'static {
    /// Makes `member` live for `ttl` (again).
    fn heartbeat(&self, namespace: &str, member: &Member, ttl: Duration) -> LeaseFuture<'_, ()>;

    /// Gives `owner` the shards among `shards` that have no live lease, for `ttl`; returns
    /// those it got, each with its new token.
    fn acquire(
        &self,
        namespace: &str,
        shards: &[ShardId],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<(ShardId, u64)>>;

    /// Extends `owner`'s leases (shard, token) by `ttl` from now; returns those extended (a
    /// lease taken by another node since has a newer token and is not).
    fn renew(
        &self,
        namespace: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<ShardId>>;

    /// Ends `owner`'s leases (shard, token) now: the shards are free.
    fn release(
        &self,
        namespace: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
    ) -> LeaseFuture<'_, ()>;

    /// Removes `member`: it is no longer live.
    fn leave(&self, namespace: &str, member: &str) -> LeaseFuture<'_, ()>;

    /// The live members and leases.
    fn view(&self, namespace: &str) -> LeaseFuture<'_, LeaseView>;

    /// Every lease of `namespace` the store holds, live or expired, in shard order, with the
    /// time left on each by the store's clock. Read-only: what an operator reads (the admin
    /// console's shard map). The default lists the live leases of [`view`](Self::view), the
    /// time left on them unknown.
    fn leases(&self, namespace: &str) -> LeaseFuture<'_, Vec<LeaseRecord>> {
        let view = self.view(namespace);
        Box::pin(async move {
            let leases = view.await?.leases.into_iter();
            let records = leases.map(|(shard, lease)| LeaseRecord {
                shard,
                owner: lease.owner,
                token: lease.token,
                expires_in_ms: None,
            });
            Ok(records.collect())
        })
    }
}

/// A [`LeaseStore`] in memory, on Tokio's clock (so that `tokio::time::pause()` runs leases
/// in virtual time): for tests, and for several coordinators in one process. Clones share
/// one store. [`set_available`](Self::set_available) simulates an unreachable store.
#[derive(Clone, Debug, Default)]
pub struct MemoryLeaseStore(Arc<Mutex<MemoryLeases>>);

#[derive(Debug, Default)]
struct MemoryLeases {
    unavailable: bool,
    /// (namespace, member) → (address, expiry).
    members: BTreeMap<(String, String), (Option<String>, tokio::time::Instant)>,
    /// (namespace, shard) → (owner, token, expiry).
    leases: BTreeMap<(String, ShardId), (String, u64, tokio::time::Instant)>,
}

impl MemoryLeaseStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// While `false`, every operation fails with [`LeaseError::Storage`] (and changes
    /// nothing), as when a database cannot be reached.
    pub fn set_available(&self, available: bool) {
        self.state().unavailable = !available;
    }

    fn state(&self) -> MutexGuard<'_, MemoryLeases> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `operation` on the state now, unless the store is unavailable.
    fn run<T: Send + 'static>(
        &self,
        operation: impl FnOnce(&mut MemoryLeases, tokio::time::Instant) -> T,
    ) -> LeaseFuture<'_, T> {
        let mut state = self.state();
        let result = if state.unavailable {
            Err(LeaseError::Storage(
                "the memory lease store is unavailable".into(),
            ))
        } else {
            Ok(operation(&mut state, tokio::time::Instant::now()))
        };
        Box::pin(std::future::ready(result))
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn heartbeat(&self, namespace: &str, member: &Member, ttl: Duration) -> LeaseFuture<'_, ()> {
        let key = (namespace.to_owned(), member.id.clone());
        let address = member.address.clone();
        self.run(move |state, now| {
            state.members.insert(key, (address, now + ttl));
        })
    }

    fn acquire(
        &self,
        namespace: &str,
        shards: &[ShardId],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<(ShardId, u64)>> {
        self.run(move |state, now| {
            let mut acquired = Vec::new();
            for &shard in shards {
                let lease = state.leases.entry((namespace.to_owned(), shard));
                let lease = lease.or_insert((String::new(), 0, now));
                if lease.2 > now {
                    continue; // live
                }
                *lease = (owner.to_owned(), lease.1 + 1, now + ttl);
                acquired.push((shard, lease.1));
            }
            acquired
        })
    }

    fn renew(
        &self,
        namespace: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
        ttl: Duration,
    ) -> LeaseFuture<'_, Vec<ShardId>> {
        self.run(move |state, now| {
            let mut renewed = BTreeSet::new();
            for &(shard, token) in leases {
                if let Some(lease) = state.leases.get_mut(&(namespace.to_owned(), shard))
                    && lease.0 == owner
                    && lease.1 == token
                {
                    lease.2 = now + ttl;
                    renewed.insert(shard);
                }
            }
            renewed.into_iter().collect()
        })
    }

    fn release(
        &self,
        namespace: &str,
        leases: &[(ShardId, u64)],
        owner: &str,
    ) -> LeaseFuture<'_, ()> {
        self.run(move |state, now| {
            for &(shard, token) in leases {
                if let Some(lease) = state.leases.get_mut(&(namespace.to_owned(), shard))
                    && lease.0 == owner
                    && lease.1 == token
                {
                    lease.2 = now;
                }
            }
        })
    }

    fn leave(&self, namespace: &str, member: &str) -> LeaseFuture<'_, ()> {
        let key = (namespace.to_owned(), member.to_owned());
        self.run(move |state, _| {
            state.members.remove(&key);
        })
    }

    fn view(&self, namespace: &str) -> LeaseFuture<'_, LeaseView> {
        self.run(move |state, now| {
            let members: BTreeMap<&str, &Option<String>> = state
                .members
                .iter()
                .filter(|((ns, _), (_, expiry))| ns == namespace && *expiry > now)
                .map(|((_, member), (address, _))| (member.as_str(), address))
                .collect();
            let leases = state
                .leases
                .iter()
                .filter(|((ns, _), (_, _, expiry))| ns == namespace && *expiry > now)
                .map(|((_, shard), (owner, token, _))| {
                    let address = members.get(owner.as_str()).and_then(|a| (*a).clone());
                    let lease = Lease {
                        owner: owner.clone(),
                        token: *token,
                        address,
                    };
                    (*shard, lease)
                })
                .collect();
            let members = members
                .into_iter()
                .map(|(id, address)| Member {
                    id: id.to_owned(),
                    address: address.clone(),
                })
                .collect();
            LeaseView { members, leases }
        })
    }

    fn leases(&self, namespace: &str) -> LeaseFuture<'_, Vec<LeaseRecord>> {
        self.run(move |state, now| {
            let leases = state.leases.iter();
            let leases = leases.filter(|((ns, _), _)| ns == namespace);
            leases
                .map(|((_, shard), (owner, token, expiry))| {
                    let left = if *expiry >= now {
                        expiry.duration_since(now).as_millis() as i64
                    } else {
                        -(now.duration_since(*expiry).as_millis() as i64)
                    };
                    LeaseRecord {
                        shard: *shard,
                        owner: owner.clone(),
                        token: *token,
                        expires_in_ms: Some(left),
                    }
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str) -> Member {
        Member {
            id: id.into(),
            address: Some(format!("{id}:1")),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_has_one_owner_until_it_expires_and_the_next_one_gets_a_newer_token() {
        let store = MemoryLeaseStore::new();
        let ttl = Duration::from_secs(10);
        let shards = [ShardId(0), ShardId(1)];
        store.heartbeat("t", &member("a"), ttl).await.unwrap();
        assert_eq!(
            store.acquire("t", &shards, "a", ttl).await.unwrap(),
            [(ShardId(0), 1), (ShardId(1), 1)]
        );
        assert!(store
            .acquire("t", &shards, "b", ttl)
            .await
            .unwrap()
            .is_empty());
        assert!(
            store.acquire("u", &shards, "b", ttl).await.unwrap().len() == 2,
            "another type's shards"
        );
        let view = store.view("t").await.unwrap();
        assert_eq!(view.leases[&ShardId(0)].address.as_deref(), Some("a:1"));
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(
            store
                .renew("t", &[(ShardId(0), 1)], "a", ttl)
                .await
                .unwrap(),
            [ShardId(0)]
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Shard 1 expired (not renewed), shard 0 did not.
        assert_eq!(
            store.acquire("t", &shards, "b", ttl).await.unwrap(),
            [(ShardId(1), 2)]
        );
        assert!(
            store
                .renew("t", &[(ShardId(1), 1)], "a", ttl)
                .await
                .unwrap()
                .is_empty(),
            "a's token is stale"
        );
        store.release("t", &[(ShardId(0), 1)], "a").await.unwrap();
        let view = store.view("t").await.unwrap();
        assert_eq!(view.leases.keys().collect::<Vec<_>>(), [&ShardId(1)]);
        assert!(view.members.is_empty(), "a's heartbeat expired");
        store.set_available(false);
        assert!(store.view("t").await.is_err());
    }
}
