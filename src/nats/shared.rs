//! What the carrier's tasks share (the client, options, counters, destinations, exposures,
//! the sending side's memory), in a file of its own so that the carrier, its receiving tasks
//! (`inbound`) and its ACK task (`acks`) import it without importing each other.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use actix::ArbiterHandle;
use async_nats::{Client, Subject};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::codec::schema::Schemas;
use crate::delivery::message::{ChunkDelivery, Delivery, ReplyTo};
use crate::protocol::envelope::Ack;
use crate::tcp::frame::{Frame, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use crate::tcp::outbound::{encode, encode_chunks, Group};
use crate::tcp::routes::Routes;
use crate::tcp::stats::{add, Warning, Warnings};

use super::notices::Notices;
use super::options::NatsOptions;
use super::publisher::{Held, Publisher};
use super::stats::Counters;
use super::version::message_version;

/// One exposed subject being served.
pub(crate) struct Serving {
    pub(crate) subject: String,
    /// Tells this exposure from a later one of the same subject.
    pub(crate) generation: u64,
    pub(crate) stop: CancellationToken,
}

/// What the carrier's tasks share.
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) options: NatsOptions,
    pub(crate) counters: Counters,
    /// The counters' metrics, published after each message received and batch published.
    #[cfg(feature = "metrics")]
    pub(crate) meter: Mutex<crate::nats::metrics::NatsMeter>,
    pub(crate) warnings: Warnings,
    pub(crate) publisher: Publisher,
    pub(crate) cancel: CancellationToken,
    pub(super) arbiter: ArbiterHandle,
    /// Where this carrier's deliveries ask for their ACKs: `<inbox>.<token>`, one token per
    /// destination.
    pub(super) inbox: Subject,
    /// What this carrier's probes start with (random: another client cannot make one).
    pub(super) probe_key: u64,
    /// The destinations by their reply subject.
    pub(super) destinations: Mutex<HashMap<String, Arc<Destination>>>,
    /// The largest message the server lets anyone publish: what a received one may be.
    pub(super) max_received: usize,
    /// The largest message this carrier publishes.
    pub(super) max_published: usize,
    pub(super) sending: Mutex<Sending>,
    pub(super) exposed: Mutex<Exposures>,
    /// How bodies are written and read, by message type.
    pub(crate) schemas: Schemas,
}

/// Where one [`NatsCarrierHandle::consumer_ref`] sends: its subject, the reply subject its batches
/// name (of this carrier's inbox, with a random token of its own), and which of its batches
/// the server may still answer with a "no responders" notice.
pub(super) struct Destination {
    pub(super) subject: Subject,
    pub(super) reply: Subject,
    pub(super) notices: Mutex<Notices>,
}

impl Destination {
    pub(super) fn notices(&self) -> MutexGuard<'_, Notices> {
        self.notices.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The subjects exposed now, each with its exposure's generation and stop token.
#[derive(Default)]
pub(super) struct Exposures {
    pub(super) by_subject: HashMap<String, (u64, CancellationToken)>,
    pub(super) next_generation: u64,
}

/// The memory of the sending side.
pub(crate) struct Sending {
    pub(crate) routes: Routes<ReplyTo>,
    /// Where bodies are encoded before they are kept.
    pub(super) scratch: Vec<u8>,
}

impl Shared {
    /// Publishes the counters to the metrics.
    #[cfg(feature = "metrics")]
    pub(crate) fn publish(&self) {
        let mut stats = self.counters.snapshot();
        stats.output_high_water = self.publisher.high_water() as u64;
        let mut meter = self.meter.lock().unwrap_or_else(PoisonError::into_inner);
        meter.publish(&stats);
    }

    pub(crate) fn sending(&self) -> MutexGuard<'_, Sending> {
        self.sending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn destinations(&self) -> MutexGuard<'_, HashMap<String, Arc<Destination>>> {
        self.destinations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn destination(&self, reply: &str) -> Option<Arc<Destination>> {
        self.destinations().get(reply).cloned()
    }

