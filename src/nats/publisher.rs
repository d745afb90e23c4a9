//! The carrier's way out: batches of deliveries and ACKs encoded into NATS payloads (the TCP
//! transport's frames, one per NATS message, without length prefix or tag: NATS frames its
//! messages and authenticates its clients itself), and the carrier's probes, queued, at most
//! `max_output_bytes` until the client has written them, for one task that hands them to the
//! client in order.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_nats::{Client, Subject};
use bytes::Bytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::tcp::auth::Sealer;
use crate::tcp::frame::LENGTH_PREFIX;
use crate::tcp::output::{Output, Pushed};
use crate::tcp::stats::add;

use super::stats::Counters;
use super::version::message_byte;

/// One message for the client.
struct Publish {
    subject: Subject,
    reply: Option<Subject>,
    payload: Bytes,
}

struct Queue {
    messages: VecDeque<Publish>,
    /// Bytes queued, or taken by the task and not yet handed to the client.
    bytes: usize,
    high_water: usize,
}

/// The bounded queue in front of the client.
pub(crate) struct Publisher {
    queue: Mutex<Queue>,
    wake: Notify,
    limit: usize,
    max_payload: usize,
    /// The protocol version deliveries are written at (the carrier's `wire_version`).
    version: u16,
}

impl Publisher {
    /// At most `limit` bytes queued, messages of at most `max_payload` bytes, deliveries
    /// written at protocol `version` (validated: one this crate speaks).
    pub(crate) fn new(limit: usize, max_payload: usize, version: u16) -> Self {
        assert!(message_byte(version).is_some(), "wire_version is validated");
        Self {
            queue: Mutex::new(Queue {
                messages: VecDeque::new(),
                bytes: 0,
                high_water: 0,
            }),
            wake: Notify::new(),
            limit,
            max_payload,
            version,
        }
    }

    /// Encodes what `push` gives the output at protocol `version` and queues it, as
    /// [`Held::publish_at`].
    pub(crate) fn publish_at(
        &self,
        version: u16,
        subject: &Subject,
        reply: Option<&Subject>,
        push: impl FnOnce(&mut Output) -> Pushed,
    ) -> Pushed {
        self.hold().publish_at(version, subject, reply, push)
    }

    /// The queue, held until the guard is dropped: what is queued through it goes out in that
    /// order, with nothing of another caller in between.
    pub(crate) fn hold(&self) -> Held<'_> {
        Held {
            publisher: self,
            queue: self.lock(),
            queued: false,
        }
    }

    /// The most bytes ever queued at once.
    pub(crate) fn high_water(&self) -> usize {
        self.lock().high_water
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the queued messages to the client, in order, until `cancel`. A batch counts
    /// against the limit until the client has written it to its socket (`flush`), not only
    /// until the client took it: while the server is away the client holds what it took, so
    /// the queue fills up to its limit and later messages are dropped by
    /// [`publish`](Self::publish); the client's own buffer never holds more than one batch.
    pub(crate) async fn run(
        &self,
        client: Client,
        counters: &Counters,
        cancel: &CancellationToken,
        #[cfg(feature = "metrics")] published: &(dyn Fn() + Sync),
    ) {
        loop {
            let (messages, bytes) = {
                let mut queue = self.lock();
                // Exactly what is taken: everything queued now.
                let bytes = queue.bytes;
                (std::mem::take(&mut queue.messages), bytes)
            };
            if messages.is_empty() {
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return,
                    () = self.wake.notified() => continue,
                }
            }
            let handed = async {
                for message in messages {
                    let result = match message.reply {
                        Some(reply) => {
                            client
                                .publish_with_reply(message.subject, reply, message.payload)
                                .await
                        }
                        None => client.publish(message.subject, message.payload).await,
                    };
                    if result.is_err() {
                        add(&counters.publish_failures, 1);
                    }
                }
                // A failed flush (the connection broke) loses what the client held: the
                // producers retransmit it.
                let _ = client.flush().await;
            };
            tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                () = handed => {}
            }
            let mut queue = self.lock();
            queue.bytes -= bytes.min(queue.bytes);
            #[cfg(feature = "metrics")]
            {
                drop(queue);
                published();
            }
        }
    }
}

/// The publishing queue, held (see [`Publisher::hold`]); the task is woken when it is let go.
pub(crate) struct Held<'a> {
    publisher: &'a Publisher,
    queue: MutexGuard<'a, Queue>,
    /// Whether anything was queued through it.
    queued: bool,
}

