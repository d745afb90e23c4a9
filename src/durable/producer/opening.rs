//! Opening a durable producer's stream: watching it for a lease's owner first, renewing the
//! lease, and resuming what the stream holds (stored messages resent under their ids,
//! settlements carried over, chunked messages restored or dropped).

use super::*;

impl<T: Clone + Send + 'static> Durable<T> {
    pub(super) fn open_now(&mut self, producer: &mut Producer<'_, T>) {
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
        self.opened_at.get_or_insert_with(now);
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
                self.stored_at.entry(seq).or_insert_with(now);
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
}