    /// A "no responders" status arrived on `reply`: whether it can answer a batch this carrier
    /// published there (see [`Notices`]). Any client may publish a status to an inbox; the
    /// server answers only a batch published with that reply subject, and only at once.
    pub(crate) fn is_answering(&self, reply: &str) -> bool {
        self.destination(reply)
            .is_some_and(|destination| destination.notices().status())
    }

    /// The number of batches before it that a probe of this carrier carries, if `payload` is
    /// one: the carrier's probe key, then that number (little endian).
    pub(crate) fn read_probe(&self, payload: &[u8]) -> Option<u64> {
        let (key, before) = payload.split_first_chunk::<8>()?;
        let before: [u8; 8] = before.try_into().ok()?;
        (u64::from_le_bytes(*key) == self.probe_key).then_some(u64::from_le_bytes(before))
    }

    /// A probe of this carrier came back on `reply`, behind the first `before` batches
    /// published there: the server can no longer answer those. Probes again if later batches
    /// are open.
    pub(crate) fn probe_back(&self, reply: &str, before: u64) {
        if let Some(destination) = self.destination(reply) {
            let mut queue = self.publisher.hold();
            self.probe_if_due(&mut queue, &destination, |notices| {
                notices.probe_back(before)
            });
        }
    }

    /// Changes `destination`'s notices, then queues a probe to its reply subject behind what
    /// `queue` holds if one is due.
    pub(super) fn probe_if_due(
        &self,
        queue: &mut Held<'_>,
        destination: &Destination,
        change: impl FnOnce(&mut Notices),
    ) {
        let mut notices = destination.notices();
        change(&mut notices);
        let now = Instant::now();
        if let Some(before) = notices.probe_due(now) {
            let payload = [self.probe_key.to_le_bytes(), before.to_le_bytes()].concat();
            if queue.publish_payload(&destination.reply, payload.into()) {
                add(&self.counters.frames_out, 1);
                notices.probe_queued(before, now);
            }
        }
    }

    pub(super) fn exposed(&self) -> MutexGuard<'_, Exposures> {
        self.exposed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An exposure's task ended: its subject is free again (unless exposed anew since).
    pub(crate) fn exposure_ended(&self, serving: &Serving) {
        let mut exposed = self.exposed();
        if exposed
            .by_subject
            .get(&serving.subject)
            .is_some_and(|(generation, _)| *generation == serving.generation)
        {
            exposed.by_subject.remove(&serving.subject);
        }
    }

    /// Publishes deliveries to a destination, asking for ACKs on its reply subject; what does
    /// not fit the queue is dropped and counted (the producer retransmits it).
    pub(super) fn send<T: Serialize + 'static>(
        &self,
        destination: &Destination,
        deliveries: Vec<Delivery<T>>,
    ) {
        let counters = &self.counters;
        if self.cancel.is_cancelled() {
            add(&counters.deliveries_unsendable, deliveries.len() as u64);
            return;
        }
        let (groups, unsendable) = {
            let Sending { routes, scratch } = &mut *self.sending();
            encode(
                routes,
                scratch,
                deliveries,
                &self.schemas.of::<T>(),
                &counters.bodies_encoded,
                &self.warnings,
            )
        };
        self.publish_groups(destination, groups, unsendable);
    }

    /// Publishes the chunks of large messages to a destination, as [`send`](Self::send)
    /// publishes deliveries (a chunk goes out as its bytes).
    pub(super) fn send_chunks<T>(&self, destination: &Destination, chunks: Vec<ChunkDelivery<T>>) {
        if self.cancel.is_cancelled() {
            add(&self.counters.deliveries_unsendable, chunks.len() as u64);
            return;
        }
        let (groups, unsendable) = encode_chunks(&mut self.sending().routes, chunks);
        self.publish_groups(destination, groups, unsendable);
    }

