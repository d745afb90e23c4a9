//! The Actix messages of the protocol and of the controllers' control interfaces.

use std::sync::Arc;

use actix::{Message, Recipient};

use crate::confirmation::Confirmation;
use crate::error::TellError;
use crate::protocol::consumer::{ConsumerStats, Inbound};
use crate::protocol::envelope::{Ack, Header, Incarnation, ProducerId};
use crate::protocol::producer::{ProducerStats, Transmission};

/// A message from a producer to a consumer (`ProducerController` → `ConsumerController`).
///
/// Every field is untrusted input to the consumer, which checks it on arrival (see
/// [`admit`](crate::protocol::envelope::admit)); a malformed delivery becomes a
/// [`DeadLetter`](crate::DeadLetter).
#[derive(Debug)]
pub struct Delivery<T> {
    /// The sending producer's id.
    pub producer_id: ProducerId,
    /// The sending producer's current incarnation.
    pub incarnation: Incarnation,
    /// The message's sequence number (from 1).
    pub seq: u64,
    /// The lowest seq the producer has not had ACKed yet; every lower seq is settled.
    pub window_start: u64,
    /// The message.
    pub body: T,
    /// Where the consumer sends the [`Ack`].
    pub reply_to: Option<ReplyTo>,
}

impl<T: Send + 'static> Message for Delivery<T> {
    type Result = ();
}

impl<T> Delivery<T> {
    pub(crate) fn new(transmission: Transmission<T>, reply_to: ReplyTo) -> Self {
        let Transmission { header, body } = transmission;
        Self {
            producer_id: header.producer_id,
            incarnation: header.incarnation,
            seq: header.seq,
            window_start: header.window_start,
            body,
            reply_to: Some(reply_to),
        }
    }

    pub(crate) fn into_inbound(self) -> Inbound<T, ReplyTo> {
        Inbound {
            header: Header {
                producer_id: self.producer_id,
                incarnation: self.incarnation,
                seq: self.seq,
                window_start: self.window_start,
            },
            body: self.body,
            reply_to: self.reply_to,
        }
    }
}

impl Message for Ack {
    type Result = ();
}

/// Where a consumer sends ACKs: a shared handle to a `Recipient<Ack>`, cheap to clone onto
/// every delivery.
#[derive(Clone, Debug)]
pub struct ReplyTo(Arc<Recipient<Ack>>);

impl ReplyTo {
    /// Sends an ACK, fire-and-forget (a lost ACK is recovered by retransmission).
    pub fn do_send(&self, ack: Ack) {
        self.0.do_send(ack);
    }
}

impl From<Recipient<Ack>> for ReplyTo {
    fn from(recipient: Recipient<Ack>) -> Self {
        Self(Arc::new(recipient))
    }
}

/// Hands a message to a `ProducerController`. [`ProducerHandle`](crate::ProducerHandle) is the
/// convenient way; send this directly when you hold the controller's `Addr`.
pub struct Tell<T> {
    /// The message.
    pub body: T,
    /// Notified exactly once with the outcome.
    pub confirm: Confirmation,
}

impl<T: Send + 'static> Message for Tell<T> {
    type Result = Result<(), TellError<T>>;
}

/// Stops a `ProducerController` now: every in-flight and queued message is settled with
/// [`DeliveryError::ProducerStopped`](crate::DeliveryError::ProducerStopped).
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct StopProducer;

/// Asks a `ProducerController` for its [`ProducerStats`].
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "ProducerStats")]
pub struct GetProducerStats;

/// Asks a `ConsumerController` for its [`ConsumerStats`].
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "ConsumerStats")]
pub struct GetConsumerStats;

/// Asks a `ConsumerController` how many seqs of one producer it holds handled above the
/// contiguous mark (`None`: the producer is not tracked).
#[derive(Clone, Debug, Message)]
#[rtype(result = "Option<usize>")]
pub struct GetOutOfOrder(pub ProducerId);

/// Stops a `ConsumerController`; its dedup state is dropped.
#[derive(Clone, Copy, Debug, Message)]
#[rtype(result = "()")]
pub struct StopConsumer;
