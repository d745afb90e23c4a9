//! The ACK inbox: batches of ACKs for this carrier's producers, routed by producer id and
//! incarnation, the server's "no responders" notices, and the carrier's own probes. The inbox
//! is `<inbox>.*`: each destination's batches name a reply subject of their own, so a notice
//! is counted only on the reply subject of a destination, at most once per batch published
//! there and only while that batch may still be answered, which the probes behind the
//! batches tell (see `notices`); a status any other client publishes to the inbox otherwise
//! is counted apart and ignored.
//!
//! Read continuously, and bounded like deliveries, by the rule the TCP transport follows
//! ([`Routes::admit_acks`](crate::tcp::routes::Routes::admit_acks)): per producer
//! incarnation, at most 8 full frames of ACKs not known to be taken from the producer's
//! mailbox; beyond, its ACKs are dropped (and counted), so a client flooding ACKs at a busy
//! producer costs bounded memory. A dropped ACK is not lost: the producer retransmits, and the
//! consumer ACKs the duplicate.

use std::sync::Arc;

use async_nats::{Message, StatusCode, Subscriber};
use futures_util::StreamExt;

use crate::tcp::frame::Frame;
use crate::tcp::outbound::hand_acks;
use crate::tcp::routes::AckRefusal;
use crate::tcp::stats::{add, Warning};

use super::shared::Shared;

/// Receives on the inbox until the carrier stops or the client closes.
pub(crate) async fn receive(shared: Arc<Shared>, mut inbox: Subscriber) {
    loop {
        let message = tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return,
            message = inbox.next() => message,
        };
        let Some(message) = message else { return }; // the client closed
        receive_one(&shared, &message);
        #[cfg(feature = "metrics")]
        shared.publish();
    }
}

/// One message on the inbox.
fn receive_one(shared: &Shared, message: &Message) {
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
        return;
    }
    if let Some(before) = shared.read_probe(&message.payload) {
        return shared.probe_back(message.subject.as_str(), before);
    }
    let Some((_, Frame::Acks(batch))) = shared.decode(&message.payload) else {
        return shared.refuse("the ACK inbox");
    };
    let n = batch.seqs.len() as u64;
    let admitted =
        shared
            .sending()
            .routes
            .admit_acks(batch.producer_id, batch.incarnation, &batch.seqs);
    match admitted {
        Ok(route) => {
            add(&counters.acks_in, n);
            hand_acks(route, batch.incarnation, &batch.seqs);
        }
        Err(AckRefusal::Unroutable) => add(&counters.unroutable_acks, n),
        Err(AckRefusal::Busy) => {
            add(&counters.acks_dropped_busy, n);
            shared.warnings.warn(Warning::Dropped, || {
                "ACKs dropped: their producer has not taken the ACKs before them yet (it \
                 retransmits, and is ACKed again)"
                    .to_string()
            });
        }
    }
}
