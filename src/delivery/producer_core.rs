//! What a producer actor drives: the protocol core of whole messages, or, with
//! [`chunk_size`](crate::ProducerOptionsBuilder::chunk_size), the chunked core with how its
//! messages are encoded (once each, into chunks) and how the consumer reads them back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::schema::BodySchema;
use crate::codec::schema::Unread;
use crate::codec::{self, CodecError, Manifest, TYPE_CHANGED};
use crate::config::ProducerConfig;
use crate::delivery::confirmation::Confirmation;
use crate::delivery::message::{ChunkDelivery, ConsumerRef, Decode, Delivery, ReplyTo, SchemaOf};
use crate::error::DeliveryError;
use crate::protocol::chunk::producer::ChunkedProducer;
use crate::protocol::chunk::{split_into, Assembled, ChunkHeader};
use crate::protocol::envelope::{Ack, Incarnation, ProducerId};
use crate::protocol::producer::{GivenUp, ProducerCore, ProducerStats};
use crate::runtime::random::random_u64;

/// How a schema writes a message of `T` into chunks of a given size.
type WriteChunks<T> = fn(&BodySchema<T>, &T, usize) -> Result<Vec<Bytes>, CodecError>;
/// How a schema reads a reassembled message of `T`.
type ReadAssembled<T> = fn(&BodySchema<T>, Assembled) -> Result<T, Unread>;

/// How a producer with `chunk_size` sends its messages: the schema they are written in (in
/// process a fixed one; across processes the transport's, looked up when used), with `T`'s
/// encoding and decoding in it.
pub(crate) struct Chunking<T> {
    /// The size of a chunk in bytes.
    pub(crate) chunk_size: usize,
    schema: SchemaOf<T>,
    /// Whether `schema` is a transport's.
    carried: bool,
    write: WriteChunks<T>,
    read: ReadAssembled<T>,
    /// How the consumer reads a reassembled message in process (carried by each chunk; a
    /// transport's receiver reads it in its own schema).
    pub(crate) decode: Decode<T>,
}

impl<T> Clone for Chunking<T> {
    fn clone(&self) -> Self {
        Self {
            chunk_size: self.chunk_size,
            schema: self.schema.clone(),
            carried: self.carried,
            write: self.write,
            read: self.read,
            decode: self.decode.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Chunking<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chunking")
            .field("chunk_size", &self.chunk_size)
            .field("carried", &self.carried)
            .finish_non_exhaustive()
    }
}

/// A producer's core: whole messages, or chunked ones.
#[allow(clippy::large_enum_variant)] // one per producer actor, which it never leaves
pub(crate) enum Core<T> {
    Whole(ProducerCore<T, Confirmation>),
    Chunked(ChunkedProducer<Confirmation>, Chunking<T>),
}

impl<T: Clone> Core<T> {
    /// A new life under `incarnation`.
    pub(crate) fn new(
        config: &ProducerConfig,
        incarnation: Incarnation,
        chunking: Option<Chunking<T>>,
    ) -> Self {
        match chunking {
            Some(chunking) => Self::Chunked(
                ChunkedProducer::seeded(config, incarnation, random_u64),
                chunking,
            ),
            None => Self::Whole(ProducerCore::seeded(config, incarnation, random_u64)),
        }
    }

    /// How its messages are chunked, if they are.
    pub(crate) fn chunking(&self) -> Option<&Chunking<T>> {
        match self {
            Self::Whole(_) => None,
            Self::Chunked(_, chunking) => Some(chunking),
        }
    }

    pub(crate) fn id(&self) -> &ProducerId {
        match self {
            Self::Whole(core) => core.id(),
            Self::Chunked(core, _) => core.id(),
        }
    }

