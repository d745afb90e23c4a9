//! What a producer actor drives: the protocol core of whole messages, or, with
//! [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size), the chunked core with how its
//! messages are encoded (once each, into chunks) and how the consumer reads them back.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;

use crate::config::ProducerConfig;
use crate::confirmation::Confirmation;
use crate::error::DeliveryError;
use crate::message::{ChunkDelivery, ConsumerRef, Decode, Delivery, Encode, ReplyTo};
use crate::protocol::chunk::producer::ChunkedProducer;
use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::protocol::producer::{ProducerCore, ProducerStats};

/// How a producer with `chunk_size` sends its messages.
pub(crate) struct Chunking<T> {
    /// The size of a chunk in bytes.
    pub(crate) chunk_size: usize,
    /// How a message is encoded into chunks.
    pub(crate) encode: Encode<T>,
    /// How the consumer reads a reassembled message (carried by each chunk in process; a
    /// transport replaces it with the receiver's schema).
    pub(crate) decode: Decode<T>,
}

impl<T> Clone for Chunking<T> {
    fn clone(&self) -> Self {
        Self {
            chunk_size: self.chunk_size,
            encode: self.encode.clone(),
            decode: self.decode.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Chunking<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunking")
            .field("chunk_size", &self.chunk_size)
            .finish_non_exhaustive()
    }
}

/// A producer's core: whole messages, or chunked ones.
#[allow(clippy::large_enum_variant)] // one per producer actor, which it never leaves
pub(crate) enum Core<T> {
    Whole(ProducerCore<T, Confirmation>),
    Chunked(ChunkedProducer<Confirmation>, Chunking<T>),
}

impl<T: Clone> Core<T> {
    /// A new life under `incarnation`.
    pub(crate) fn new(
        config: &ProducerConfig,
        incarnation: Incarnation,
        chunking: Option<Chunking<T>>,
    ) -> Self {
        match chunking {
            Some(chunking) => Self::Chunked(ChunkedProducer::new(config, incarnation), chunking),
            None => Self::Whole(ProducerCore::new(config, incarnation)),
        }
    }

    /// How its messages are chunked, if they are.
    pub(crate) fn chunking(&self) -> Option<&Chunking<T>> {
        match self {
            Self::Whole(_) => None,
            Self::Chunked(_, chunking) => Some(chunking),
        }
    }

    pub(crate) fn id(&self) -> &ProducerId {
        match self {
            Self::Whole(core) => core.id(),
            Self::Chunked(core, _) => core.id(),
        }
    }

    pub(crate) fn is_idle(&self) -> bool {
        match self {
            Self::Whole(core) => core.is_idle(),
            Self::Chunked(core, _) => core.is_idle(),
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self {
            Self::Whole(core) => core.next_deadline(),
            Self::Chunked(core, _) => core.next_deadline(),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self {
            Self::Whole(core) => core.handle_timeout(now),
            Self::Chunked(core, _) => core.handle_timeout(now),
        }
    }

    pub(crate) fn handle_ack(&mut self, ack: &Ack) -> bool {
        match self {
            Self::Whole(core) => core.handle_ack(ack),
            Self::Chunked(core, _) => core.handle_ack(ack),
        }
    }

    /// See [`ProducerCore::handle_given_up`]. Only a work-pulling pool gives messages up, and
    /// its producer does not chunk: a chunked core ignores it.
    pub(crate) fn handle_given_up(&mut self, ack: &Ack, error: DeliveryError) -> bool {
        match self {
            Self::Whole(core) => core.handle_given_up(ack, error),
            Self::Chunked(..) => false,
        }
    }

    pub(crate) fn stop(&mut self) {
        match self {
            Self::Whole(core) => core.stop(),
            Self::Chunked(core, _) => core.stop(),
        }
    }

    pub(crate) fn restart(&mut self, incarnation: Incarnation) {
        match self {
            Self::Whole(core) => core.restart(incarnation),
            Self::Chunked(core, _) => core.restart(incarnation),
        }
    }

    pub(crate) fn stats(&self) -> ProducerStats {
        match self {
            Self::Whole(core) => core.stats(),
            Self::Chunked(core, _) => core.stats(),
        }
    }

    pub(crate) fn set_durably_settled_below(&mut self, seq: u64) {
        match self {
            Self::Whole(core) => core.set_durably_settled_below(seq),
            Self::Chunked(core, _) => core.set_durably_settled_below(seq),
        }
    }

    /// How many of the settled messages not polled yet hold room in the producer.
    pub(crate) fn settled_room(&self) -> usize {
        match self {
            Self::Whole(core) => core.settled().filter(|c| c.holds_room()).count(),
            Self::Chunked(core, _) => core.settled().filter(|c| c.holds_room()).count(),
        }
    }

    pub(crate) fn poll_settled(&mut self) -> Option<(Confirmation, Result<(), DeliveryError>)> {
        match self {
            Self::Whole(core) => core.poll_settled(),
            Self::Chunked(core, _) => core.poll_settled(),
        }
    }

    /// Takes messages handed over, in order (see [`ProducerCore::handle_send_all`]). Chunked,
    /// each is encoded now, once.
    pub(crate) fn handle_send_all(&mut self, messages: &mut VecDeque<(T, Confirmation)>) {
        match self {
            Self::Whole(core) => core.handle_send_all(messages),
            Self::Chunked(..) => {
                for (body, confirm) in messages.drain(..) {
                    let _ = self.handle_send(body, confirm);
                }
            }
        }
    }

    /// Takes one message (see [`ProducerCore::handle_send`]).
    ///
    /// # Errors
    /// The body is handed back when there is no room (its confirmation settled).
    pub(crate) fn handle_send(&mut self, body: T, confirm: Confirmation) -> Result<(), T> {
        match self {
            Self::Whole(core) => core.handle_send(body, confirm),
            Self::Chunked(core, chunking) => match chunking.chunks_of(&body) {
                Ok(chunks) => core.handle_send(chunks, confirm).map_err(|_| body),
                Err(error) => {
                    core.handle_unsendable(confirm, error);
                    Ok(())
                }
            },
        }
    }

    /// Sends what the core transmits now to `consumer`, ACKs to `reply_to`.
    pub(crate) fn transmit(&mut self, now: Instant, consumer: &ConsumerRef<T>, reply_to: &ReplyTo)
    where
        T: Send + 'static,
    {
        match self {
            Self::Whole(core) => {
                let deliveries = std::iter::from_fn(|| {
                    core.poll_transmit_with(now, Confirmation::trace_context)
                })
                .map(|transmission| Delivery::from_transmission(transmission, reply_to.clone()));
                consumer.do_send_all(deliveries);
            }
            Self::Chunked(core, chunking) => {
                let chunks = std::iter::from_fn(|| {
                    core.poll_transmit_with(now, Confirmation::trace_context)
                })
                .filter_map(|t| {
                    let reply_to = Some(reply_to.clone());
                    ChunkDelivery::new(t.header, t.body, reply_to, chunking.decode.clone())
                });
                consumer.send_chunks(chunks);
            }
        }
    }
}

impl<T> Chunking<T> {
    /// `body` encoded into chunks.
    pub(crate) fn chunks_of(&self, body: &T) -> Result<Vec<Bytes>, DeliveryError> {
        (self.encode)(body, self.chunk_size)
            .map_err(|error| DeliveryError::Unencodable(error.to_string()))
    }
}
