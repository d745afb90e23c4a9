//! A durable producer of chunked messages (`chunk_size`): each message is encoded once and
//! stored chunk by chunk, as many chunks per journal entry as fit, before any of it is sent;
//! it is stored (and `store()` resolves, with the id of its last chunk's seq) once every chunk
//! is. Opening the stream resends a message whose chunks are all stored, and drops a message
//! of which only some are (the producer ended while storing it): never sent, so never
//! half-delivered; its caller, if it is still waiting, hears "not stored", otherwise the sink
//! does.
//!
//! A message stored whole is first read as the producer's type, as whole messages are: one
//! stored at an older version of its schema goes through the upcaster and is sent written
//! again at today's, split anew over its own seqs ([`Chunking::restore`]); one that cannot be
//! read (a newer version, the type changed without a new version) or no longer fits its seqs
//! stops the producer for good, naming the stream, the message and the versions, before
//! anything is sent. It stays stored for a producer that can read it: it is never sent in a
//! form its own producer cannot read, nor given up for it.

use bytes::Bytes;

use super::*;
use crate::delivery::producer_core::Chunking;
use crate::durable::log::StoredChunks;
use crate::protocol::chunk::ChunkHeader;

/// A chunked message an opening found stored whole: its header, its chunks as stored, and
/// as they are sent now.
pub(super) struct Restored {
    header: ChunkHeader,
    stored: Vec<Bytes>,
    chunks: Vec<Bytes>,
}

/// The chunked messages stored whole in `stream`, as `chunking` sends them (see
/// [`Chunking::restore`]).
///
/// # Errors
/// Why one of them cannot be sent, naming the stream, the message and the versions.
pub(super) fn restore_chunked<T>(
    chunking: &Chunking<T>,
    stream: &PersistenceId,
    chunked: Vec<StoredChunks>,
) -> Result<Vec<Restored>, String> {
    chunked
        .into_iter()
        .map(|(header, bodies)| {
            let stored: Vec<Bytes> = bodies.into_iter().map(Bytes::from).collect();
            match chunking.restore(header, stored.clone()) {
                Ok(chunks) => Ok(Restored {
                    header,
                    stored,
                    chunks,
                }),
                Err(why) => Err(format!(
                    "stream `{stream}`: stored message {} (chunks {} to {}) cannot be sent: \
                     {why}",
                    header.last_seq(),
                    header.first_seq,
                    header.last_seq()
                )),
            }
        })
        .collect()
}

/// A chunked message on its way into the journal.
pub(super) struct ChunkedStore {
    header: ChunkHeader,
    chunks: Vec<Bytes>,
    /// Chunks stored (committed).
    stored: usize,
    /// Chunks in the store in flight.
    storing: usize,
    confirm: Confirmation,
}

/// A chunked message whose store's outcome is open: the next open finds out.
pub(super) struct ChunkDoubt {
    header: ChunkHeader,
    chunks: Vec<Bytes>,
    confirm: Confirmation,
    reason: String,
}

impl<T> Durable<T> {
    /// Whether a chunked message is being stored.
    pub(super) fn is_storing_chunks(&self) -> bool {
        self.storing_chunks.is_some()
    }

    /// The log closes: the chunked message being stored is in doubt (its last run may have
    /// committed).
    pub(super) fn carry_chunks_unanswered(&mut self) {
        if let Some(store) = self.storing_chunks.take() {
            let reason = format!(
                "stream `{}`: the producer ended while the journal stored the message",
                self.options.stream
            );
            self.chunk_doubts.push(ChunkDoubt {
                header: store.header,
                chunks: store.chunks,
                confirm: store.confirm,
                reason,
            });
        }
    }

    /// The chunked stores of unknown outcome, settled as such (no restart will find out).
    pub(super) fn abandon_chunk_doubts(&mut self) -> Vec<Settlement> {
        self.chunk_doubts
            .drain(..)
            .map(|doubt| {
                let reason = format!(
                    "{}; the message may have been stored whole: if it was, the next start of \
                     the stream sends it and reports its confirmation to its sink",
                    doubt.reason
                );
                (doubt.confirm, Err(DeliveryError::InDoubt(reason)))
            })
            .collect()
    }

