//! The durable side of a producer, the storage it holds ([`ProducerStorage`]): its log (a
//! persistent actor), the messages on their way into it, and the settlements on their way
//! into it; and the start of a durable producer.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Recipient;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::schema::BodySchema;
use crate::codec::{Codec, CodecError, Upcast, MAX_ENCODED_BYTES};
use crate::config::ProducerConfig;
use crate::delivery::confirmation::Confirmation;
use crate::delivery::confirmation::MessageId;
use crate::delivery::options::ProducerOptions;
use crate::delivery::producer::{ProducerController, ProducerHandle};
use crate::delivery::producer_core::Core;
use crate::delivery::storage::{Producer, ProducerStorage, Settlement};
use crate::durable::log::{
    decode_body, encode_body, type_names, LogCommand, LogRefusal, LogReply, ProducerLog,
};
use crate::durable::{DurableConfirmation, DurableOptions};
use crate::error::{DeliveryError, Failure, OptionsError};
use crate::journal::{JournalError, PersistenceId};
use crate::persistence::type_names::TypeNames;
use crate::persistence::{CommandError, PersistentConfig, PersistentHandle};
use crate::protocol::chunk::producer::ChunkedProducer;
use crate::protocol::envelope::Incarnation;
use crate::protocol::producer::{ProducerCore, ProducerStats};
use crate::runtime::alarm::now;
use crate::runtime::error_chain::ErrorChain;
use crate::runtime::placement::Placement;
use crate::runtime::random::{random_incarnation, random_u64};

mod chunks;

use chunks::{restore_chunked, ChunkDoubt, ChunkedStore};

/// What the log answered a command.
type LogAnswer = Result<LogReply, CommandError<LogRefusal>>;
/// Encodes a message as stored: body, codec, version, limit (see `encode_body`).
type EncodeBody<T> = fn(&T, Codec, u32, u64) -> Result<Vec<u8>, CodecError>;
/// Reads a stored message: bytes, the current version, the upcaster (see `decode_body`).
type DecodeBody<T> = fn(&[u8], u32, Upcast<T>) -> Result<T, String>;

/// The most one store writes: one journal entry, below the codec's limit with room for the
/// entry's framing. A larger burst is stored in several appends.
const MAX_STORE_BYTES: usize = MAX_ENCODED_BYTES as usize - 4096;
/// What one message adds to its entry besides its body (an event tag, its seq and length).
const EVENT_OVERHEAD: usize = 32;
/// The largest body a durable producer stores: one that fills a store alone (a chunk too).
pub(crate) const MAX_BODY_BYTES: u64 = (MAX_STORE_BYTES - EVENT_OVERHEAD) as u64;
/// How long a producer restarted after a journal failure waits before it opens its stream
/// again, doubling per consecutive failure up to the maximum: a failing journal is not
/// hammered by restarts.
const OPEN_BACKOFF_START: Duration = Duration::from_millis(100);
const OPEN_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// A message whose store's outcome is open (the journal reported a storage error, or the
/// producer ended before the journal answered): the next open finds out from the journal.
struct InDoubt<T> {
    seq: u64,
    body: T,
    confirm: Confirmation,
    reason: String,
}

/// A settlement of a stored message whose record was not made, or whose record's outcome is
/// open, when the log closed: the next open settles it by what the journal holds.
struct Carried {
    seq: u64,
    settlement: Settlement,
    /// The record was on its way to the journal (it may be stored); otherwise it certainly
    /// is not.
    attempted: bool,
}

