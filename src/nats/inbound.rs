//! The receiving side of one exposed subject: each message a batch of deliveries, handed to
//! the consumer with a reply address that publishes its ACKs to the message's reply subject.

use std::sync::{Arc, Weak};

use async_nats::{Message, Subject, Subscriber};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use hashlink::LruCache;
use tokio_util::sync::CancellationToken;

use crate::message::ReplyTo;
use crate::remote::frame::Frame;
use crate::remote::inbound::{Dispatched, Exposed, MAX_DISPATCHING};
use crate::remote::stats::add;

use super::carrier::Shared;

/// Reply addresses kept per exposed subject (one per producer carrier that sends there, in
/// practice); the least recently used is made again when needed.
const MAX_REPLY_SUBJECTS: usize = 1024;

/// Receives on `subscriber` until `stop` (or the carrier stops), then unsubscribes. At most
/// [`MAX_DISPATCHING`] batches wait in the consumer's mailbox; beyond, this stops taking
/// messages, and the client's subscription buffer fills (then the client drops messages:
/// the producers retransmit them).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    mut subscriber: Subscriber,
    consumer: Arc<dyn Exposed>,
    stop: CancellationToken,
) {
    let mut dispatching = FuturesUnordered::<Dispatched>::new();
    let mut replies = LruCache::new(MAX_REPLY_SUBJECTS);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            Some(()) = dispatching.next(), if !dispatching.is_empty() => {}
            message = subscriber.next(), if dispatching.len() < MAX_DISPATCHING => {
                let Some(message) = message else { break }; // the client closed
                if let Some(taken) = receive(&shared, &*consumer, &mut replies, message) {
                    dispatching.push(taken);
                }
            }
        }
    }
    let _ = subscriber.unsubscribe().await;
}

/// Hands one message's deliveries to the consumer; `None` if nothing was handed over.
fn receive(
    shared: &Arc<Shared>,
    consumer: &dyn Exposed,
    replies: &mut LruCache<String, ReplyTo>,
    message: Message,
) -> Option<Dispatched> {
    let counters = &shared.counters;
    add(&counters.frames_in, 1);
    let Some(Frame::Deliveries(batch)) = shared.decode(&message.payload) else {
        shared.refuse("an exposed subject");
        return None;
    };
    let n = batch.items.len() as u64;
    let Some(reply) = message.reply else {
        add(&counters.deliveries_without_reply, n);
        return None;
    };
    let reply_to = match replies.get(reply.as_str()) {
        Some(reply_to) => reply_to.clone(),
        None => {
            let reply_to = acks_to(Arc::downgrade(shared), reply.clone());
            replies.insert(reply.to_string(), reply_to.clone());
            reply_to
        }
    };
    let handed = consumer.deliver(&batch, &reply_to);
    add(&counters.deliveries_in, n - handed.undecodable);
    add(&counters.undecodable_bodies, handed.undecodable);
    handed.taken
}

/// The reply address of deliveries that asked for their ACKs on `inbox`. It does not keep the
/// carrier alive: once it stopped, ACKs are dropped.
fn acks_to(shared: Weak<Shared>, inbox: Subject) -> ReplyTo {
    ReplyTo::from_fn(move |acks| {
        if let Some(shared) = shared.upgrade() {
            shared.send_acks(&inbox, &acks);
        }
    })
}
