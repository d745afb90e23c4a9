//! The receiving side of one exposed subject: each message a batch of deliveries, handed to
//! the consumer with a reply address that publishes its ACKs to the message's reply subject.

use std::sync::{Arc, Weak};

use async_nats::{Message, Subject, Subscriber};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use hashlink::LruCache;

use crate::delivery::message::ReplyTo;
use crate::tcp::frame::Frame;
use crate::tcp::registry::{Dispatched, Exposed};
use crate::tcp::stats::{add, Warning};

use super::shared::{Serving, Shared};

/// Batches handed to the consumer and not yet taken from its mailbox; beyond, deliveries are
/// dropped (and counted): NATS has no flow control towards the publisher, so waiting would
/// only move them into the client's buffer, which is bounded in messages, not bytes.
const MAX_DISPATCHING: usize = 16;

/// Reply addresses kept per exposed subject (one per producer carrier that sends there, in
/// practice), each with the protocol version its ACKs are written at; the least recently used
/// is made again when needed.
const MAX_REPLY_SUBJECTS: usize = 1024;

/// Receives on `subscriber` until `stop`, the carrier stops, or the consumer is gone
/// (stopped for good), then unsubscribes, so that a queue group's other members take its
/// share.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    mut subscriber: Subscriber,
    consumer: Arc<dyn Exposed>,
    serving: Serving,
) {
    let mut dispatching = FuturesUnordered::<Dispatched>::new();
    let mut replies = LruCache::new(MAX_REPLY_SUBJECTS);
    loop {
        tokio::select! {
            biased;
            () = serving.stop.cancelled() => break,
            Some(taken) = dispatching.next(), if !dispatching.is_empty() => {
                if !taken {
                    log::warn!(
                        "the consumer exposed on {} is gone: unsubscribing",
                        serving.subject
                    );
                    break;
                }
            }
            message = subscriber.next() => {
                let Some(message) = message else { break }; // the client closed
                if let Some(taken) = receive(&shared, &*consumer, &mut replies, message, dispatching.len()) {
                    dispatching.push(taken);
                }
                #[cfg(feature = "metrics")]
                shared.publish();
            }
        }
    }
    let _ = subscriber.unsubscribe().await;
    shared.exposure_ended(&serving);
}

/// Hands one message's deliveries to the consumer; `None` if nothing was handed over.
fn receive(
    shared: &Arc<Shared>,
    consumer: &dyn Exposed,
    replies: &mut LruCache<String, (u16, ReplyTo)>,
    message: Message,
    dispatching: usize,
) -> Option<Dispatched> {
    let counters = &shared.counters;
    add(&counters.frames_in, 1);
    let Some((version, Frame::Deliveries(batch))) = shared.decode(&message.payload) else {
        shared.refuse("an exposed subject");
        return None;
    };
    let n = batch.items.len() as u64;
    let Some(reply) = message.reply else {
        add(&counters.deliveries_without_reply, n);
        return None;
    };
    if !reply
        .as_str()
        .starts_with(&shared.options.config.reply_prefix)
    {
        add(&counters.foreign_reply_subjects, n);
        shared.warnings.warn(Warning::Decode, || {
            "refused deliveries whose reply subject is not under reply_prefix".to_string()
        });
        return None;
    }
    if dispatching >= MAX_DISPATCHING {
        add(&counters.deliveries_dropped_busy, n);
        shared.warnings.warn(Warning::Dropped, || {
            "deliveries dropped: the consumer has not taken the batches before them yet \
             (the producers retransmit them)"
                .to_string()
        });
        return None;
    }
    // The ACKs go out at the version of the deliveries: the one their producer's carrier
    // writes, and the only one it may read (an older release).
    let reply_to = match replies.get(reply.as_str()) {
        Some((at, reply_to)) if *at == version => reply_to.clone(),
        _ => {
            let reply_to = acks_to(Arc::downgrade(shared), reply.clone(), version);
            replies.insert(reply.to_string(), (version, reply_to.clone()));
            reply_to
        }
    };
    let handed = consumer.deliver(&message.payload, &batch, &reply_to, &shared.schemas);
    add(&counters.deliveries_in, n - handed.undecodable);
    add(&counters.undecodable_bodies, handed.undecodable);
    if let Some(why) = handed.why {
        shared.warnings.warn(Warning::Undecodable, || {
            format!("deliveries on {} are dead letters: {why}", message.subject)
        });
    }
    handed.taken
}

/// The reply address of deliveries of protocol `version` that asked for their ACKs on
/// `inbox`: it publishes them at that version. It does not keep the carrier alive: once it
/// stopped, ACKs are dropped.
fn acks_to(shared: Weak<Shared>, inbox: Subject, version: u16) -> ReplyTo {
    ReplyTo::from_fn(move |acks| {
        if let Some(shared) = shared.upgrade() {
            shared.send_acks(&inbox, version, &acks);
        }
    })
}