/// A durable producer's storage: its journal stream, the messages on their way into it and
/// the settlements on their way into it. The producer holds it as its
/// [`ProducerStorage`].
pub(crate) struct Durable<T> {
    config: ProducerConfig,
    options: DurableOptions<T>,
    /// The names its log is written under and reads (its message type's).
    names: TypeNames,
    encode: EncodeBody<T>,
    decode: DecodeBody<T>,
    log: Option<PersistentHandle<ProducerLog>>,
    /// This opening of the stream (it owns the stream until another opening takes it over).
    epoch: u64,
    /// Openings since `epoch` that failed in a way that leaves open whether they committed:
    /// the next opening cannot tell them from another producer's.
    unsure_opens: u64,
    /// Journal failures since the stream was last opened.
    failures: u32,
    /// With a lease: the stream was just watched for a lease, and nobody wrote to it: the
    /// first opening may follow.
    watched: bool,
    /// A renewal (with a lease) is on its way to the journal.
    renewing: bool,
    /// Openings that took the stream over from an earlier opening.
    takeovers: u64,
    /// The seq the next stored message gets, once the log is open.
    next_seq: Option<u64>,
    /// Handed over, not stored yet.
    to_store: VecDeque<(T, Confirmation)>,
    /// The store in flight: its first seq and its messages (kept here, not in the reply's
    /// future, so that whatever ends the actor finds them).
    storing: Option<(u64, Vec<(T, Confirmation)>)>,
    /// The chunked message being stored, chunk by chunk (`chunk_size`).
    storing_chunks: Option<ChunkedStore>,
    /// Chunked messages whose store's outcome is open, kept across the restart that settles
    /// them.
    chunk_doubts: Vec<ChunkDoubt>,
    /// The first seq of each unsettled chunked message, by its id (its last seq).
    spans: BTreeMap<u64, u64>,
    /// Stored and not durably settled.
    unsettled: BTreeSet<u64>,
    /// Settled, waiting for the record (their confirmations fire after it).
    to_record: Vec<(u64, Settlement)>,
    /// The settlement record in flight.
    recording: Option<Vec<(u64, Settlement)>>,
    /// Resumed after a restart and not settled yet (their confirmations go to the sink).
    resumed: BTreeSet<u64>,
    /// Stores of unknown outcome, kept across the restart that settles them.
    in_doubt: Vec<InDoubt<T>>,
    /// Settlements not recorded (or of unknown record) when the log closed, kept across the
    /// restart that settles them.
    carried: Vec<Carried>,
    /// `stop()` was called, with this deadline: no new store starts; the writes in flight
    /// finish (a journal failure meanwhile restarts the producer under its `Supervisor`, which
    /// settles them from the journal), then the actor stops for good.
    stopping: Option<Instant>,
    /// Messages stored; resumed after a restart; confirmations of resumed ones; chunked
    /// messages found partly stored at an opening (dropped).
    counts: (u64, u64, u64, u64),
}

impl<T: Serialize + DeserializeOwned> Durable<T> {
    /// The storage of a producer of `config`, as `options` say (resolved).
    fn new(config: ProducerConfig, options: DurableOptions<T>) -> Self {
        let names = type_names(std::any::type_name::<T>(), &options.former_type_names);
        Self {
            config,
            options,
            names,
            encode: encode_body::<T>,
            decode: decode_body::<T>,
            log: None,
            epoch: 0,
            unsure_opens: 0,
            failures: 0,
            watched: false,
            renewing: false,
            takeovers: 0,
            next_seq: None,
            to_store: VecDeque::new(),
            storing: None,
            storing_chunks: None,
            chunk_doubts: Vec::new(),
            spans: BTreeMap::new(),
            unsettled: BTreeSet::new(),
            to_record: Vec::new(),
            recording: None,
            resumed: BTreeSet::new(),
            in_doubt: Vec::new(),
            carried: Vec::new(),
            stopping: None,
            counts: (0, 0, 0, 0),
        }
    }
}

impl<T> Durable<T> {
    /// `body` as it is stored: in the options' codec, at their message version.
    fn encode(&self, body: &T) -> Result<Vec<u8>, CodecError> {
        (self.encode)(
            body,
            self.options.config.codec,
            self.options.message_version,
            MAX_BODY_BYTES,
        )
    }

    /// Everything not yet stored, settled with `error` (the producer stops or restarts; no
    /// store of them was started, so they are certainly not stored).
    fn drain_unstored(&mut self, error: &DeliveryError) -> Vec<Settlement> {
        self.to_store
            .drain(..)
            .map(|(_, c)| (c, Err(error.clone())))
            .collect()
    }

    /// The log closes: the store in flight becomes in doubt and the settlements not yet
    /// recorded are carried, so that the next open settles both by what the journal holds.
    fn carry_unanswered(&mut self) {
        self.carry_chunks_unanswered();
        if let Some((first_seq, batch)) = self.storing.take() {
            let doubts = (first_seq..)
                .zip(batch)
                .map(|(seq, (body, confirm))| InDoubt {
                    seq,
                    body,
                    confirm,
                    reason: format!(
                        "stream `{}`: the producer ended before the journal answered the store",
                        self.options.stream
                    ),
                });
            self.in_doubt.extend(doubts);
        }
        let attempted = self.recording.take().into_iter().flatten();
        let attempted = attempted.map(|(seq, settlement)| Carried {
            seq,
            settlement,
            attempted: true,
        });
        let unattempted = self.to_record.drain(..).map(|(seq, settlement)| Carried {
            seq,
            settlement,
            attempted: false,
        });
        self.carried.extend(attempted.chain(unattempted));
    }