    pub(crate) fn is_idle(&self) -> bool {
        match self {
            Self::Whole(core) => core.is_idle(),
            Self::Chunked(core, _) => core.is_idle(),
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        match self {
            Self::Whole(core) => core.next_deadline(),
            Self::Chunked(core, _) => core.next_deadline(),
        }
    }

    /// Keeps given-up messages for [`take_given_up`](Self::take_given_up): a whole-message
    /// core only (options refuse it with chunks).
    pub(crate) fn keep_given_up(&mut self) {
        if let Self::Whole(core) = self {
            core.keep_given_up();
        }
    }

    /// The messages given up since the last call, and the incarnation they were sent under.
    pub(crate) fn take_given_up(&mut self) -> (Incarnation, Vec<GivenUp<T>>) {
        match self {
            Self::Whole(core) => (core.incarnation(), core.take_given_up()),
            Self::Chunked(core, _) => (core.incarnation(), Vec::new()),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self {
            Self::Whole(core) => core.handle_timeout(now),
            Self::Chunked(core, _) => core.handle_timeout(now),
        }
    }

    pub(crate) fn handle_ack(&mut self, ack: &Ack) -> bool {
        match self {
            Self::Whole(core) => core.handle_ack(ack),
            Self::Chunked(core, _) => core.handle_ack(ack),
        }
    }

    /// See [`ProducerCore::handle_given_up`]. Only a work-pulling pool gives messages up, and
    /// its producer does not chunk: a chunked core ignores it.
    pub(crate) fn handle_given_up(&mut self, ack: &Ack, error: DeliveryError) -> bool {
        match self {
            Self::Whole(core) => core.handle_given_up(ack, error),
            Self::Chunked(..) => false,
        }
    }

    pub(crate) fn stop(&mut self) {
        match self {
            Self::Whole(core) => core.stop(),
            Self::Chunked(core, _) => core.stop(),
        }
    }

    pub(crate) fn restart(&mut self, incarnation: Incarnation) {
        match self {
            Self::Whole(core) => core.restart(incarnation),
            Self::Chunked(core, _) => core.restart(incarnation),
        }
    }

    pub(crate) fn stats(&self) -> ProducerStats {
        match self {
            Self::Whole(core) => core.stats(),
            Self::Chunked(core, _) => core.stats(),
        }
    }

    pub(crate) fn set_durably_settled_below(&mut self, seq: u64) {
        match self {
            Self::Whole(core) => core.set_durably_settled_below(seq),
            Self::Chunked(core, _) => core.set_durably_settled_below(seq),
        }
    }

    /// How many of the settled messages not polled yet hold room in the producer.
    pub(crate) fn settled_room(&self) -> usize {
        match self {
            Self::Whole(core) => core.settled().filter(|c| c.holds_room()).count(),
            Self::Chunked(core, _) => core.settled().filter(|c| c.holds_room()).count(),
        }
    }

    pub(crate) fn poll_settled(&mut self) -> Option<(Confirmation, Result<(), DeliveryError>)> {
        match self {
            Self::Whole(core) => core.poll_settled(),
            Self::Chunked(core, _) => core.poll_settled(),
        }
    }

    /// Takes messages handed over, in order (see [`ProducerCore::handle_send_all`]). Chunked,
    /// each is encoded now, once.
    pub(crate) fn handle_send_all(&mut self, messages: &mut VecDeque<(T, Confirmation)>) {
        match self {
            Self::Whole(core) => core.handle_send_all(messages),
            Self::Chunked(..) => {
                for (body, confirm) in messages.drain(..) {
                    let _ = self.handle_send(body, confirm);
                }
            }
        }
    }

    /// Takes one message (see [`ProducerCore::handle_send`]).
    ///
    /// # Errors
    /// The body is handed back when there is no room (its confirmation settled).
    pub(crate) fn handle_send(&mut self, body: T, confirm: Confirmation) -> Result<(), T> {
        match self {
            Self::Whole(core) => core.handle_send(body, confirm),
            Self::Chunked(core, chunking) => match chunking.chunks_of(&body) {
                Ok(chunks) => core.handle_send(chunks, confirm).map_err(|_| body),
                Err(error) => {
                    core.handle_unsendable(confirm, error);
                    Ok(())
                }
            },
        }
    }

    /// Sends what the core transmits now to `consumer`, ACKs to `reply_to`.
    pub(crate) fn transmit(&mut self, now: Instant, consumer: &ConsumerRef<T>, reply_to: &ReplyTo)
    where
        T: Send + 'static,
    {
        match self {
            Self::Whole(core) => {
                let deliveries = std::iter::from_fn(|| {
                    core.poll_transmit_with(now, Confirmation::trace_context)
                })
                .map(|transmission| Delivery::from_transmission(transmission, reply_to.clone()));
                consumer.do_send_all(deliveries);
            }
            Self::Chunked(core, chunking) => {
                let chunks = std::iter::from_fn(|| {
                    core.poll_transmit_with(now, Confirmation::trace_context)
                })
                .filter_map(|t| {
                    let reply_to = Some(reply_to.clone());
                    ChunkDelivery::new(t.header, t.body, reply_to, chunking.decode.clone())
                });
                consumer.send_chunks(chunks);
            }
        }
    }
}

impl<T: 'static> Chunking<T> {
    /// Chunks of `chunk_size` bytes, written in process as `schema` says.
    pub(crate) fn new(chunk_size: usize, schema: BodySchema<T>) -> Self
    where
        T: Serialize + DeserializeOwned,
    {
        let read = BodySchema::<T>::read_assembled;
        let schema: SchemaOf<T> = Arc::new(move || schema);
        Self {
            chunk_size,
            decode: decoder(schema.clone(), read),
            schema,
            carried: false,
            write: BodySchema::<T>::write_chunks,
            read,
        }
    }

    /// The same chunks, written in the schema of the transport that carries them.
    pub(crate) fn carried_in(mut self, schema: SchemaOf<T>) -> Self {
        self.decode = decoder(schema.clone(), self.read);
        self.schema = schema;
        self.carried = true;
        self
    }

    /// The same chunks, written in process as `schema` says (a durable producer stores its
    /// chunks: in process they are written as its durable options say); a transport's schema
    /// stays.
    pub(crate) fn stored_as(self, schema: BodySchema<T>) -> Self {
        if self.carried {
            return self;
        }
        let schema: SchemaOf<T> = Arc::new(move || schema);
        Self {
            decode: decoder(schema.clone(), self.read),
            schema,
            ..self
        }
    }
}

impl<T> Chunking<T> {
    /// The schema messages are written in now.
    pub(crate) fn schema(&self) -> BodySchema<T> {
        (self.schema)()
    }

