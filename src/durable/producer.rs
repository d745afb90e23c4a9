//! The durable side of a producer, the storage it holds ([`ProducerStorage`]): its log (a
//! persistent actor), the messages on their way into it, and the settlements on their way
//! into it; and the start of a durable producer. Opening its stream is in `opening.rs`,
//! chunked messages in `chunks.rs`.

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
mod opening;

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
    /// When each store of this process committed, by the first id it stored: the age of the
    /// oldest unsettled message, computed when the stats are asked (entries below the oldest
    /// unsettled one's are dropped as records come in). Kept across supervised restarts.
    stored_at: BTreeMap<u64, Instant>,
    /// When this process first opened the stream: the age of messages stored by an earlier
    /// process counts from it.
    opened_at: Option<Instant>,
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
            stored_at: BTreeMap::new(),
            opened_at: None,
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
        // Stored messages not durably settled yet, and how long the oldest has waited.
        stats.unconfirmed = self.unsettled.len();
        stats.oldest_unconfirmed_ms = self.unsettled.first().and_then(|&oldest| {
            let stored = self.stored_at.range(..=oldest).next_back();
            let since = stored.map(|(_, &at)| at).or(self.opened_at)?;
            Some(now().saturating_duration_since(since).as_millis() as u64)
        });
        // Writes of unknown outcome, waiting for the next opening.
        let records = self.carried.iter().filter(|carried| carried.attempted);
        stats.in_doubt = self.in_doubt.len() + self.chunk_doubts.len() + records.count();
    }
}

impl<T: Clone + Send + 'static> Durable<T> {
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
        self.stored_at.insert(first_seq, now());
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
        self.forget_stored_at();
        let below = self.unsettled.first().map(|&id| self.first_seq_of(id));
        let below = below.or(self.next_seq);
        if let Some(below) = below {
            producer.core().set_durably_settled_below(below);
        }
        producer.settle(batch.into_iter().map(|(_, settlement)| settlement));
        producer.flush();
    }

    /// Drops the store times below the oldest unsettled message's store (the stats read only
    /// the time of the store that holds the oldest).
    fn forget_stored_at(&mut self) {
        let Some(&oldest) = self.unsettled.first() else {
            return self.stored_at.clear();
        };
        while let Some((&second, _)) = self.stored_at.iter().nth(1)
            && second <= oldest
        {
            self.stored_at.pop_first();
        }
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