    /// Publishes encoded groups of deliveries to a destination, each followed by a probe when
    /// one is due (see [`Notices`]), counting what becomes of them (and `unsendable` ones that
    /// could not be encoded).
    pub(super) fn publish_groups(
        &self,
        destination: &Destination,
        groups: Vec<Group>,
        unsendable: u64,
    ) {
        let subject = &destination.subject;
        let counters = &self.counters;
        add(&counters.deliveries_unsendable, unsendable);
        for group in groups {
            let mut queue = self.publisher.hold();
            let pushed = queue.publish(subject, Some(&destination.reply), |output| {
                output.push_deliveries(
                    subject,
                    group.producer_id.as_str(),
                    group.incarnation,
                    &group.items,
                )
            });
            self.probe_if_due(&mut queue, destination, |notices| {
                notices.published(pushed.frames)
            });
            drop(queue);
            add(&counters.frames_out, pushed.frames);
            add(&counters.deliveries_out, pushed.queued);
            add(&counters.deliveries_dropped_full, pushed.full);
            add(&counters.deliveries_unsendable, pushed.too_large);
            add(&counters.chunks_held_for_version, pushed.held_for_version);
            if pushed.held_for_version > 0 {
                self.warnings.warn(Warning::ChunksHeld, || {
                    format!(
                        "chunks of large messages to {subject} not sent (their producers \
                         retransmit them): this carrier writes protocol version {}, which has \
                         no chunks; raise its wire_version to 4 once every carrier runs a \
                         release that speaks it",
                        self.options.config.wire_version
                    )
                });
            }
            if pushed.full > 0 {
                self.warnings.warn(Warning::Dropped, || {
                    "deliveries dropped: the NATS publishing queue is full (max_output_bytes; \
                     the producer retransmits them)"
                        .to_string()
                });
            }
            if pushed.too_large > 0 {
                self.warnings.warn(Warning::Unsendable, || {
                    "a delivery does not fit one NATS message (max_frame_length)".to_string()
                });
            }
        }
    }

    /// Publishes ACKs to a producer's inbox at protocol `version`: that of the deliveries
    /// they answer, which their producer's carrier writes, so reads (an older release's
    /// reads no other), whatever this carrier's `wire_version`.
    pub(crate) fn send_acks(&self, inbox: &Subject, version: u16, acks: &[Ack]) {
        let pushed = self
            .publisher
            .publish_at(version, inbox, None, |output| output.push_acks(acks));
        add(&self.counters.frames_out, pushed.frames);
        add(&self.counters.acks_out, pushed.queued);
        add(
            &self.counters.acks_dropped_full,
            pushed.full + pushed.too_large,
        );
    }

    /// A received payload as its protocol version and frame, if it is one of a version this
    /// carrier speaks, within the limits. A message of another version is counted and warned
    /// about here (the caller refuses it like any other).
    pub(crate) fn decode<'a>(&self, payload: &'a [u8]) -> Option<(u16, Frame<'a>)> {
        if payload.len() > self.max_received {
            return None;
        }
        let (&first, frame) = payload.split_first()?;
        if let Some(version) = message_version(first) {
            let frame = Frame::decode_versioned(frame, version).ok()?;
            return Some((version, frame));
        }
        add(&self.counters.version_refusals, 1);
        self.warnings.warn(Warning::Version, || {
            // Protocol 1 put the frame first: its kinds, 4 and 5, are its first byte.
            let version = match first {
                4 | 5 => "protocol 1 (an earlier release)".to_string(),
                2 => "protocol 2 (an earlier release)".to_string(),
                _ => format!("another protocol version (first byte {first})"),
            };
            format!(
                "refused a NATS message of {version}; this carrier speaks protocols \
                 {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}: upgrade the carrier that sent it"
            )
        });
        None
    }

    /// Counts (and now and then logs) a refused message.
    pub(crate) fn refuse(&self, place: &str) {
        add(&self.counters.decode_failures, 1);
        self.warnings.warn(Warning::Decode, || {
            format!("refused a NATS message on {place}: not a frame of this protocol that belongs there")
        });
    }
}
