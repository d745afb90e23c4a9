//! The ACK inbox: batches of ACKs for this carrier's producers, routed by producer id and
//! incarnation, and the server's "no responders" notices. The inbox is `<inbox>.*`: each
//! destination's batches name a reply subject of their own, so a notice is counted only on
//! the reply subject of a destination, at most once per batch published there; a status any
//! other client publishes elsewhere to the inbox is counted apart and ignored.
//!
//! Read continuously, and bounded like deliveries: at most [`MAX_WAITING`] batches of ACKs per
//! producer incarnation wait for the producer to take them from its mailbox; beyond, its ACKs
//! are dropped (and counted), so a peer flooding ACKs at a busy producer costs bounded memory.
//! A dropped ACK is not lost: the producer retransmits, and the consumer ACKs the duplicate.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_nats::{Message, StatusCode, Subscriber};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;

use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::remote::frame::Frame;
use crate::remote::stats::{add, Warning};

use super::carrier::Shared;

/// Batches of ACKs handed to one producer incarnation and not yet taken from its mailbox.
const MAX_WAITING: usize = 16;

type Route = (ProducerId, Incarnation);

/// Receives on the inbox until the carrier stops or the client closes.
pub(crate) async fn receive(shared: Arc<Shared>, mut inbox: Subscriber) {
    let mut waiting = HashMap::<Route, usize>::new();
    let mut taking = FuturesUnordered::<Pin<Box<dyn Future<Output = Route> + Send>>>::new();
    loop {
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return,
            Some(route) = taking.next(), if !taking.is_empty() => {
                if let Some(n) = waiting.get_mut(&route) {
                    *n -= 1;
                    if *n == 0 {
                        waiting.remove(&route);
                    }
                }
            }
            message = inbox.next() => {
                let Some(message) = message else { return }; // the client closed
                if let Some((route, taken)) = receive_one(&shared, &message, &waiting) {
                    *waiting.entry(route.clone()).or_default() += 1;
                    taking.push(Box::pin(async move {
                        taken.await; // a producer that is gone takes nothing more
                        route
                    }));
                }
            }
        }
    }
}

/// One message on the inbox; what the producer has yet to take from it, if anything.
fn receive_one(
    shared: &Shared,
    message: &Message,
    waiting: &HashMap<Route, usize>,
) -> Option<(Route, Pin<Box<dyn Future<Output = bool> + Send>>)> {
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
    let route = (ProducerId::from(batch.producer_id), batch.incarnation);
    if waiting.get(&route).is_some_and(|&n| n >= MAX_WAITING) {
        add(&counters.acks_dropped_busy, n);
        shared.warnings.warn(Warning::Dropped, || {
            "ACKs dropped: their producer has not taken the ACKs before them yet (it \
             retransmits, and is ACKed again)"
                .to_string()
        });
        return None;
    }
    let routed =
        shared
            .sending()
            .routes
            .handle_acks(batch.producer_id, batch.incarnation, &batch.seqs);
    let Some((producer_id, reply_to)) = routed else {
        add(&counters.unroutable_acks, n);
        return None;
    };
    add(&counters.acks_in, n);
    let acks = batch.seqs.iter().map(|&seq| Ack {
        producer_id: producer_id.clone(),
        incarnation: batch.incarnation,
        seq,
    });
    Some((route, Box::pin(reply_to.send_all(acks))))
}
