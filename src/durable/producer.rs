//! The durable side of a producer: its log (a persistent actor), the messages on their way into
//! it, and the settlements on their way into it.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::CodecError;
use crate::config::ProducerConfig;
use crate::confirmation::Confirmation;
use crate::durable::log::{LogCommand, LogReply, ProducerLog};
use crate::durable::{DurableConfirmation, DurableOptions, MessageId};
use crate::error::DeliveryError;
use crate::persistence::{CommandError, PersistentConfig, PersistentHandle};
use crate::producer::ProducerController;
use crate::protocol::envelope::Incarnation;
use crate::protocol::producer::ProducerCore;

type Settlement = (Confirmation, Result<(), DeliveryError>);

/// A durable producer's storage state, owned by its controller.
pub(crate) struct Durable<T> {
    config: ProducerConfig,
    options: DurableOptions,
    encode: fn(&T) -> Result<Vec<u8>, CodecError>,
    decode: fn(&[u8]) -> Result<T, CodecError>,
    log: Option<PersistentHandle<ProducerLog>>,
    /// The seq the next stored message gets, once the log is open.
    next_seq: Option<u64>,
    /// Handed over, not stored yet.
    to_store: VecDeque<(T, Confirmation)>,
    storing: bool,
    /// Stored and not durably settled.
    unsettled: BTreeSet<u64>,
    /// Settled, waiting for the record (their confirmations fire after it).
    to_record: Vec<(u64, Settlement)>,
    recording: bool,
    /// Resumed after a restart and not settled yet (their confirmations go to the sink).
    resumed: BTreeSet<u64>,
    /// Messages stored; resumed after a restart; confirmations of resumed ones.
    pub(crate) counts: (u64, u64, u64),
}

impl<T: Serialize + DeserializeOwned> Durable<T> {
    pub(crate) fn new(config: ProducerConfig, options: DurableOptions) -> Self {
        Self {
            config,
            options,
            encode: crate::codec::encode::<T>,
            decode: crate::codec::decode::<T>,
            log: None,
            next_seq: None,
            to_store: VecDeque::new(),
            storing: false,
            unsettled: BTreeSet::new(),
            to_record: Vec::new(),
            recording: false,
            resumed: BTreeSet::new(),
            counts: (0, 0, 0),
        }
    }
}

impl<T> Durable<T> {
    /// Takes messages handed to the producer: they are stored before anything else.
    pub(crate) fn accept(&mut self, messages: &mut VecDeque<(T, Confirmation)>) {
        self.to_store.append(messages);
    }

    /// The id the next stored message gets (0 until the stream is open): the next seq, less
    /// what waits to be stored.
    pub(crate) fn next_message_id(&self) -> u64 {
        self.next_seq.unwrap_or(0)
    }

    /// Whether nothing waits to be stored or recorded.
    pub(crate) fn is_idle(&self) -> bool {
        self.to_store.is_empty() && !self.storing && self.to_record.is_empty() && !self.recording
    }

    /// Keeps back the settlements that must be recorded first (of stored messages, confirmed
    /// or given up); the others stay in `settling` to fire at once (a stored message settled
    /// as stopped stays stored: the next start sends it again).
    pub(crate) fn hold_back(&mut self, settling: &mut Vec<Settlement>) {
        let mut index = 0;
        while index < settling.len() {
            let recorded = settling[index]
                .0
                .message()
                .filter(|_| !matches!(settling[index].1, Err(DeliveryError::ProducerStopped)));
            match recorded {
                Some(MessageId(seq)) => self.to_record.push((seq, settling.swap_remove(index))),
                None => index += 1,
            }
        }
    }

    /// Everything not yet stored, and every settlement not yet recorded, as settlements of
    /// `error` (the producer stops). Recorded-to-be settlements keep their own result: the
    /// consumer did confirm those.
    pub(crate) fn drain(&mut self, error: &DeliveryError) -> Vec<Settlement> {
        let unstored = self
            .to_store
            .drain(..)
            .map(|(_, c)| (c, Err(error.clone())));
        let unrecorded = self.to_record.drain(..).map(|(_, settlement)| settlement);
        unstored.chain(unrecorded).collect()
    }
}

