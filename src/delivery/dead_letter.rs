//! The record of a malformed delivery.

use actix::Message;
use serde::{Deserialize, Serialize};

use crate::protocol::envelope::{DeadLetterReason, IncarnationId, ProducerId};

/// A delivery the consumer refused as malformed: no handler ran and no ACK was sent.
///
/// Sent to the consumer's optional dead-letter sink (see
/// [`ConsumerOptionsBuilder::dead_letters`](crate::ConsumerOptionsBuilder::dead_letters)). The
/// fields are as received and untrusted; the body is dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Message)]
#[rtype(result = "()")]
pub struct DeadLetter {
    /// The admission rule the delivery broke.
    pub reason: DeadLetterReason,
    /// The producer id as received.
    pub producer_id: ProducerId,
    /// The public id of the incarnation as received (never the token itself).
    pub incarnation: IncarnationId,
    /// The seq as received.
    pub seq: u64,
}