    /// The first seq of the message `id` (its last seq, for a chunked one).
    pub(super) fn first_seq_of(&self, id: u64) -> u64 {
        self.spans.get(&id).copied().unwrap_or(id)
    }
}

impl<T: Clone + Send + 'static> Durable<T> {
    /// Stores the next run of chunks of the chunked message being stored (starting the next
    /// message if none is), one store in flight at a time.
    pub(super) fn start_store_chunks(&mut self, producer: &mut Producer<'_, T>) {
        let chunking = producer.core().chunking().cloned();
        let (Some(next_seq), Some(log), Some(chunking)) = (self.next_seq, &self.log, chunking)
        else {
            return; // not open yet
        };
        if self.storing_chunks.as_ref().is_some_and(|s| s.storing > 0) {
            return;
        }
        if self.storing_chunks.is_none() {
            if self.stopping.is_some() {
                return;
            }
            let Some((body, confirm)) = self.to_store.pop_front() else {
                return;
            };
            match chunking.chunks_of(&body) {
                Ok(chunks) => {
                    let header = ChunkHeader {
                        first_seq: next_seq,
                        chunks: u32::try_from(chunks.len()).unwrap_or(u32::MAX),
                        message_len: chunks.iter().map(|c| c.len() as u64).sum(),
                    };
                    self.next_seq = Some(next_seq + chunks.len() as u64);
                    self.storing_chunks = Some(ChunkedStore {
                        header,
                        chunks,
                        stored: 0,
                        storing: 0,
                        confirm,
                    });
                }
                Err(error) => return producer.settle([(confirm, Err(error))]),
            }
        }
        let store = self.storing_chunks.as_mut().expect("started above");
        // One journal entry: as many chunks as fit (at least one: a chunk fits an entry).
        let (mut bodies, mut bytes) = (Vec::new(), 0);
        for chunk in &store.chunks[store.stored..] {
            let size = chunk.len() + EVENT_OVERHEAD;
            if !bodies.is_empty() && bytes + size > MAX_STORE_BYTES {
                break;
            }
            bytes += size;
            bodies.push(chunk.clone());
        }
        store.storing = bodies.len();
        let stored = log.ask(LogCommand::StoreChunks {
            epoch: self.epoch,
            first_seq: store.header.first_seq + store.stored as u64,
            chunk: store.header,
            bodies,
        });
        producer.spawn(stored, |durable: &mut Self, reply, producer| {
            durable.chunks_stored(reply, producer);
        });
    }

    /// A run of chunks was stored (or not).
    fn chunks_stored(&mut self, reply: LogAnswer, producer: &mut Producer<'_, T>) {
        let Some(mut store) = self.storing_chunks.take() else {
            return; // the log closed meanwhile: the store is in doubt
        };
        if let Err(error) = reply {
            let reason = log_error(&self.options.stream, &error);
            if let CommandError::Journal(_) = error {
                // Perhaps committed (and then perhaps the whole message): the restart finds out.
                self.chunk_doubts.push(ChunkDoubt {
                    header: store.header,
                    chunks: store.chunks,
                    confirm: store.confirm,
                    reason,
                });
            } else {
                // Refused: the message is not stored whole (the next opening drops what is).
                let error = DeliveryError::Storage(format!("{reason}; it was not stored"));
                producer.settle([(store.confirm, Err(error))]);
            }
            return self.fail_log(&error, producer);
        }
        store.stored += std::mem::take(&mut store.storing);
        if store.stored < store.chunks.len() {
            if self.stopping.is_some() {
                // Not stored whole, never will be: the next opening drops what is.
                producer.settle([(store.confirm, Err(DeliveryError::ProducerStopped))]);
            } else {
                self.storing_chunks = Some(store);
            }
            return producer.flush();
        }
        let ChunkedStore {
            header,
            chunks,
            mut confirm,
            ..
        } = store;
        let (first, last) = (header.first_seq, header.last_seq());
        self.counts.0 += 1;
        confirm.notify_stored(MessageId(last));
        self.unsettled.insert(last);
        self.stored_at.insert(last, now());
        self.spans.insert(last, first);
        if self.stopping.is_some() {
            // Stored, not sent: the next start of the stream sends it.
            producer.settle([(confirm, Err(DeliveryError::StoppedUnconfirmed))]);
        } else if let Core::Chunked(core, _) = producer.core()
            && let Err((_, confirm)) = core.handle_stored(first, chunks, confirm)
        {
            // Unreachable: the core numbers from the same next seq. Stored, so the restart
            // sends it (its caller hears "in doubt").
            let reason = format!("stored message {first} is not the core's next seq");
            producer.settle([(confirm, Err(DeliveryError::InDoubt(reason.clone())))]);
            return self.fail(Failure::Error(reason), producer);
        }
        producer.flush();
    }

    /// The chunked messages the opening found: those stored whole are sent again (the
    /// in-doubt store of one of them that committed tells its caller after all, a settlement
    /// whose record did not commit tells its own), those partly stored were dropped by the
    /// opening (their caller, or the sink, hears "not stored"). Returns what to resend.
    pub(super) fn resume_chunks(
        &mut self,
        chunked: Vec<Restored>,
        dropped: Vec<ChunkHeader>,
        carried: &mut BTreeMap<u64, Carried>,
        producer: &mut Producer<'_, T>,
    ) -> Vec<(u64, Vec<Bytes>, Confirmation)> {
        let mut doubts: BTreeMap<u64, ChunkDoubt> = self
            .chunk_doubts
            .drain(..)
            .map(|d| (d.header.first_seq, d))
            .collect();
        let mut resumed = Vec::with_capacity(chunked.len());
        for Restored {
            header,
            stored,
            chunks,
        } in chunked
        {
            let (first, last) = (header.first_seq, header.last_seq());
            self.unsettled.insert(last);
            self.spans.insert(last, first);
            let committed = doubts
                .remove(&first)
                .filter(|doubt| doubt.header == header && doubt.chunks == stored);
            let confirm = if let Some(mut doubt) = committed {
                doubt.confirm.notify_stored(MessageId(last));
                self.counts.0 += 1; // stored after all
                self.stored_at.entry(last).or_insert_with(now);
                doubt.confirm
            } else if let Some(carried) = carried.remove(&last) {
                carried.settlement.0
            } else {
                let mut confirm = match &self.options.sink {
                    Some(sink) => sink_confirmation(sink.clone(), MessageId(last)),
                    None => Confirmation::none(),
                };
                confirm.notify_stored(MessageId(last));
                self.resumed.insert(last);
                confirm
            };
            resumed.push((first, chunks, confirm));
        }
        let stream = &self.options.stream;
        for header in dropped {
            let (first, last) = (header.first_seq, header.last_seq());
            let reason = format!(
                "stream `{stream}`: the producer ended while storing message {last} (chunks \
                 {first} to {last}): only some were stored, so it was dropped, never sent"
            );
            self.counts.3 += 1;
            log::warn!("durable producer `{}`: {reason}", producer.id());
            let error = DeliveryError::Storage(reason);
            match doubts.remove(&first) {
                Some(doubt) => producer.settle([(doubt.confirm, Err(error))]),
                None => {
                    if let Some(sink) = &self.options.sink {
                        let id = MessageId(last);
                        sink.do_send(DurableConfirmation {
                            id,
                            result: Err(error),
                        });
                    }
                }
            }
        }
        // Not among the stored messages: not stored whole.
        for doubt in doubts.into_values() {
            let error = DeliveryError::Storage(format!("{}; it was not stored", doubt.reason));
            producer.settle([(doubt.confirm, Err(error))]);
        }
        resumed
    }
}