impl Held<'_> {
    /// Encodes what `push` gives the output at the carrier's `wire_version`, as
    /// [`publish_at`](Self::publish_at): how deliveries are published.
    pub(crate) fn publish(
        &mut self,
        subject: &Subject,
        reply: Option<&Subject>,
        push: impl FnOnce(&mut Output) -> Pushed,
    ) -> Pushed {
        self.publish_at(self.publisher.version, subject, reply, push)
    }

    /// Encodes what `push` gives the output at protocol `version` (one this crate speaks:
    /// the carrier's `wire_version`, or the version of a message received), frames that fit
    /// the room left, split at `max_payload`, and queues each frame as one message to
    /// `subject`, starting with `version`'s byte.
    pub(crate) fn publish_at(
        &mut self,
        version: u16,
        subject: &Subject,
        reply: Option<&Subject>,
        push: impl FnOnce(&mut Output) -> Pushed,
    ) -> Pushed {
        let version_byte = message_byte(version).expect("a version this crate speaks");
        let room = self.room();
        // One byte of each message is the protocol version.
        let max_payload = self.publisher.max_payload - 1;
        let mut output = Output::new(room, max_payload, Sealer::new(None), version);
        let pushed = push(&mut output);
        if pushed.frames == 0 {
            return pushed;
        }
        let mut encoded = Vec::new();
        output.take(&mut encoded);
        self.count(encoded.len());
        for payload in payloads(encoded, version_byte) {
            self.queue.messages.push_back(Publish {
                subject: subject.clone(),
                reply: reply.cloned(),
                payload,
            });
        }
        pushed
    }

    /// Queues `payload` as one message to `subject` (no reply subject) if it fits the room
    /// left; whether it did.
    pub(crate) fn publish_payload(&mut self, subject: &Subject, payload: Bytes) -> bool {
        if payload.len() > self.room() {
            return false;
        }
        self.count(payload.len());
        self.queue.messages.push_back(Publish {
            subject: subject.clone(),
            reply: None,
            payload,
        });
        true
    }

    fn room(&self) -> usize {
        self.publisher.limit.saturating_sub(self.queue.bytes)
    }

    /// `bytes` more are queued.
    fn count(&mut self, bytes: usize) {
        self.queue.bytes += bytes;
        self.queue.high_water = self.queue.high_water.max(self.queue.bytes);
        self.queued = true;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.queued {
            self.publisher.wake.notify_one();
        }
    }
}