    /// `body` encoded into chunks.
    pub(crate) fn chunks_of(&self, body: &T) -> Result<Vec<Bytes>, DeliveryError> {
        (self.write)(&self.schema(), body, self.chunk_size)
            .map_err(|error| DeliveryError::Unencodable(error.to_string()))
    }

    /// A stored chunked message (its `header` and `stored` chunks) as this producer sends
    /// it: as stored when it was written at the version the schema writes and its chunks fit
    /// `chunk_size`; otherwise read (an older version through the schema's upcaster), written
    /// again at the schema's version and split anew over the same seqs (so its id and the
    /// messages around it stay).
    ///
    /// # Errors
    /// Why it cannot be sent, naming the versions: it does not read (a version newer than the
    /// schema's, an older one its upcaster refuses, or one that does not decode: the type
    /// changed without a new version), or, written again, it no longer fits its seqs.
    pub(crate) fn restore(
        &self,
        header: ChunkHeader,
        stored: Vec<Bytes>,
    ) -> Result<Vec<Bytes>, String> {
        let schema = self.schema();
        let current = schema.current_version();
        let mut message = Assembled::new(stored.iter().cloned());
        let len = message.len();
        let Ok((codec, version)) = codec::decode_prefix_from::<(u8, u32)>(&mut message, len) else {
            return Err("it has no codec and version header".to_owned());
        };
        let body = match (self.read)(&schema, Assembled::new(stored.iter().cloned())) {
            Ok(body) => body,
            Err(unread) if version != current => return Err(unread.why), // names both versions
            Err(unread) => {
                let written = Manifest::from_stored(codec, std::any::type_name::<T>(), version);
                let why = unread.why;
                return Err(format!(
                    "written as {written}, it does not decode: {why} {TYPE_CHANGED}"
                ));
            }
        };
        if version == current && stored.iter().all(|chunk| chunk.len() <= self.chunk_size) {
            return Ok(stored);
        }
        let again = |why: String| format!("written again at version {current}, {why}");
        let whole = (self.write)(&schema, &body, usize::MAX)
            .map_err(|error| again(format!("it does not encode: {error}")))?;
        let whole = whole.into_iter().next().unwrap_or_default(); // one chunk: no size limit
        split_into(&whole, header.chunks, self.chunk_size).ok_or_else(|| {
            again(format!(
                "its {} bytes do not fit its {} chunks of at most {} bytes",
                whole.len(),
                header.chunks,
                self.chunk_size
            ))
        })
    }
}

/// How the consumer reads a reassembled message written in `schema`.
fn decoder<T: 'static>(schema: SchemaOf<T>, read: ReadAssembled<T>) -> Decode<T> {
    Arc::new(move |message| read(&schema(), message))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;
    use crate::codec::{Codec, UpcastError, Written};

    /// A report as version 1 wrote it.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct ReportV1 {
        text: String,
    }