impl<T: Clone + Send + 'static> ProducerController<T> {
    /// Starts the log and opens the stream; the producer sends nothing before it is open.
    pub(crate) fn open_log(&mut self, ctx: &mut Context<Self>) {
        let Some(durable) = &mut self.durable else {
            return;
        };
        let config = PersistentConfig {
            snapshot_every: Some(durable.options.snapshot_every),
            delete_events_on_snapshot: true,
            ..PersistentConfig::default()
        };
        let journal = Arc::clone(&durable.options.journal);
        let stream = durable.options.stream.clone();
        let log = match PersistentHandle::start(journal, stream, config) {
            Ok(log) => log,
            Err(error) => return self.fail_durable(error.to_string(), ctx),
        };
        let producer_id = self.core.id().to_string();
        let opened = log.ask(LogCommand::Open {
            producer_id,
            incarnation: Incarnation::random(),
        });
        durable.log = Some(log);
        ctx.spawn(opened.into_actor(self).map(|reply, act, ctx| match reply {
            Ok(LogReply::Opened {
                incarnation,
                next_seq,
                unsettled,
            }) => act.resume(incarnation, next_seq, unsettled, ctx),
            Ok(LogReply::Done) => unreachable!("Open replies Opened"),
            Err(error) => act.fail_durable(log_error(&error), ctx),
        }));
    }

    /// The stream is open: the core continues the stored life and resends what is unsettled.
    fn resume(
        &mut self,
        incarnation: Incarnation,
        next_seq: u64,
        unsettled: Vec<(u64, Vec<u8>)>,
        ctx: &mut Context<Self>,
    ) {
        let Some(durable) = &mut self.durable else {
            return;
        };
        let mut resumed = Vec::with_capacity(unsettled.len());
        for (seq, bytes) in unsettled {
            let body = match (durable.decode)(&bytes) {
                Ok(body) => body,
                Err(error) => {
                    let reason = format!("stored message {seq} does not decode: {error}");
                    return self.fail_durable(reason, ctx);
                }
            };
            let mut confirm = match &durable.options.sink {
                Some(sink) => sink_confirmation(sink.clone(), MessageId(seq)),
                None => Confirmation::none(),
            };
            confirm.notify_stored(MessageId(seq));
            durable.unsettled.insert(seq);
            durable.resumed.insert(seq);
            resumed.push((seq, body, confirm));
        }
        durable.counts.1 += resumed.len() as u64;
        if !resumed.is_empty() {
            log::info!(
                "durable producer `{}`: sending {} stored message(s) again",
                self.core.id(),
                resumed.len()
            );
        }
        durable.next_seq = Some(next_seq);
        self.core = ProducerCore::resume(&durable.config, incarnation, next_seq, resumed);
        self.dirty = true;
        self.flush(ctx);
    }

    /// Stores what was handed over and records what was settled, one write of each in
    /// flight at a time.
    pub(crate) fn flush_durable(&mut self, ctx: &mut Context<Self>) {
        self.start_store(ctx);
        self.start_record(ctx);
    }

    fn start_store(&mut self, ctx: &mut Context<Self>) {
        let Some(durable) = &mut self.durable else {
            return;
        };
        let (Some(first_seq), Some(log)) = (durable.next_seq, &durable.log) else {
            return; // not open yet
        };
        if durable.storing || durable.to_store.is_empty() {
            return;
        }
        let mut batch = Vec::with_capacity(durable.to_store.len());
        let mut bodies = Vec::with_capacity(durable.to_store.len());
        let mut unencodable = Vec::new();
        for (body, confirm) in durable.to_store.drain(..) {
            match (durable.encode)(&body) {
                Ok(bytes) => {
                    bodies.push(bytes);
                    batch.push((body, confirm));
                }
                Err(error) => {
                    unencodable.push((confirm, Err(DeliveryError::Storage(error.to_string()))));
                }
            }
        }
        let stored = (!batch.is_empty()).then(|| {
            durable.storing = true;
            durable.next_seq = Some(first_seq + batch.len() as u64);
            log.ask(LogCommand::Store { first_seq, bodies })
        });
        self.settling.extend(unencodable);
        self.fire_settling();
        let Some(stored) = stored else {
            return;
        };
        ctx.spawn(stored.into_actor(self).map(move |reply, act, ctx| {
            let Some(durable) = &mut act.durable else {
                return;
            };
            durable.storing = false;
            if let Err(error) = reply {
                // Not stored: these messages were never sent.
                let reason = log_error(&error);
                let failed = batch
                    .into_iter()
                    .map(|(_, c)| (c, Err(DeliveryError::Storage(reason.clone()))));
                act.settling.extend(failed);
                return act.fail_durable(reason, ctx);
            }
            durable.counts.0 += batch.len() as u64;
            let mut stored = VecDeque::with_capacity(batch.len());
            for (seq, (body, mut confirm)) in (first_seq..).zip(batch) {
                confirm.notify_stored(MessageId(seq));
                durable.unsettled.insert(seq);
                stored.push_back((body, confirm));
            }
            // The core numbers them in the same order from the same next seq.
            act.core.handle_send_all(&mut stored);
            act.dirty = true;
            act.flush(ctx);
        }));
    }

    fn start_record(&mut self, ctx: &mut Context<Self>) {
        let Some(durable) = &mut self.durable else {
            return;
        };
        let Some(log) = &durable.log else {
            return;
        };
        if durable.recording || durable.to_record.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut durable.to_record);
        let seqs = batch.iter().map(|(seq, _)| *seq).collect();
        durable.recording = true;
        let recorded = log.ask(LogCommand::Settle { seqs });
        ctx.spawn(recorded.into_actor(self).map(move |reply, act, ctx| {
            let Some(durable) = &mut act.durable else {
                return;
            };
            durable.recording = false;
            for (seq, (_, result)) in &batch {
                durable.unsettled.remove(seq);
                if durable.resumed.remove(seq) && result.is_ok() {
                    durable.counts.2 += 1;
                }
            }
            let failed = reply.err().map(|error| log_error(&error));
            if failed.is_none() {
                let below = durable.unsettled.first().copied().or(durable.next_seq);
                if let Some(below) = below {
                    act.core.set_durably_settled_below(below);
                }
            }
            // Confirmed by the consumer either way; recorded unless the journal failed.
            act.settling
                .extend(batch.into_iter().map(|(_, settlement)| settlement));
            act.fire_settling();
            match failed {
                Some(reason) => act.fail_durable(reason, ctx),
                None => {
                    act.dirty = true;
                    act.flush(ctx);
                }
            }
        }));
    }

    /// The journal failed: settle what was not stored with the error, and stop (a
    /// `Supervisor` restarts the producer on what the journal holds).
    fn fail_durable(&mut self, reason: String, ctx: &mut Context<Self>) {
        log::error!(
            "durable producer `{}` stops: its journal failed: {reason}",
            self.core.id()
        );
        if let Some(durable) = &mut self.durable {
            let drained = durable.drain(&DeliveryError::Storage(reason));
            self.settling.extend(drained);
        }
        self.fire_settling();
        ctx.stop();
    }

    /// Stops the log (restart or stop of the producer) and forgets what is in memory.
    pub(crate) fn close_log(&mut self) {
        if let Some(durable) = &mut self.durable {
            let drained = durable.drain(&DeliveryError::ProducerStopped);
            if let Some(log) = durable.log.take() {
                log.stop();
            }
            durable.next_seq = None;
            durable.storing = false;
            durable.recording = false;
            durable.unsettled.clear();
            durable.resumed.clear();
            self.settling.extend(drained);
        }
    }
}

/// A confirmation that tells the sink (for a message resumed after a restart).
fn sink_confirmation(sink: Recipient<DurableConfirmation>, id: MessageId) -> Confirmation {
    Confirmation::callback(move |result| sink.do_send(DurableConfirmation { id, result }))
}

fn log_error(error: &CommandError<String>) -> String {
    match error {
        CommandError::Rejected(reason) => reason.clone(),
        other => other.to_string(),
    }
}
