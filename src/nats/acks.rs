//! The ACK inbox: batches of ACKs for this carrier's producers, routed by producer id and
//! incarnation, and the server's "no responders" notices. The inbox is `<inbox>.*`: each
//! destination's batches name a reply subject of their own, so a notice is counted only on
//! the reply subject of a destination, at most once per batch published there; a status any
//! other client publishes elsewhere to the inbox is counted apart and ignored.
//!
//! Read continuously, and bounded like deliveries, by the rule the TCP transport follows
//! ([`Routes::admit_acks`](crate::remote::routes::Routes::admit_acks)): per producer
//! incarnation, at most 8 full frames of ACKs wait for the producer to take them from its
//! mailbox; beyond, its ACKs are dropped (and counted), so a client flooding ACKs at a busy
//! producer costs bounded memory. A dropped ACK is not lost: the producer retransmits, and the
//! consumer ACKs the duplicate.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_nats::{Message, StatusCode, Subscriber};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;

use crate::protocol::envelope::Ack;
use crate::remote::frame::Frame;
use crate::remote::routes::AckRefusal;
use crate::remote::stats::{add, Warning};

use super::carrier::Shared;

/// ACKs handed to a producer: resolves once it took them (and gives back their share of the
/// route's bound).
type Taking = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Receives on the inbox until the carrier stops or the client closes.
pub(crate) async fn receive(shared: Arc<Shared>, mut inbox: Subscriber) {
    let mut taking = FuturesUnordered::<Taking>::new();
    loop {
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return,
            Some(()) = taking.next(), if !taking.is_empty() => {}
            message = inbox.next() => {
                let Some(message) = message else { return }; // the client closed
                if let Some(taken) = receive_one(&shared, &message) {
                    taking.push(taken);
                }
            }
        }
    }
}

/// One message on the inbox; the producer's taking of its ACKs, if it has any to take.
fn receive_one(shared: &Shared, message: &Message) -> Option<Taking> {
    let counters = &shared.counters;
    add(&counters.frames_in, 1);
    if message.status == Some(StatusCode::NO_RESPONDERS) {
        if shared.is_answering(message.subject.as_str()) {
            add(&counters.no_responders, 1);
        } else {
            add(&counters.forged_no_responders, 1);
            shared.warnings.warn(Warning::Decode, || {
                "ignored a \"no responders\" status that answers no batch this carrier \
                 published (another client published it)"
                    .to_string()
            });
        }
        return None;
    }
    let Some(Frame::Acks(batch)) = shared.decode(&message.payload) else {
        shared.refuse("the ACK inbox");
        return None;
    };
    let n = batch.seqs.len() as u64;
    let admitted =
        shared
            .sending()
            .routes
            .admit_acks(batch.producer_id, batch.incarnation, &batch.seqs);
    let route = match admitted {
        Ok(route) => route,
        Err(AckRefusal::Unroutable) => {
            add(&counters.unroutable_acks, n);
            return None;
        }
        Err(AckRefusal::Busy) => {
            add(&counters.acks_dropped_busy, n);
            shared.warnings.warn(Warning::Dropped, || {
                "ACKs dropped: their producer has not taken the ACKs before them yet (it \
                 retransmits, and is ACKed again)"
                    .to_string()
            });
            return None;
        }
    };
    add(&counters.acks_in, n);
    let producer_id = route.producer_id;
    let taken = route.reply_to.send_all(batch.seqs.iter().map(|&seq| Ack {
        producer_id: producer_id.clone(),
        incarnation: batch.incarnation,
        seq,
    }));
    let waiting = route.waiting;
    Some(Box::pin(async move {
        taken.await; // a producer that is gone takes nothing more
        drop(waiting);
    }))
}
