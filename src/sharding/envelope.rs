//! What a sharded producer sends to an entity host: the body, the entity it is for, and its
//! stable identity at the producer.

use serde::{Deserialize, Serialize};

use crate::protocol::envelope::{check_numbers, check_producer_id, DeadLetterReason, DeliveryInfo};
use crate::sharding::entity_id::EntityId;

/// A message for one entity, as a sharded producer sends it through the entity's stream and
/// an [`EntityHostHandle`](crate::sharding::EntityHostHandle)'s consumer receives it.
///
/// `origin` is the message's id at the sharded producer (the producer's id and incarnation,
/// the message's seq there and the producer's window start): it stays the same when the
/// message is sent again through a new stream, and, for a durable sharded producer, across
/// the producer's restarts, so the entity records it as the processed mark. `previous` is the
/// seq (at the same producer) of the message sent to the same entity before it, 0 for none:
/// with `must_follow` the entity processes the message only after that one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityEnvelope<M> {
    /// The entity the message is for.
    pub entity_id: EntityId,
    /// The message's stable id at its producer.
    pub origin: DeliveryInfo,
    /// The producer's previous message to the same entity (its seq), 0 for none.
    pub previous: u64,
    /// The message.
    pub body: M,
    /// The shard count the producer routed the message by (0: not said): a host of another
    /// count refuses it ([`DeadLetterReason::ShardCountMismatch`]).
    #[serde(default)]
    pub shards: u32,
}

impl<M> EntityEnvelope<M> {
    /// Checks the origin as a consumer admits a delivery (its fields come from the sender):
    /// a producer id of 1 to 256 bytes, a seq in `1..=2^53-1`, a window start in `1..=seq`,
    /// a predecessor before the seq, and no range of seqs (a sharded producer's messages are
    /// whole: a range would record seqs as processed that no entity processed).
    ///
    /// # Errors
    /// The [`DeadLetterReason`] of the first field out of range.
    pub fn check(&self) -> Result<(), DeadLetterReason> {
        let origin = &self.origin;
        check_producer_id(origin.producer_id.as_str())?;
        check_numbers(origin.seq, origin.window_start)?;
        if self.previous >= origin.seq || origin.first_seq.is_some() {
            return Err(DeadLetterReason::SeqOutOfRange(origin.seq));
        }
        Ok(())
    }
}

/// A message for one entity, as a sharded producer's own stream holds it (and a durable one
/// stores it): the entity id is its qualifier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntityMessage<M> {
    /// The entity the message is for.
    pub entity_id: EntityId,
    /// The message.
    pub body: M,
}