    /// The stores and settlement records of unknown outcome, settled as such: no restart
    /// will find out. A settlement that was never recorded is certainly not: the next start
    /// of the stream sends its message again (and its sink reports it).
    fn abandon_in_doubt(&mut self) -> Vec<Settlement> {
        let stores = self.in_doubt.drain(..).map(|doubt| {
            let reason = format!(
                "{}; the message may have been stored: if it was, the next start of the stream \
                 sends it and reports its confirmation to its sink",
                doubt.reason
            );
            (doubt.confirm, Err(DeliveryError::InDoubt(reason)))
        });
        let stream = &self.options.stream;
        let records = self.carried.drain(..).map(|carried| {
            let (confirm, _) = carried.settlement;
            if !carried.attempted {
                // Stored, its settlement not recorded: the next start sends it again.
                return (confirm, Err(DeliveryError::StoppedUnconfirmed));
            }
            let reason = format!(
                "stream `{stream}`: the consumer confirmed message {}, but the producer ended \
                 before the journal answered the record of it: if it was not recorded, the \
                 next start of the stream sends it again and reports it to its sink",
                carried.seq
            );
            (confirm, Err(DeliveryError::InDoubt(reason)))
        });
        let mut abandoned: Vec<Settlement> = stores.chain(records).collect();
        abandoned.extend(self.abandon_chunk_doubts());
        abandoned
    }
}

impl<T: Clone + Send + 'static> ProducerStorage<T> for Durable<T> {
    fn accept(&mut self, messages: &mut VecDeque<(T, Confirmation)>) {
        self.to_store.append(messages);
    }

    /// Keeps back the settlements that must be recorded first (of stored messages, confirmed
    /// or given up); the others stay in `settling` to fire at once (a stored message settled
    /// as stopped stays stored: the next start sends it again).
    fn hold_back(&mut self, settling: &mut Vec<Settlement>) {
        let mut index = 0;
        while index < settling.len() {
            let (confirm, result) = &settling[index];
            let stopped = result.as_ref().is_err_and(DeliveryError::is_stop);
            let recorded = confirm.message().filter(|_| !stopped);
            match recorded {
                Some(MessageId(seq)) => self.to_record.push((seq, settling.swap_remove(index))),
                None => index += 1,
            }
        }
    }

    /// Starts the log and opens the stream (after a journal failure, once a backoff has
    /// passed); the producer sends nothing before it is open.
    fn open(&mut self, producer: &mut Producer<'_, T>) {
        match self.failures {
            0 => self.open_now(producer),
            failures => {
                let delay = OPEN_BACKOFF_START
                    .saturating_mul(1 << (failures - 1).min(16))
                    .min(OPEN_BACKOFF_MAX);
                producer.run_later(delay, |durable: &mut Self, producer| {
                    durable.open_now(producer);
                });
            }
        }
    }

    /// Stores what was handed over and records what was settled, one write of each in
    /// flight at a time.
    fn flush(&mut self, producer: &mut Producer<'_, T>) {
        self.start_store(producer);
        self.record(producer);
        if self.stopping.is_some() && !self.is_writing() {
            // Every write is answered: stopped for good.
            producer.stop_for_good();
        }
    }

    /// Records what was settled (one record in flight at a time).
    fn record(&mut self, producer: &mut Producer<'_, T>) {
        let Some(log) = &self.log else {
            return;
        };
        if self.recording.is_some() || self.to_record.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.to_record);
        let seqs = batch.iter().map(|(seq, _)| *seq).collect();
        self.recording = Some(batch);
        let recorded = log.ask(LogCommand::Settle {
            epoch: self.epoch,
            seqs,
        });
        producer.spawn(recorded, |durable: &mut Self, reply, producer| {
            durable.recorded(reply, producer);
        });
    }

    /// What is not stored yet never will be (settled `ProducerStopped`); the store, record or
    /// opening in flight is answered, until [`DurableOptions::stop_timeout`].
    fn stop(&mut self, settling: &mut Vec<Settlement>) -> bool {
        if self.stopping.is_some() {
            return false;
        }
        self.stopping = Some(now() + self.options.config.stop_timeout);
        settling.extend(self.drain_unstored(&DeliveryError::ProducerStopped));
        true
    }

    fn stop_deadline(&self) -> Option<Instant> {
        self.stopping
    }

    /// Stops the log and forgets what is in memory, except the writes that were unanswered
    /// (the next open settles them by what the journal holds).
    fn close(&mut self, settling: &mut Vec<Settlement>) {
        let unstored = self.drain_unstored(&DeliveryError::ProducerStopped);
        self.carry_unanswered();
        if let Some(log) = self.log.take() {
            log.stop();
        }
        self.next_seq = None;
        self.unsettled.clear();
        self.spans.clear();
        self.resumed.clear();
        settling.extend(unstored);
    }

    fn abandon(&mut self) -> Vec<Settlement> {
        self.abandon_in_doubt()
    }

    /// Whether the stream is open and nothing waits to be stored or recorded (before the
    /// stream is open, what it holds unsettled is not known yet).
    fn is_idle(&self) -> bool {
        self.next_seq.is_some()
            && self.to_store.is_empty()
            && self.storing.is_none()
            && !self.is_storing_chunks()
            && self.to_record.is_empty()
            && self.recording.is_none()
    }

    /// Whether a journal write this producer started is unanswered: the stream's opening,
    /// a store or a settlement record, or a settlement waits to be recorded, or writes of an
    /// earlier life wait for the next opening to settle them.
    fn is_writing(&self) -> bool {
        let opening = self.next_seq.is_none()
            && (self.log.is_some()
                || !self.in_doubt.is_empty()
                || !self.chunk_doubts.is_empty()
                || !self.carried.is_empty());
        opening
            || self.storing.is_some()
            || self.is_storing_chunks()
            || self.recording.is_some()
            || !self.to_record.is_empty()
    }

    fn add_stats(&self, stats: &mut ProducerStats) {
        let (stored, resumed, resumed_confirmed, partially_stored) = self.counts;
        (stats.stored, stats.resumed, stats.resumed_confirmed) =
            (stored, resumed, resumed_confirmed);
        stats.partially_stored = partially_stored;
        stats.takeovers = self.takeovers;
        // The id the next stored message gets (0 until the stream is open).
        stats.next_message_id = self.next_seq.unwrap_or(0);
        // Stored messages not durably settled yet.
        stats.unconfirmed = self.unsettled.len();
    }
}

