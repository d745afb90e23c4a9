//! A node's own leases: which shards it holds, under which fencing token, until when it may
//! act on them, and when a lease is lost. Pure: the shell asks the lease store and reports
//! what it answered, with the local time each request was sent.
//!
//! Rules:
//! - a lease acquired or renewed by a request sent at `t` is valid here until
//!   `t + ttl − ttl/10`: the store dates its expiry from when it ran the request (after `t`),
//!   so the node stops acting on a shard before the store can give it to another node, with
//!   a tenth of the TTL to spare for clocks that run at slightly different rates;
//! - a lease is **lost** when a renewal does not return it (another node holds it under a
//!   newer token: it expired and was taken), or when its validity ends before a renewal
//!   returned (the store could not be reached): the node stops acting on the shard at once;
//! - a lease being handed off is still renewed (nobody else may take the shard before its
//!   entities have stopped) until it is released.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::sharding::entity_id::ShardId;

/// One lease this node holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The fencing token the store gave with it (it grows with every acquisition of the
    /// shard, by any node).
    pub token: u64,
    /// Until when this node may act on the shard.
    pub valid_until: Instant,
    /// Whether the shard is being handed off (its entities stopping).
    pub handing_off: bool,
}

/// The leases of one node.
#[derive(Debug)]
pub struct LeaseBook {
    ttl: Duration,
    held: BTreeMap<ShardId, Held>,
}

impl LeaseBook {
    /// No lease yet; leases last `ttl` in the store.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            held: BTreeMap::new(),
        }
    }

    fn valid_after(&self, requested_at: Instant) -> Instant {
        requested_at + self.ttl - self.ttl / 10
    }

    /// The store gave `shard` to this node under `token`, for a request sent at
    /// `requested_at`.
    pub fn handle_acquired(&mut self, shard: ShardId, token: u64, requested_at: Instant) {
        let held = Held {
            token,
            valid_until: self.valid_after(requested_at),
            handing_off: false,
        };
        self.held.insert(shard, held);
    }

    /// What to renew: every lease held, with its token.
    pub fn renewals(&self) -> Vec<(ShardId, u64)> {
        self.held.iter().map(|(s, h)| (*s, h.token)).collect()
    }

    /// A renewal of `asked` (sent at `requested_at`) returned `renewed`: those are valid
    /// longer; the others asked for are lost (returned, no longer held). A lease acquired
    /// since the request was sent is left alone.
    pub fn handle_renewed(
        &mut self,
        asked: &[(ShardId, u64)],
        renewed: &[ShardId],
        requested_at: Instant,
    ) -> Vec<(ShardId, u64)> {
        let valid_until = self.valid_after(requested_at);
        let renewed: BTreeSet<ShardId> = renewed.iter().copied().collect();
        let mut lost = Vec::new();
        for &(shard, token) in asked {
            let Some(held) = self.held.get_mut(&shard) else {
                continue; // released or lost meanwhile
            };
            if held.token != token {
                continue; // acquired anew meanwhile
            }
            if renewed.contains(&shard) {
                held.valid_until = held.valid_until.max(valid_until);
            } else {
                self.held.remove(&shard);
                lost.push((shard, token));
            }
        }
        lost
    }

    /// The leases whose validity ended by `now` (their renewals did not come back in time):
    /// lost, no longer held.
    pub fn poll_expired(&mut self, now: Instant) -> Vec<(ShardId, u64)> {
        let expired: Vec<(ShardId, u64)> = self
            .held
            .iter()
            .filter(|(_, h)| h.valid_until <= now)
            .map(|(s, h)| (*s, h.token))
            .collect();
        for (shard, _) in &expired {
            self.held.remove(shard);
        }
        expired
    }

    /// When the first lease ends unless renewed.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.held.values().map(|h| h.valid_until).min()
    }

    /// Marks `shard` as being handed off; false if it is not held (or is already).
    pub fn begin_handoff(&mut self, shard: ShardId) -> bool {
        match self.held.get_mut(&shard) {
            Some(held) if !held.handing_off => {
                held.handing_off = true;
                true
            }
            _ => false,
        }
    }

    /// Gives `shard` up (handed off, or dropped): its token to release it in the store, if it
    /// was held.
    pub fn release(&mut self, shard: ShardId) -> Option<u64> {
        self.held.remove(&shard).map(|h| h.token)
    }

    /// The lease of `shard`, if held.
    pub fn get(&self, shard: ShardId) -> Option<&Held> {
        self.held.get(&shard)
    }

    /// The shards held.
    pub fn shards(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.held.keys().copied()
    }

    /// How many shards are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no shard is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// How many held shards are being handed off.
    pub fn handing_off(&self) -> usize {
        self.held.values().filter(|h| h.handing_off).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn a_lease_is_valid_for_the_ttl_less_a_tenth_from_when_its_request_was_sent() {
        let t0 = Instant::now();
        let mut book = LeaseBook::new(TTL);
        book.handle_acquired(ShardId(3), 7, t0);
        assert_eq!(book.next_expiry(), Some(t0 + Duration::from_secs(9)));
        assert!(book
            .poll_expired(t0 + Duration::from_millis(8_999))
            .is_empty());
        let renewed_at = t0 + Duration::from_secs(3);
        let lost = book.handle_renewed(&[(ShardId(3), 7)], &[ShardId(3)], renewed_at);
        assert!(lost.is_empty());
        assert_eq!(
            book.next_expiry(),
            Some(renewed_at + Duration::from_secs(9))
        );
        assert_eq!(
            book.poll_expired(renewed_at + Duration::from_secs(9)),
            [(ShardId(3), 7)],
            "no renewal came back in time"
        );
        assert!(book.is_empty());
    }

    #[test]
    fn a_lease_a_renewal_does_not_return_is_lost_and_one_acquired_meanwhile_is_kept() {
        let t0 = Instant::now();
        let mut book = LeaseBook::new(TTL);
        book.handle_acquired(ShardId(1), 1, t0);
        book.handle_acquired(ShardId(2), 5, t0);
        let asked = book.renewals();
        assert_eq!(asked, [(ShardId(1), 1), (ShardId(2), 5)]);
        // While the renewal was in flight, shard 2 was lost and acquired again (token 6).
        book.release(ShardId(2));
        book.handle_acquired(ShardId(2), 6, t0 + Duration::from_secs(1));
        let lost = book.handle_renewed(&asked, &[ShardId(1)], t0 + Duration::from_secs(2));
        assert!(
            lost.is_empty(),
            "shard 2's new lease is not the one asked for"
        );
        let lost = book.handle_renewed(&[(ShardId(1), 1)], &[], t0 + Duration::from_secs(3));
        assert_eq!(lost, [(ShardId(1), 1)], "another node took it");
        assert_eq!(book.shards().collect::<Vec<_>>(), [ShardId(2)]);
    }

    #[test]
    fn a_shard_being_handed_off_is_still_renewed_until_released() {
        let t0 = Instant::now();
        let mut book = LeaseBook::new(TTL);
        book.handle_acquired(ShardId(4), 2, t0);
        assert!(book.begin_handoff(ShardId(4)));
        assert!(!book.begin_handoff(ShardId(4)), "once");
        assert_eq!(book.handing_off(), 1);
        assert_eq!(book.renewals(), [(ShardId(4), 2)]);
        assert_eq!(book.release(ShardId(4)), Some(2));
        assert_eq!(book.release(ShardId(4)), None);
    }
}
