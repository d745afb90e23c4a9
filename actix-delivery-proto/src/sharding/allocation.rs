//! Which node should own which shard, and what a node does about it: a pure function of the
//! live members and the live leases, the same on every node that reads the same table.
//!
//! Rules:
//! - a shard's **desired owner** is the live member with the highest rendezvous score
//!   (a hash of member id and shard): every member computes the same owner without talking to
//!   the others, and a member that joins or leaves moves only the shards it wins or held;
//! - a node **acquires** the shards without a live lease whose desired owner it is (a shard
//!   whose owner died is free once its lease expired);
//! - a node **hands off** the shards it owns whose desired owner is another live member, at
//!   most `max_handoffs` at a time (a rebalance moves a bounded number of shards at once);
//! - a node that does not see itself among the live members (its heartbeat has not landed,
//!   or it is leaving) neither acquires nor hands off.

use std::collections::{BTreeMap, BTreeSet};

use crate::sharding::entity_id::{fnv1a, ShardId};

/// What a node does after a look at the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Free shards it should own: acquire them.
    pub acquire: Vec<ShardId>,
    /// Shards it owns that another member should: hand them off.
    pub hand_off: Vec<ShardId>,
}

/// The live member that should own `shard` (highest rendezvous score), if any.
pub fn desired_owner(shard: ShardId, members: &BTreeSet<String>) -> Option<&str> {
    members
        .iter()
        .max_by_key(|member| score(member, shard))
        .map(String::as_str)
}

/// A member's rendezvous score for a shard: FNV-1a of the member id, mixed with the shard
/// through SplitMix64's finalizer (so that scores of one member spread over the shards).
fn score(member: &str, shard: ShardId) -> u64 {
    let mut x = fnv1a(member.as_bytes()) ^ u64::from(shard.0).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What node `me` should do, given the live `members`, the live leases (`owners`: shard →
/// owner), the shards it holds (`mine`), how many of them it is handing off already, the
/// shard count, and at most how many handoffs run at once.
pub fn plan(
    me: &str,
    members: &BTreeSet<String>,
    owners: &BTreeMap<ShardId, String>,
    mine: &BTreeSet<ShardId>,
    handing_off: usize,
    shards: u32,
    max_handoffs: usize,
) -> Plan {
    if !members.contains(me) {
        return Plan::default();
    }
    let mut plan = Plan::default();
    for shard in (0..shards).map(ShardId) {
        let desired = desired_owner(shard, members);
        let held_by_me = mine.contains(&shard);
        match owners.get(&shard) {
            None if !held_by_me && desired == Some(me) => plan.acquire.push(shard),
            Some(owner) if owner == me && held_by_me && desired != Some(me) => {
                plan.hand_off.push(shard);
            }
            _ => {}
        }
    }
    plan.hand_off
        .truncate(max_handoffs.saturating_sub(handing_off));
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn allocation(members: &BTreeSet<String>, shards: u32) -> BTreeMap<ShardId, String> {
        (0..shards)
            .map(ShardId)
            .map(|s| (s, desired_owner(s, members).unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn every_shard_has_one_desired_owner_and_the_shards_spread_over_the_members() {
        let three = members(&["a#1", "b#2", "c#3"]);
        let owners = allocation(&three, 300);
        for member in &three {
            let owned = owners.values().filter(|o| *o == member).count();
            assert!((70..=130).contains(&owned), "{member}: {owned}");
        }
        assert_eq!(desired_owner(ShardId(0), &BTreeSet::new()), None);
    }

    #[test]
    fn a_member_that_joins_or_leaves_moves_only_the_shards_it_wins_or_held() {
        let three = members(&["a#1", "b#2", "c#3"]);
        let four = members(&["a#1", "b#2", "c#3", "d#4"]);
        let (before, after) = (allocation(&three, 256), allocation(&four, 256));
        for (shard, owner) in &after {
            if owner != "d#4" {
                assert_eq!(
                    &before[shard], owner,
                    "shard {shard} moved between old members"
                );
            }
        }
        let joined = after.values().filter(|o| *o == "d#4").count();
        assert!(
            (40..=90).contains(&joined),
            "d takes about a quarter: {joined}"
        );
    }

    #[test]
    fn a_node_acquires_free_shards_it_should_own_and_hands_off_a_bounded_number() {
        let all = members(&["a#1", "b#2"]);
        let shards = 16;
        let desired = allocation(&all, shards);
        // Nothing is owned: each acquires what it should own.
        let plan_a = plan(
            "a#1",
            &all,
            &BTreeMap::new(),
            &BTreeSet::new(),
            0,
            shards,
            2,
        );
        let expected: Vec<ShardId> = desired
            .iter()
            .filter(|(_, o)| *o == "a#1")
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(plan_a.acquire, expected);
        assert!(plan_a.hand_off.is_empty());
        // a owns everything (b just joined): it hands off b's shards, two at a time.
        let owners: BTreeMap<ShardId, String> = (0..shards)
            .map(|s| (ShardId(s), "a#1".to_string()))
            .collect();
        let mine: BTreeSet<ShardId> = owners.keys().copied().collect();
        let plan_a = plan("a#1", &all, &owners, &mine, 0, shards, 2);
        assert_eq!(plan_a.hand_off.len(), 2);
        assert!(plan_a.hand_off.iter().all(|s| desired[s] == "b#2"));
        assert!(plan_a.acquire.is_empty());
        assert_eq!(
            plan("a#1", &all, &owners, &mine, 2, shards, 2).hand_off,
            [],
            "two handoffs run already"
        );
        // b waits: the shards it should own have a live lease (a's).
        assert_eq!(
            plan("b#2", &all, &owners, &BTreeSet::new(), 0, shards, 2),
            Plan::default()
        );
    }

    #[test]
    fn a_node_that_does_not_see_itself_live_does_nothing() {
        let others = members(&["b#2"]);
        let owners = BTreeMap::from([(ShardId(0), "a#1".to_string())]);
        let mine = BTreeSet::from([ShardId(0)]);
        assert_eq!(
            plan("a#1", &others, &owners, &mine, 0, 4, 4),
            Plan::default()
        );
    }
}