/// The frames of an output's bytes, each as one message: `version_byte` (see
/// [`message_byte`]), then the frame. Zero-copy: the version takes the place of the last byte
/// of the frame's length prefix.
fn payloads(mut encoded: Vec<u8>, version_byte: u8) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some(prefix) = encoded.get(at..at + LENGTH_PREFIX) {
        let len = u32::from_be_bytes(prefix.try_into().expect("a 4-byte prefix")) as usize;
        let start = at + LENGTH_PREFIX - 1;
        encoded[start] = version_byte;
        at += LENGTH_PREFIX + len;
        frames.push(start..at);
    }
    let encoded = Bytes::from(encoded);
    frames
        .into_iter()
        .map(|range| encoded.slice(range))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::chunk::ChunkHeader;
    use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
    use crate::tcp::body::Body;
    use crate::tcp::frame::{Frame, PROTOCOL_VERSION};
    use crate::tcp::output::Item;

    fn drain(publisher: &Publisher) -> Vec<Bytes> {
        let mut queue = publisher.lock();
        queue.messages.drain(..).map(|m| m.payload).collect()
    }

    #[test]
    fn each_frame_is_one_message_without_prefix_split_at_max_payload() {
        let publisher = Publisher::new(1 << 20, 4096, PROTOCOL_VERSION);
        let items: Vec<_> = (1..=100u64)
            .map(|seq| Item::new(seq, 1, Body::new(&[7; 100])))
            .collect();
        let subject = Subject::from("orders");
        let pushed = publisher.hold().publish(&subject, None, |out| {
            out.push_deliveries("orders", "p", Incarnation::from_u128(9), &items)
        });
        assert_eq!(pushed.queued, 100);
        let payloads = drain(&publisher);
        assert!(
            payloads.len() > 1,
            "split: 100 × 100 bytes do not fit 4 KiB"
        );
        assert_eq!(payloads.len() as u64, pushed.frames);
        let mut seqs = Vec::new();
        for payload in &payloads {
            assert!(payload.len() <= 4096);
            assert_eq!(payload[0], 7);
            let Ok(Frame::Deliveries(batch)) = Frame::decode(&payload[1..]) else {
                panic!("a deliveries frame");
            };
            assert_eq!((batch.consumer, batch.producer_id), ("orders", "p"));
            seqs.extend(batch.items.iter().map(|item| item.seq));
        }
        assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    }

    #[test]
    fn a_publisher_at_version_3_writes_byte_3_and_version_3_frames_and_holds_chunks_back() {
        let publisher = Publisher::new(1 << 20, 4096, 3);
        let mut items: Vec<_> = (1..=3u64)
            .map(|seq| Item::new(seq, 1, Body::new(&[7; 10])))
            .collect();
        items[1].chunk = Some(ChunkHeader {
            first_seq: 2,
            chunks: 1,
            message_len: 10,
        });
        let subject = Subject::from("orders");
        let pushed = publisher.hold().publish(&subject, None, |out| {
            out.push_deliveries("orders", "p", Incarnation::from_u128(9), &items)
        });
        assert_eq!((pushed.queued, pushed.held_for_version), (2, 1));
        let payloads = drain(&publisher);
        assert_eq!(payloads.len(), 1);
        assert_eq!(payloads[0][0], 3);
        let Ok(Frame::Deliveries(batch)) = Frame::decode_versioned(&payloads[0][1..], 3) else {
            panic!("a version 3 deliveries frame");
        };
        let seqs: Vec<u64> = batch.items.iter().map(|item| item.seq).collect();
        assert_eq!(seqs, [1, 3]);
    }

    #[test]
    fn acks_are_written_at_the_version_asked_for_whatever_the_carrier_writes_deliveries_at() {
        let acks = [Ack {
            producer_id: ProducerId::from("p"),
            incarnation: Incarnation::from_u128(1),
            seq: 1,
        }];
        let subject = Subject::from("_INBOX.x");
        for (written, answered, byte) in [(PROTOCOL_VERSION, 3, 3), (3, PROTOCOL_VERSION, 7)] {
            let publisher = Publisher::new(1 << 20, 4096, written);
            publisher.publish_at(answered, &subject, None, |out| out.push_acks(&acks));
            let payloads = drain(&publisher);
            assert_eq!(payloads.len(), 1);
            assert_eq!(payloads[0][0], byte, "the byte of version {answered}");
            let Ok(Frame::Acks(batch)) = Frame::decode_versioned(&payloads[0][1..], answered)
            else {
                panic!("an ACK frame");
            };
            assert_eq!(batch.seqs, [1]);
        }
    }

    #[test]
    fn a_payload_goes_out_behind_what_was_queued_before_it_and_only_if_it_fits() {
        let publisher = Publisher::new(256, 4096, PROTOCOL_VERSION);
        let (subject, reply) = (Subject::from("orders"), Subject::from("_INBOX.x.1"));
        let mut queue = publisher.hold();
        let item = Item::new(1, 1, Body::new(&[7; 8]));
        let pushed = queue.publish(&subject, Some(&reply), |out| {
            out.push_deliveries("orders", "p", Incarnation::from_u128(9), &[item])
        });
        assert_eq!(pushed.frames, 1);
        assert!(queue.publish_payload(&reply, Bytes::from_static(&[1; 16])));
        assert!(
            !queue.publish_payload(&reply, Bytes::from(vec![2; 256])),
            "beyond the limit"
        );
        drop(queue);
        let payloads = drain(&publisher);
        assert_eq!(payloads.len(), 2);
        assert_eq!(payloads[0][0], 7);
        assert_eq!(payloads[1], Bytes::from_static(&[1; 16]));
        assert!(publisher.high_water() <= 256);
    }

    #[test]
    fn beyond_the_limit_messages_are_dropped_and_counted() {
        let publisher = Publisher::new(8192, 4096, PROTOCOL_VERSION);
        let acks: Vec<Ack> = (1..=1000u64)
            .map(|seq| Ack {
                producer_id: ProducerId::from(format!("p{seq}")),
                incarnation: Incarnation::from_u128(1),
                seq,
            })
            .collect();
        let subject = Subject::from("_INBOX.x");
        let pushed =
            publisher.publish_at(PROTOCOL_VERSION, &subject, None, |out| out.push_acks(&acks));
        assert!(pushed.full > 0, "{pushed:?}");
        assert_eq!(pushed.queued + pushed.full, 1000);
        assert!(publisher.high_water() <= 8192);
        // Full: a frame of a few hundred bytes no longer fits until the task hands the
        // queue over.
        let run: Vec<Ack> = (1..=200u64)
            .map(|seq| Ack {
                producer_id: ProducerId::from("p"),
                incarnation: Incarnation::from_u128(1),
                seq: 1000 + seq,
            })
            .collect();
        let more =
            publisher.publish_at(PROTOCOL_VERSION, &subject, None, |out| out.push_acks(&run));
        assert_eq!((more.queued, more.full), (0, 200));
    }
}