    /// Version 2: the text became words.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Report {
        words: Vec<String>,
    }

    fn upcast(old: Written<'_>) -> Result<Report, UpcastError> {
        let v1: ReportV1 = old.decode()?;
        let words = v1.text.split(' ').map(str::to_owned).collect();
        Ok(Report { words })
    }

    fn text() -> String {
        "lorem ipsum ".repeat(300)
    }

    /// `value` as a producer writing `schema` in chunks of `size` bytes stored it, from seq 5.
    fn stored<T>(schema: BodySchema<T>, size: usize, value: &T) -> (ChunkHeader, Vec<Bytes>)
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        let chunks = Chunking::new(size, schema).chunks_of(value).unwrap();
        let header = ChunkHeader {
            first_seq: 5,
            chunks: chunks.len() as u32,
            message_len: chunks.iter().map(|c| c.len() as u64).sum(),
        };
        (header, chunks)
    }

    fn read<T>(chunking: &Chunking<T>, chunks: Vec<Bytes>) -> T {
        (chunking.read)(&chunking.schema(), Assembled::new(chunks)).unwrap()
    }

    #[test]
    fn a_stored_message_of_todays_version_that_fits_is_sent_as_stored() {
        let schema = BodySchema::new().codec(Codec::MessagePack).version(2);
        let report = Report {
            words: vec!["a".into(); 1000],
        };
        let (header, chunks) = stored(schema, 1024, &report);
        let chunking = Chunking::new(1024, schema.upcast(upcast));
        let sent = chunking.restore(header, chunks.clone()).unwrap();
        assert_eq!(sent, chunks);
        assert_eq!(sent[0].as_ptr(), chunks[0].as_ptr(), "the stored bytes");
    }

    #[test]
    fn an_older_version_is_upcast_written_again_and_spread_over_its_own_seqs() {
        let v1 = ReportV1 { text: text() };
        let (header, chunks) = stored(BodySchema::new(), 1024, &v1);
        let today = BodySchema::new().version(2).upcast(upcast);
        let chunking = Chunking::new(1024, today);
        let sent = chunking.restore(header, chunks).unwrap();
        assert_eq!(sent.len(), header.chunks as usize, "the same seqs");
        assert!(sent.iter().all(|c| !c.is_empty() && c.len() <= 1024));
        let again = Assembled::new(sent.iter().cloned()).into_bytes();
        let header_of = |bytes: &[u8]| codec::decode_prefix::<(u8, u32)>(bytes, 8).unwrap().0;
        assert_eq!(header_of(&again).1, 2, "written at today's version");
        assert_eq!(read(&chunking, sent), upcast_of(&v1));
        // Chunks larger than today's chunk size are split anew too.
        let (header, chunks) = stored(today, 2048, &upcast_of(&v1));
        let smaller = Chunking::new(1900, today);
        let sent = smaller.restore(header, chunks).unwrap();
        assert!(sent.len() == 2 && sent.iter().all(|c| c.len() <= 1900));
        assert_eq!(read(&smaller, sent), upcast_of(&v1));
    }

    fn upcast_of(v1: &ReportV1) -> Report {
        Report {
            words: v1.text.split(' ').map(str::to_owned).collect(),
        }
    }

    #[test]
    fn what_does_not_read_or_no_longer_fits_its_seqs_is_refused_naming_the_versions() {
        let v1 = ReportV1 { text: text() };
        let (header, chunks) = stored(BodySchema::new().codec(Codec::Bincode), 1024, &v1);
        let changed = Chunking::new(1024, BodySchema::<Report>::new().codec(Codec::Bincode));
        let refused = changed.restore(header, chunks.clone()).unwrap_err();
        assert!(
            refused.contains("version 1 in bincode") && refused.contains("without a new version"),
            "{refused}"
        );
        let no_upcaster = Chunking::new(1024, BodySchema::<Report>::new().version(2));
        let refused = no_upcaster.restore(header, chunks.clone()).unwrap_err();
        assert!(
            refused.contains("no upcaster to this code's version 2"),
            "{refused}"
        );
        let rolled_back = Chunking::new(1024, BodySchema::<ReportV1>::new());
        let (newer, newer_chunks) = stored(BodySchema::new().version(3), 1024, &v1);
        let refused = rolled_back.restore(newer, newer_chunks).unwrap_err();
        assert!(
            refused.contains("newer than this code's version 1"),
            "{refused}"
        );
        // Upcast, each word twice: more bytes than the text's four chunks hold.
        fn doubling(old: Written<'_>) -> Result<Report, UpcastError> {
            let mut report = upcast(old)?;
            report.words = report
                .words
                .iter()
                .flat_map(|w| [w.clone(), w.clone()])
                .collect();
            Ok(report)
        }
        let longer = Chunking::new(1024, BodySchema::new().version(2).upcast(doubling));
        let refused = longer.restore(header, chunks).unwrap_err();
        assert!(
            refused.contains("written again at version 2") && refused.contains("do not fit its 4"),
            "{refused}"
        );
    }
}
