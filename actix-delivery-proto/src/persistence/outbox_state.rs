//! The durable state of a persistent entity's outbox: per destination, the deliveries recorded
//! and not yet confirmed (with their encoded messages), and the identity they are sent under.
//! Part of the entity's recovered state and snapshots; changed only by journal entries (or by
//! the batch about to be appended, so a snapshot taken with it is exact).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::protocol::envelope::Incarnation;

/// One delivery as recorded in a journal entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    /// The lane (destination) it went to.
    pub destination: String,
    /// Its seq in that lane.
    pub seq: u64,
    /// The encoded message.
    pub message: Vec<u8>,
}

/// What one destination's lane has recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneState {
    /// The seq the next delivery gets (from 1).
    pub next_seq: u64,
    /// The encoded messages sent and not confirmed, by seq.
    pub unconfirmed: BTreeMap<u64, Vec<u8>>,
    /// Confirmed, with the record in an append not yet committed (not in snapshots: a
    /// snapshot is taken with its batch, whose confirmations it already counts).
    #[serde(skip)]
    pub recording: BTreeSet<u64>,
}

impl LaneState {
    /// Every seq below this one is durably confirmed.
    pub fn durably_confirmed_below(&self) -> u64 {
        let first = |set: Option<&u64>| set.copied().unwrap_or(self.next_seq.max(1));
        first(self.unconfirmed.keys().next()).min(first(self.recording.first()))
    }
}

/// The outbox of one entity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxState {
    /// The incarnation every lane sends under (drawn with the first delivery ever).
    pub incarnation: Option<Incarnation>,
    /// Each destination's lane, by name.
    pub lanes: BTreeMap<String, LaneState>,
}

impl OutboxState {
    /// Deliveries to `destination` not confirmed yet.
    pub fn unconfirmed(&self, destination: &str) -> usize {
        self.lanes
            .get(destination)
            .map_or(0, |lane| lane.unconfirmed.len())
    }

    /// Applies a recorded delivery.
    pub fn apply_sent(&mut self, sent: &Sent) {
        let lane = self.lanes.entry(sent.destination.clone()).or_default();
        lane.next_seq = lane.next_seq.max(sent.seq + 1);
        lane.unconfirmed.insert(sent.seq, sent.message.clone());
    }

    /// Applies recorded confirmations; with `recording`, they are in an append not yet
    /// committed.
    pub fn apply_confirmed(&mut self, confirmed: &[(String, u64)], recording: bool) {
        for (destination, seq) in confirmed {
            if let Some(lane) = self.lanes.get_mut(destination) {
                lane.unconfirmed.remove(seq);
                if recording {
                    lane.recording.insert(*seq);
                }
            }
        }
    }

    /// The append that recorded `confirmed` committed.
    pub fn committed(&mut self, confirmed: &[(String, u64)]) {
        for (destination, seq) in confirmed {
            if let Some(lane) = self.lanes.get_mut(destination) {
                lane.recording.remove(seq);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_are_numbered_per_destination_and_confirmations_settle_them_durably() {
        let mut outbox = OutboxState::default();
        let sent = |destination: &str, seq, byte| Sent {
            destination: destination.into(),
            seq,
            message: vec![byte],
        };
        for delivery in [sent("a", 1, 1), sent("a", 2, 2), sent("b", 1, 3)] {
            outbox.apply_sent(&delivery);
        }
        assert_eq!((outbox.unconfirmed("a"), outbox.unconfirmed("c")), (2, 0));
        assert_eq!(outbox.lanes["a"].next_seq, 3);
        let confirmed = vec![("a".to_string(), 1)];
        outbox.apply_confirmed(&confirmed, true);
        let lane = &outbox.lanes["a"];
        assert_eq!(
            lane.durably_confirmed_below(),
            1,
            "recorded, not committed yet"
        );
        outbox.committed(&confirmed);
        assert_eq!(outbox.lanes["a"].durably_confirmed_below(), 2);
        let mut replayed = OutboxState::default();
        for delivery in [sent("a", 1, 1), sent("a", 2, 2), sent("b", 1, 3)] {
            replayed.apply_sent(&delivery);
        }
        replayed.apply_confirmed(&confirmed, false);
        assert_eq!(replayed, outbox, "recovery rebuilds the same outbox");
    }
}