impl<T: Clone + Send + 'static> Durable<T> {
    fn open_now(&mut self, producer: &mut Producer<'_, T>) {
        if let Some(lease) = self.options.config.lease {
            // A first opening watches the stream right before it (again after a failed one);
            // a reopening is of the owner itself.
            if self.epoch == 0 && !std::mem::take(&mut self.watched) {
                return self.watch(lease, producer);
            }
        }
        let config = PersistentConfig {
            snapshot_every: Some(self.options.config.snapshot_every),
            delete_events_on_snapshot: true,
            // The log's own records: the crate versions them (the messages in them are in
            // the options' codec).
            codec: Codec::Bincode,
            ..PersistentConfig::default()
        };
        let journal = Arc::clone(&self.options.journal);
        let stream = self.options.stream.clone();
        let names = self.names.clone();
        let log = match PersistentHandle::start_log(journal, stream, config, names) {
            Ok(log) => log,
            Err(error) => return self.fail(Failure::Error(error.to_string()), producer),
        };
        let producer_id = producer.id().to_string();
        let chunk_version = producer
            .core()
            .chunking()
            .map(|chunking| chunking.schema().current_version());
        // A restart reopens as the opening it was: if another opened the stream since, it
        // was taken over and stops for good (it does not take the stream back).
        let opened = log.ask(LogCommand::Open {
            producer_id,
            incarnation: random_incarnation(),
            reopening: (self.epoch > 0).then_some((self.epoch, self.unsure_opens)),
            message_version: self.options.message_version,
            chunk_version,
        });
        self.log = Some(log);
        #[cfg(feature = "tracing")]
        let span =
            crate::telemetry::spans::recovery("durable_producer", self.options.stream.as_str());
        #[cfg(feature = "tracing")]
        let opened = tracing::Instrument::instrument(opened, span.clone());
        producer.spawn(
            opened,
            move |durable: &mut Self, reply, producer| match reply {
                Ok(LogReply::Opened {
                    epoch,
                    incarnation,
                    next_seq,
                    unsettled,
                    chunked,
                    dropped,
                }) => {
                    #[cfg(feature = "tracing")]
                    span.record("resumed", unsettled.len() + chunked.len());
                    let stored = Unsettled {
                        whole: unsettled,
                        chunked,
                        dropped,
                    };
                    durable.resume(epoch, incarnation, next_seq, stored, producer)
                }
                Ok(LogReply::Done) => unreachable!("Open replies Opened"),
                Err(error) => {
                    if let CommandError::Journal(_) = &error {
                        durable.unsure_opens += 1; // perhaps it committed
                    }
                    durable.fail_log(&error, producer)
                }
            },
        );
    }

    /// With a lease: opens the stream once nobody wrote to it for `lease` (it is new, or its
    /// owner is gone); stops for good if somebody did (its owner is alive).
    fn watch(&mut self, lease: Duration, producer: &mut Producer<'_, T>) {
        let journal = Arc::clone(&self.options.journal);
        let stream = self.options.stream.clone();
        let watched = async move {
            let before = journal.highest_seq(&stream).await?;
            if before == 0 {
                return Ok((0, 0)); // a new stream: nobody to watch
            }
            actix::clock::sleep(lease).await;
            Ok::<_, JournalError>((before, journal.highest_seq(&stream).await?))
        };
        producer.spawn(watched, move |durable: &mut Self, watched, producer| {
            let stream = &durable.options.stream;
            match watched {
                Ok((before, after)) if before == after => {
                    durable.watched = true;
                    durable.open_now(producer);
                }
                Ok((before, after)) => {
                    let reason = format!(
                        "stream `{stream}`: another producer wrote to it within the lease ({} \
                         entries in {lease:?}, up to seq {after}): it is alive, and this one \
                         does not take the stream over",
                        after - before
                    );
                    durable.fail_for_good(Failure::InUse(reason), producer);
                }
                Err(error) => {
                    let reason = format!("stream `{stream}`: {}", ErrorChain(&error));
                    durable.fail(Failure::Error(reason), producer);
                }
            }
        });
    }

    /// With a lease: writes to the stream every third of `lease`, so that a producer watching
    /// it before it opens sees this owner alive. A renewal the log refuses (the stream was
    /// taken over after all) stops the producer as a refused store would.
    fn renew_every(lease: Duration, producer: &mut Producer<'_, T>) {
        producer.run_interval(lease / 3, |durable: &mut Self, producer| {
            let Some(log) = &durable.log else {
                return;
            };
            if durable.renewing || durable.stopping.is_some() || durable.next_seq.is_none() {
                return;
            }
            durable.renewing = true;
            let renewed = log.ask(LogCommand::Renew {
                epoch: durable.epoch,
            });
            producer.spawn(renewed, |durable: &mut Self, reply, producer| {
                durable.renewing = false;
                if let Err(error) = reply {
                    durable.fail_log(&error, producer);
                }
            });
        });
    }

    /// The stream is open: the core continues the stored life and resends what is unsettled,
    /// and the stores of unknown outcome are settled by what the journal holds.
    fn resume(
        &mut self,
        epoch: u64,
        incarnation: Incarnation,
        next_seq: u64,
        stored: Unsettled,
        producer: &mut Producer<'_, T>,
    ) {
        let chunking = producer.core().chunking().cloned();
        let Unsettled {
            whole: unsettled,
            chunked,
            dropped,
        } = stored;
        let mixed = match &chunking {
            Some(_) if !unsettled.is_empty() => Some("whole messages, and this producer chunks"),
            None if !chunked.is_empty() || !dropped.is_empty() => {
                Some("chunked messages, and this producer has no chunk_size")
            }
            _ => None,
        };
        if let Some(mixed) = mixed {
            let reason = format!(
                "stream `{}` holds unsettled {mixed}: open it as it was written until its \
                 messages are confirmed",
                self.options.stream
            );
            return self.fail_for_good(Failure::Error(reason), producer);
        }
        let chunked = match &chunking {
            Some(chunking) => restore_chunked(chunking, &self.options.stream, chunked),
            None => Ok(Vec::new()),
        };
        let chunked = match chunked {
            Ok(chunked) => chunked,
            Err(reason) => return self.fail_for_good(Failure::Error(reason), producer),
        };
        let mut in_doubt: BTreeMap<u64, InDoubt<T>> =
            self.in_doubt.drain(..).map(|d| (d.seq, d)).collect();
        let mut carried: BTreeMap<u64, Carried> =
            self.carried.drain(..).map(|c| (c.seq, c)).collect();
        // No other opening came between the last one of this producer and this one (openings
        // are numbered; a failed opening of its own that did not commit took no number): what
        // the stream holds settled was settled by this producer.
        let alone = epoch == self.epoch + 1;
        let mut resumed = Vec::with_capacity(unsettled.len());
        for (seq, bytes) in unsettled {
            // A store of unknown outcome that committed: its caller hears of it after all.
            let committed =
                in_doubt
                    .remove(&seq)
                    .and_then(|doubt| match self.encode(&doubt.body) {
                        Ok(stored) if stored == bytes => Some(doubt),
                        _ => {
                            in_doubt.insert(seq, doubt); // another message: not this one's
                            None
                        }
                    });
            if let Some(mut doubt) = committed {
                doubt.confirm.notify_stored(MessageId(seq));
                self.counts.0 += 1; // stored after all
                self.unsettled.insert(seq);
                resumed.push((seq, doubt.body, doubt.confirm));
                continue;
            }
            let decoded = (self.decode)(&bytes, self.options.message_version, self.options.upcast);
            let body = match decoded {
                Ok(body) => body,
                Err(error) => {
                    self.in_doubt.extend(in_doubt.into_values());
                    self.carried.extend(carried.into_values());
                    let reason = format!(
                        "stream `{}`: stored message {seq} cannot be read: {error}",
                        self.options.stream
                    );
                    return self.fail_for_good(Failure::Error(reason), producer);
                }
            };
            // A settlement whose record did not commit: its message is sent again, and its
            // own confirmation (not the sink) hears the outcome.
            if let Some(carried) = carried.remove(&seq) {
                self.unsettled.insert(seq);
                resumed.push((seq, body, carried.settlement.0));
                continue;
            }
            let mut confirm = match &self.options.sink {
                Some(sink) => sink_confirmation(sink.clone(), MessageId(seq)),
                None => Confirmation::none(),
            };
            confirm.notify_stored(MessageId(seq));
            self.unsettled.insert(seq);
            self.resumed.insert(seq);
            resumed.push((seq, body, confirm));
        }
        let mut resumed_chunks = self.resume_chunks(chunked, dropped, &mut carried, producer);
        // Resent messages hold room like new ones, so the core never holds more than its
        // room (as far as the room allows: a smaller room than the last life's holds them all).
        let mut room = producer.take_room(self.resumed.len());
        let resent = resumed.iter_mut().map(|(seq, _, confirm)| (*seq, confirm));
        let resent_chunks = resumed_chunks
            .iter_mut()
            .map(|(first, chunks, confirm)| (*first + chunks.len() as u64 - 1, confirm));
        for (id, confirm) in resent.chain(resent_chunks) {
            if room > 0 && self.resumed.contains(&id) {
                *confirm = std::mem::replace(confirm, Confirmation::none()).holding_room();
                room -= 1;
            }
        }
        // Not among the unsettled: not stored if its seq was never stored; otherwise another
        // producer's opening of the stream stored a message there, this one or its own, and
        // settled it.
        let not_stored = in_doubt.into_values().map(|doubt| {
            let error = if doubt.seq >= next_seq {
                DeliveryError::Storage(format!("{}; it was not stored", doubt.reason))
            } else {
                DeliveryError::InDoubt(format!(
                    "{}; another producer opened the stream meanwhile and settled message {}, \
                     this one or its own",
                    doubt.reason, doubt.seq
                ))
            };
            (doubt.confirm, Err(error))
        });
        producer.settle(not_stored);
        // Settlements whose message the journal holds settled: their record committed, unless
        // another producer opened the stream meanwhile and may have recorded (and reported) it.
        let stream = &self.options.stream;
        let recorded = carried.into_values().map(|carried| {
            let (confirm, result) = carried.settlement;
            if alone {
                return (confirm, result);
            }
            let reason = format!(
                "stream `{stream}`: the consumer confirmed message {}, and another producer \
                 opened the stream meanwhile: it may have recorded and reported it",
                carried.seq
            );
            (confirm, Err(DeliveryError::InDoubt(reason)))
        });
        producer.settle(recorded);
        self.counts.1 += self.resumed.len() as u64;
        let resending = resumed.len() + resumed_chunks.len();
        if resending > 0 {
            log::info!(
                "durable producer `{}`: sending {resending} stored message(s) again",
                producer.id(),
            );
        }
        if self.epoch == 0 && epoch > 1 {
            // Its first opening, of a stream opened before: taken from the opening before it,
            // whether that one's producer is gone (a restart) or alive (a second instance,
            // which stops at its next write).
            self.takeovers += 1;
            log::info!(
                "durable producer `{}` took stream `{}` over from opening {} (the newest opener \
                 owns a stream)",
                producer.id(),
                self.options.stream,
                epoch - 1
            );
        }
        self.epoch = epoch;
        self.unsure_opens = 0;
        self.failures = 0;
        self.next_seq = Some(next_seq);
        producer.opened();
        // The log checked that its seqs ascend below its next seq.
        let config = &self.config;
        *producer.core() = match chunking {
            None => Core::Whole(ProducerCore::resume(
                config,
                incarnation,
                next_seq,
                resumed,
                random_u64,
            )),
            Some(chunking) => {
                let core = ChunkedProducer::resume(
                    config,
                    incarnation,
                    next_seq,
                    resumed_chunks,
                    random_u64,
                );
                Core::Chunked(core, chunking)
            }
        };
        if self.stopping.is_some() {
            // Opened only to settle what was in doubt: what it holds is sent by the next start.
            producer.core().stop();
        }
        if let Some(lease) = self.options.config.lease {
            Self::renew_every(lease, producer);
        }
        producer.flush();
    }

    /// Stores what was handed over (one store in flight at a time): as many waiting messages
    /// as fit in one journal entry.
    fn start_store(&mut self, producer: &mut Producer<'_, T>) {
        if producer.core().chunking().is_some() {
            return self.start_store_chunks(producer);
        }
        let (Some(first_seq), Some(log)) = (self.next_seq, &self.log) else {
            return; // not open yet
        };
        if self.storing.is_some() || self.stopping.is_some() || self.to_store.is_empty() {
            return;
        }
        // One journal entry: as many waiting messages as fit.
        let (mut batch, mut bodies, mut bytes) = (Vec::new(), Vec::new(), 0);
        while let Some((body, _)) = self.to_store.front() {
            let encoded = self.encode(body);
            let size = encoded.as_ref().map_or(0, |b| b.len() + EVENT_OVERHEAD);
            if !bodies.is_empty() && bytes + size > MAX_STORE_BYTES {
                break; // the next store takes it
            }
            let (body, confirm) = self.to_store.pop_front().expect("looked at it");
            match encoded {
                Ok(encoded) => {
                    bytes += size;
                    bodies.push(encoded);
                    batch.push((body, confirm));
                }
                Err(error) => {
                    let reason = format!("the message cannot be stored: {error}");
                    producer.settle([(confirm, Err(DeliveryError::Storage(reason)))]);
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        self.next_seq = Some(first_seq + batch.len() as u64);
        self.storing = Some((first_seq, batch));
        let stored = log.ask(LogCommand::Store {
            epoch: self.epoch,
            first_seq,
            bodies,
        });
        producer.spawn(stored, |durable: &mut Self, reply, producer| {
            durable.stored(reply, producer);
        });
    }

    /// A store was answered: its messages go to the core (or, stopping, stay stored for the
    /// next start), or the journal failed.
    fn stored(&mut self, reply: LogAnswer, producer: &mut Producer<'_, T>) {
        let Some((first_seq, batch)) = self.storing.take() else {
            return; // the log closed meanwhile: the store is in doubt
        };
        let count = batch.len() as u64;
        let batch = (first_seq..).zip(batch);
        if let Err(error) = reply {
            let reason = log_error(&self.options.stream, &error);
            if let CommandError::Journal(_) = error {
                // Perhaps committed: the restart finds out.
                let doubts = batch.map(|(seq, (body, confirm))| InDoubt {
                    seq,
                    body,
                    confirm,
                    reason: reason.clone(),
                });
                self.in_doubt.extend(doubts);
            } else {
                // Refused before the journal: not stored, never sent.
                let failed = batch.map(|(_, (_, confirm))| {
                    (confirm, Err(DeliveryError::Storage(reason.clone())))
                });
                producer.settle(failed);
            }
            return self.fail_log(&error, producer);
        }
        self.counts.0 += count;
        for (seq, (body, mut confirm)) in batch {
            confirm.notify_stored(MessageId(seq));
            self.unsettled.insert(seq);
            if self.stopping.is_some() {
                // Stored, not sent: the next start of the stream sends it.
                producer.settle([(confirm, Err(DeliveryError::StoppedUnconfirmed))]);
                continue;
            }
            let Core::Whole(core) = producer.core() else {
                unreachable!("chunked durable producers store chunks")
            };
            if let Err((body, confirm)) = core.handle_stored(seq, body, confirm) {
                // Unreachable: the core numbers from the same next seq. Stored, so the
                // restart sends it (and tells its caller).
                let reason = format!("stored message {seq} is not the core's next seq");
                let doubt = InDoubt {
                    seq,
                    body,
                    confirm,
                    reason: reason.clone(),
                };
                self.in_doubt.push(doubt);
                return self.fail(Failure::Error(reason), producer);
            }
        }
        producer.flush();
    }

    /// A settlement record was answered: its confirmations fire, and the core may forget
    /// what is durably settled; or the journal failed.
    fn recorded(&mut self, reply: LogAnswer, producer: &mut Producer<'_, T>) {
        let Some(batch) = self.recording.take() else {
            return; // the log closed meanwhile: the record is in doubt
        };
        if let Err(error) = reply {
            // Perhaps recorded: the restart finds out (and tells the callbacks).
            self.recording = Some(batch);
            return self.fail_log(&error, producer);
        }
        for (seq, (_, result)) in &batch {
            self.unsettled.remove(seq);
            self.spans.remove(seq);
            if self.resumed.remove(seq) && result.is_ok() {
                self.counts.2 += 1;
            }
        }
        let below = self.unsettled.first().map(|&id| self.first_seq_of(id));
        let below = below.or(self.next_seq);
        if let Some(below) = below {
            producer.core().set_durably_settled_below(below);
        }
        producer.settle(batch.into_iter().map(|(_, settlement)| settlement));
        producer.flush();
    }

    /// The log refused or failed: a restart cannot help a stream taken over, another
    /// producer's, corrupt or of a schema this code cannot read, so the producer stops for good
    /// then; otherwise it restarts (under a `Supervisor`).
    fn fail_log(&mut self, error: &CommandError<LogRefusal>, producer: &mut Producer<'_, T>) {
        let reason = log_error(&self.options.stream, error);
        match error {
            CommandError::Rejected(LogRefusal::TakenOver { .. }) => {
                self.fail_for_good(Failure::TakenOver(reason), producer);
            }
            CommandError::Rejected(
                LogRefusal::OtherProducer { .. } | LogRefusal::Corrupt(_) | LogRefusal::Newer(_),
            )
            | CommandError::Recovery(
                JournalError::Corrupt { .. }
                | JournalError::Incompatible { .. }
                | JournalError::ForeignType { .. }
                | JournalError::Schema { .. },
            ) => {
                self.fail_for_good(Failure::Error(reason), producer);
            }
            _ => self.fail(Failure::Error(reason), producer),
        }
    }

    /// As [`fail`](Self::fail), and the producer stays stopped.
    fn fail_for_good(&mut self, failure: Failure, producer: &mut Producer<'_, T>) {
        producer.make_final();
        self.fail(failure, producer);
    }

    /// The journal failed (or refused): settle what was not stored with the reason, and
    /// stop the producer (a `Supervisor` restarts it on what the journal holds, which settles
    /// the writes that were unanswered). The handles' `stopped()` says why if it stays
    /// stopped.
    fn fail(&mut self, failure: Failure, producer: &mut Producer<'_, T>) {
        log::error!(
            "durable producer `{}` stops: its journal failed: {failure}",
            producer.id()
        );
        self.failures = self.failures.saturating_add(1);
        producer.settle(self.drain_unstored(&DeliveryError::Storage(failure.to_string())));
        producer.fail(failure);
    }
}

/// What an opening found unsettled: whole messages, chunked ones stored whole, and the
/// headers of chunked ones only partly stored (dropped by the opening).
struct Unsettled {
    whole: Vec<(u64, Vec<u8>)>,
    chunked: Vec<crate::durable::log::StoredChunks>,
    dropped: Vec<crate::protocol::chunk::ChunkHeader>,
}

/// A confirmation that tells the sink (for a message resumed after a restart).
fn sink_confirmation(sink: Recipient<DurableConfirmation>, id: MessageId) -> Confirmation {
    Confirmation::callback(move |result| {
        // Not an outcome: the message stays stored, and the next start reports it.
        if !result.as_ref().is_err_and(DeliveryError::is_stop) {
            sink.do_send(DurableConfirmation { id, result });
        }
    })
}

/// What went wrong with the log of `stream`, for callers and the log.
fn log_error(stream: &PersistenceId, error: &CommandError<LogRefusal>) -> String {
    match error {
        CommandError::Rejected(reason) => format!("stream `{stream}`: {reason}"),
        other => format!("stream `{stream}`: {}", ErrorChain(other)),
    }
}

/// A durable producer: it stores every message in `durable`'s journal stream before it
/// sends it, and resumes the stream's life when started (see [`crate::durable`]). Its id is
/// the one `durable` names.
///
/// # Errors
/// [`OptionsError`] naming the first invalid setting of `durable`, or `producer_id` if the id
/// is invalid or `options` fix another one.
fn durable_producer<T>(
    options: ProducerOptions<T>,
    mut durable: DurableOptions<T>,
) -> Result<ProducerController<T>, OptionsError>
where
    T: Clone + Send + Serialize + DeserializeOwned + 'static,
{
    durable.resolve()?;
    let id = durable.producer_id.as_str();
    if let Some(other) = options
        .config()
        .producer_id
        .as_deref()
        .filter(|other| *other != id)
    {
        return Err(OptionsError::new(
            "producer_id",
            format!(
                "the producer options fix `{other}`, the durable options `{id}`: a durable \
                 producer's id is its stream's, set in DurableOptions::new"
            ),
        ));
    }
    // Its chunks are what it stores: in process they are written as the durable options say
    // (across processes in the transport's schema, which reads them back).
    let stored_as = BodySchema::new()
        .codec(durable.config.codec)
        .version(durable.message_version)
        .upcast(durable.upcast);
    let options = options
        .with_producer_id(id)?
        .with_chunks_stored_as(stored_as);
    if let Some(size) = options.chunk_size().filter(|&s| s as u64 > MAX_BODY_BYTES) {
        return Err(OptionsError::new(
            "chunk_size",
            format!(
                "a durable producer stores each chunk in one journal entry: at most \
                 {MAX_BODY_BYTES} bytes (got {size})"
            ),
        ));
    }
    let storage = Durable::new(options.config().clone(), durable);
    Ok(ProducerController::stored_in(options, Box::new(storage)))
}

/// Starts a durable producer where its options place it, supervised unless its durable
/// options say to stop on a journal failure: what
/// [`ReliableDelivery::durable_producer`] does, and how the subsystems below the facade start
/// theirs.
///
/// # Errors
/// [`OptionsError`] naming the first invalid setting of `durable`, or `producer_id` if the id
/// is invalid or `options` fix another one.
///
/// [`ReliableDelivery::durable_producer`]: crate::ReliableDelivery::durable_producer
pub(crate) fn start_durable_producer<T>(
    options: ProducerOptions<T>,
    durable: DurableOptions<T>,
) -> Result<ProducerHandle<T>, OptionsError>
where
    T: Clone + Send + Serialize + DeserializeOwned + 'static,
{
    let placement = Placement {
        supervised: durable.restart_on_failure,
        ..options.placement().clone()
    };
    Ok(ProducerHandle::start(
        durable_producer(options, durable)?,
        &placement,
    ))
}
