//! Adversarial review of the persistence stack. Each `review_d*` test demonstrated one defect
//! on the code it was written against (it failed there) and now pins its fix; each doc
//! comment says what was wrong and what changed. The `review_s*` tests check suspicions that
//! turned out sound, and stay as regression tests.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{
    Journal, JournalError, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};
use actix_delivery::persistence::{
    recover_state, CommandError, Decision, EventSourced, Outbox, PersistentConfig, PersistentHandle,
};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryError, DeliveryHandler,
    ProducerConfig, ProducerHandle, ProducerOptions, ReliableDelivery,
};
use common::{settle, settle_for, Log};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// A consumer of `T` recording each body its handler runs for.
fn recording_consumer<T>() -> (ConsumerHandle<T>, Log<T>)
where
    T: Clone + Send + 'static,
{
    let handled = Log::default();
    let log = handled.clone();
    let handler = DeliveryHandler::from_fn(move |body: T| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler).build().unwrap();
    (ReliableDelivery::consumer(options), handled)
}

/// A link to `target` that can be cut (deliveries lost); records (seq, body) of what passes.
fn cuttable<T: Clone + Send + 'static>(
    target: ConsumerRef<T>,
) -> (ConsumerRef<T>, Arc<AtomicBool>, Log<(u64, T)>) {
    let cut = Arc::new(AtomicBool::new(false));
    let seen = Log::default();
    let (is_cut, log) = (cut.clone(), seen.clone());
    let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<T>>| {
        for d in &deliveries {
            log.push((d.seq, d.body.clone()));
        }
        if !is_cut.load(Ordering::SeqCst) {
            target.do_send_all(deliveries.into_iter());
        }
    });
    (link, cut, seen)
}

fn out_stream() -> PersistenceId {
    PersistenceId::new("review-out").unwrap()
}

// ---------------------------------------------------------------------------------------------
// Durable producer
// ---------------------------------------------------------------------------------------------

fn durable_u32(
    journal: &MemoryJournal,
    to: ConsumerRef<u32>,
    window_size: usize,
    max_pending: usize,
) -> ProducerHandle<u32> {
    let options = ProducerOptions::builder(to)
        .producer_id("review-producer")
        .window_size(window_size)
        .max_pending(max_pending)
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream());
    ReliableDelivery::durable_producer(options, durable).unwrap()
}

/// D1 (fixed: resumed messages hold room, and stored messages are handed to the core under
/// their stored seq, never refused). A restarted durable producer held its resumed messages in
/// its core, but they took no room of its inbox: the inbox admits `window_size + max_pending` new messages, the store
/// commits them, and then `ProducerCore::handle_send_all` refuses those beyond the core's room
/// with `QueueFull`. The refusal is treated like a confirmation: it is *recorded as settled*
/// in the journal, so a message whose `store()` resolved `Ok` is never sent, not even after
/// another restart. And the core, which numbered none of the refused ones, gives the next
/// messages wire seqs that are not their stored seqs (`MessageId`s): after one more restart
/// they are resent under their stored seq, i.e. as *new* messages to the consumer.
#[actix::test]
async fn review_d1_messages_stored_after_a_restart_are_sent_under_their_stored_seqs() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = recording_consumer::<u32>();
    let (to, cut, seen) = cuttable(consumer.consumer_ref());
    // Room: window 1 + max_pending 1 = 2 messages.
    let first = durable_u32(&journal, to.clone(), 1, 1);
    cut.store(true, Ordering::SeqCst); // the consumer is unreachable
    for body in [1, 2] {
        first.store(body).await.unwrap();
    }
    first.stop();
    first.stopped().await;

    // The producer's process restarts while the consumer is still unreachable.
    let second = durable_u32(&journal, to, 1, 1);
    settle().await; // open: 1 and 2 resumed
    let storing: Vec<_> = [3, 4]
        .into_iter()
        .map(|body| actix::spawn(second.store(body)))
        .collect();
    settle_for(1_000).await;
    assert!(
        storing.iter().all(|s| !s.is_finished()),
        "the resumed messages hold the room: new ones wait for it (backpressure)"
    );
    cut.store(false, Ordering::SeqCst);
    let mut stored = Vec::new();
    for message in storing {
        stored.push(message.await.unwrap().expect("stored"));
    }
    assert_eq!(
        stored.iter().map(|m| m.id.0).collect::<Vec<_>>(),
        [3, 4],
        "the producer owns 3 and 4 from now on (store() resolved Ok)"
    );
    let outcomes: Vec<Result<(), DeliveryError>> = {
        let mut outcomes = Vec::new();
        for message in stored {
            outcomes.push(message.confirmed().await);
        }
        outcomes
    };
    settle_for(2_000).await;
    // A message the producer owned must reach the consumer.
    assert_eq!(
        handled.snapshot(),
        [1, 2, 3, 4],
        "stored messages lost; their confirmations: {outcomes:?}; on the wire (seq, body): {:?}",
        seen.snapshot()
    );
    // And the wire seq of a message is its stored seq.
    second.store(5).await.unwrap();
    settle_for(1_000).await;
    let wire_seq_of_5 = seen
        .snapshot()
        .iter()
        .find(|(_, b)| *b == 5)
        .map(|(s, _)| *s);
    assert_eq!(
        wire_seq_of_5,
        Some(5),
        "message 5 is sent under another seq"
    );
}

/// D2 (fixed: a store takes as many waiting messages as fit in one entry; a message too
/// large for any entry is refused alone, clearly). A durable producer stored everything that
/// waits in one `LogCommand::Store`, which is
/// *one* journal entry (an `Entry` holds all events of one command), and an entry is limited
/// to the codec's 16 MiB. A burst of messages that together exceed 16 MiB (17 messages of
/// 1 MiB here; with the default room of 100 016 messages, ~85 000 messages of 200 bytes) fails
/// to encode: every message of the burst is refused with a storage error and the producer
/// stops (and restarts), though each message is far below every limit.
#[actix::test]
async fn review_d2_a_burst_over_16_mib_is_stored_in_several_appends() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    let options = ProducerOptions::builder(consumer.consumer_ref())
        .producer_id("review-bulk")
        .window_size(16)
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream());
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    settle().await; // open
    let failures = Log::default();
    for n in 0..17u8 {
        let failures = failures.clone();
        producer
            .tell(
                vec![n; 1 << 20],
                move |result: Result<(), DeliveryError>| {
                    if let Err(error) = result {
                        failures.push(error.to_string());
                    }
                },
            )
            .unwrap();
    }
    let idle = tokio::time::timeout(Duration::from_secs(60), producer.idle()).await;
    assert!(idle.is_ok(), "not idle");
    let failures = failures.snapshot();
    assert!(
        failures.is_empty(),
        "{} of 17 one-MiB messages refused, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(handled.len(), 17);
}

/// D3 (fixed: the newest opener owns the stream). A second durable producer opened on a
/// stream that a live producer writes was not refused, and if it stored first it was the
/// *established* producer that failed, then (supervised) restarted and fought back. A process
/// cannot tell a live predecessor from a dead one (refusing the newcomer would block every
/// failover), so opening takes the stream over: the journal's fence refuses the previous
/// owner at its next write, clearly, and it stops for good instead of fighting back.
#[actix::test]
async fn review_d3_a_second_durable_producer_takes_the_stream_over_and_the_first_stops() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = recording_consumer::<u32>();
    let first = durable_u32(&journal, consumer.consumer_ref(), 4, 100);
    first.send(1).await.unwrap();
    let second = durable_u32(&journal, consumer.consumer_ref(), 4, 100);
    settle().await; // the second one opened the stream the first one writes
    let by_first = first.send(2).await;
    match &by_first {
        Err(DeliveryError::Storage(reason)) => {
            assert!(
                reason.contains("the newest opener owns the stream"),
                "{reason}"
            )
        }
        other => panic!("the superseded producer stored: {other:?}"),
    }
    tokio::time::timeout(Duration::from_secs(10), first.stopped())
        .await
        .expect("the superseded producer stops for good");
    assert_eq!(second.send(3).await, Ok(()));
    settle_for(1_000).await;
    assert!(first.send(4).await.is_err(), "it does not fight back");
    assert_eq!(second.send(5).await, Ok(()));
    assert_eq!(handled.snapshot(), [1, 3, 5]);
}

/// A journal that commits the next armed append and then reports it failed (as a commit whose
/// fsync failed, or a connection lost after COMMIT, does): [`JournalError::Storage`] documents
/// that "the operation may or may not have taken effect".
#[derive(Clone)]
struct CommitThenFail {
    inner: MemoryJournal,
    armed: Arc<AtomicBool>,
}

impl CommitThenFail {
    fn new(inner: MemoryJournal) -> Self {
        Self {
            inner,
            armed: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Journal for CommitThenFail {
    fn append(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
    ) -> JournalFuture<'_, ()> {
        let id = id.clone();
        Box::pin(async move {
            self.inner.append(&id, first_seq, payloads).await?;
            if self.armed.swap(false, Ordering::SeqCst) {
                return Err(JournalError::Storage {
                    persistence_id: Some(id),
                    message: "fsync failed (the commit is on disk anyway)".into(),
                });
            }
            Ok(())
        })
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.inner.replay(id, from_seq, to_seq, max_events)
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        self.inner.highest_seq(id)
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        self.inner.delete_to(id, to_seq)
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        self.inner.save_snapshot(id, snapshot)
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        self.inner.load_snapshot(id)
    }
}

/// D4 (fixed: a store of unknown outcome is settled by the restart, which reads the journal).
/// A store whose commit reached the disk but was reported failed was settled
/// `DeliveryError::Storage`, documented as "a message that was not stored is not sent"; the
/// supervised producer then restarted in the same process, found the message in its journal
/// and sent it anyway, and the caller, told it was not stored, sent it again under a new id:
/// the consumer ran it twice. Now the confirmation waits for the restart: the message was
/// committed, so its caller hears "stored" and then "confirmed", and sends nothing twice.
#[actix::test]
async fn review_d4_a_store_reported_failed_but_committed_is_confirmed_after_the_restart() {
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let journal = CommitThenFail::new(memory.clone());
    let (consumer, handled) = recording_consumer::<u32>();
    let options = ProducerOptions::builder(consumer.consumer_ref())
        .producer_id("review-ctf")
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream());
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    producer.send(1).await.unwrap();
    journal.armed.store(true, Ordering::SeqCst);
    let outcome = producer.send(2).await;
    if outcome.is_err() {
        producer.send(2).await.unwrap(); // what an application told "not stored" does
    }
    assert_eq!(outcome, Ok(()), "the restart found it committed");
    settle_for(2_000).await;
    assert_eq!(handled.snapshot(), [1, 2]);
    let stats = producer.stats().await.unwrap();
    assert_eq!(
        (stats.resumed, stats.resumed_confirmed),
        (0, 0),
        "its own caller heard of it, not the sink"
    );
}

/// D5 (fixed: the log checks that its events follow each other, and a corrupt stream stops the
/// producer for good with an error naming it). Corrupt (reordered, each entry valid) journal data of a durable producer's stream: the
/// recovered log hands `ProducerCore::resume` a message at or above its next seq, and its
/// `assert!` panics inside the producer actor instead of the producer failing with an error
/// naming the stream and seq (SPEC §6.1: a corrupt stored event stops recovery with an error
/// that names the stream and seq).
#[actix::test]
async fn review_d5_a_corrupt_stream_stops_the_producer_with_an_error_naming_it() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, _) = recording_consumer::<u32>();
    let (to, cut, _) = cuttable(consumer.consumer_ref());
    cut.store(true, Ordering::SeqCst);
    let first = durable_u32(&journal, to.clone(), 4, 100);
    first.store(1).await.unwrap();
    first.store(2).await.unwrap();
    first.stop();
    first.stopped().await;
    let events = journal
        .replay(&out_stream(), 1, u64::MAX, 100)
        .await
        .unwrap();
    assert_eq!(events.len(), 3, "created, stored 1, stored 2");
    // The same entries, each valid, the two stores swapped, in a fresh journal.
    let copy = MemoryJournal::new();
    let payloads = vec![
        events[0].payload.clone(),
        events[2].payload.clone(),
        events[1].payload.clone(),
    ];
    copy.append(&out_stream(), 1, payloads).await.unwrap();
    let second = durable_u32(&copy, to, 4, 100);
    let failure = Log::default();
    second.tell(3, record_failure(&failure)).unwrap(); // waits for the stream to open
    settle_for(1_000).await;
    let failure = failure.snapshot();
    assert!(
        failure.len() == 1
            && failure[0].contains("stream `review-out`")
            && failure[0].contains("corrupt: stored message 2 follows message 0"),
        "{failure:?}"
    );
    // A panic in the actor's task kills it (tokio swallows the panic): its mailbox is gone.
    // Expected instead: the producer refuses with an error naming the stream and seq, and
    // stays an actor that answers.
    let alive = second.stats().await;
    assert!(
        alive.is_ok(),
        "the producer actor panicked on corrupt journal data (see the panic above): {alive:?}"
    );
    let refused = second.send(3).await;
    assert!(refused.is_err(), "{refused:?}");
}

/// A confirmation callback recording the error message it gets.
fn record_failure(log: &Log<String>) -> impl FnOnce(Result<(), DeliveryError>) + Send + 'static {
    let log = log.clone();
    move |result| {
        if let Err(error) = result {
            log.push(error.to_string());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Outbox
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
struct Orders {
    placed: Vec<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Placed(u64);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Ship(u64);

impl EventSourced for Orders {
    type Command = u64;
    type Event = Placed;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &order: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Placed(order)], ()).deliver("shipping", &Ship(order)))
    }

    fn apply(&mut self, Placed(order): &Placed) {
        self.placed.push(*order);
    }
}

fn orders_id() -> PersistenceId {
    PersistenceId::new("review-orders").unwrap()
}

/// D6 (fixed: a lane takes each committed delivery under its recorded seq, never refused). An
/// outbox lane handed each committed delivery to its `ProducerCore` with `handle_send`
/// and ignores the result (outbox.rs `let _ = core.handle_send(message, seq)`). When the lane's
/// `window_size + max_pending` is below `max_unconfirmed`, the core refuses with `QueueFull`;
/// the refusal comes out of `poll_settled` like a confirmation and is *recorded as confirmed*
/// (only `ProducerStopped` is filtered). The delivery exists with its events but is never
/// sent, and the lane's own numbering now lags the recorded seqs, so later deliveries go out
/// under other seqs than the journal records (a recovery resends them under the recorded
/// seq: a duplicate the receiver cannot recognise, or a "duplicate" that hides another one).
#[actix::test]
async fn review_d6_outbox_deliveries_beyond_the_lane_room_keep_their_recorded_seqs() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, shipped) = recording_consumer::<Ship>();
    let (to, cut, seen) = cuttable(consumer.consumer_ref());
    let lane = ProducerConfig {
        window_size: 1,
        max_pending: 1,
        resend_timeout: Duration::from_millis(100),
        ..ProducerConfig::default()
    };
    let outbox = Outbox::new().destination("shipping", to, lane).unwrap();
    let orders = PersistentHandle::<Orders>::start_with_outbox(
        Arc::new(journal.clone()),
        orders_id(),
        PersistentConfig::default(), // max_unconfirmed 10 000
        outbox,
    )
    .unwrap();
    cut.store(true, Ordering::SeqCst);
    for order in 1..=4 {
        orders.ask(order).await.unwrap();
    }
    settle_for(500).await;
    cut.store(false, Ordering::SeqCst);
    settle_for(5_000).await;
    orders.ask(5).await.unwrap();
    settle_for(5_000).await;
    let mut got: Vec<u64> = shipped.snapshot().iter().map(|Ship(o)| *o).collect();
    got.sort_unstable();
    assert_eq!(
        got,
        [1, 2, 3, 4, 5],
        "deliveries lost; on the wire (seq, body): {:?}",
        seen.snapshot()
    );
    let seq_of_5 = seen
        .snapshot()
        .iter()
        .find(|(_, Ship(o))| *o == 5)
        .map(|(s, _)| *s);
    assert_eq!(seq_of_5, Some(5), "delivery 5 is recorded as seq 5");
}

// ---------------------------------------------------------------------------------------------
// PersistentActor
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Ledger {
    applied: BTreeMap<u64, u32>,
    total: i64,
}

#[derive(Debug)]
enum Op {
    Apply(u64),
    Total,
}

#[derive(Debug, Serialize, Deserialize)]
struct Applied(u64);

impl EventSourced for Ledger {
    type Command = Op;
    type Event = Applied;
    type Reply = i64;
    type Rejection = String;

    fn decide(&self, command: &Op) -> Result<Decision<Self>, String> {
        match *command {
            Op::Apply(id) => Ok(Decision::persist([Applied(id)], self.total + 1)),
            Op::Total => Ok(Decision::reply(self.total)),
        }
    }

    fn apply(&mut self, Applied(id): &Applied) {
        *self.applied.entry(*id).or_default() += 1;
        self.total += 1;
    }
}

fn ledger_id() -> PersistenceId {
    PersistenceId::new("review-ledger").unwrap()
}

/// A journal whose `load_snapshot` waits at a gate once armed: holds a recovery between
/// reading the snapshot and reading the events after it.
#[derive(Clone)]
struct GatedSnapshots {
    inner: MemoryJournal,
    gate: Arc<Mutex<Option<Arc<tokio::sync::Notify>>>>,
    waiting: Arc<AtomicU64>,
}

impl Journal for GatedSnapshots {
    fn append(
        &self,
        id: &PersistenceId,
        first_seq: u64,
        payloads: Vec<Vec<u8>>,
    ) -> JournalFuture<'_, ()> {
        self.inner.append(id, first_seq, payloads)
    }

    fn replay(
        &self,
        id: &PersistenceId,
        from_seq: u64,
        to_seq: u64,
        max_events: usize,
    ) -> JournalFuture<'_, Vec<StoredEvent>> {
        self.inner.replay(id, from_seq, to_seq, max_events)
    }

    fn highest_seq(&self, id: &PersistenceId) -> JournalFuture<'_, u64> {
        self.inner.highest_seq(id)
    }

    fn delete_to(&self, id: &PersistenceId, to_seq: u64) -> JournalFuture<'_, ()> {
        self.inner.delete_to(id, to_seq)
    }

    fn save_snapshot(&self, id: &PersistenceId, snapshot: Snapshot) -> JournalFuture<'_, ()> {
        self.inner.save_snapshot(id, snapshot)
    }

    fn load_snapshot(&self, id: &PersistenceId) -> JournalFuture<'_, Option<Snapshot>> {
        let id = id.clone();
        Box::pin(async move {
            let snapshot = self.inner.load_snapshot(&id).await?;
            let gate = self.gate.lock().unwrap().take();
            if let Some(gate) = gate {
                self.waiting.fetch_add(1, Ordering::SeqCst);
                gate.notified().await;
            }
            Ok(snapshot)
        })
    }
}

/// D7. Recovery reads the snapshot, then the highest seq, then the events after the snapshot.
/// If the stream's other writer (the old instance of an overlapping failover) saves a newer
/// snapshot and deletes the events it covers in between, the events after the old snapshot are
/// gone. That used to be reported as `JournalError::Corrupt` ("missing") and stopped the actor
/// **for good** (`make_final`, even under a Supervisor), though the journal is perfectly
/// consistent; the same happened to a single instance whose catch-up after a conflict raced its
/// own spawned `save_snapshot` + `delete_to`. Now (as Akka does) recovery reads the snapshot
/// again and, finding a newer one, recovers from it.
#[actix::test]
async fn review_d7_recovery_racing_snapshot_and_delete_stops_for_good() {
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let config = PersistentConfig {
        snapshot_every: Some(1),
        delete_events_on_snapshot: true,
        ..PersistentConfig::default()
    };
    let old =
        PersistentHandle::<Ledger>::start(Arc::new(memory.clone()), ledger_id(), config.clone())
            .unwrap();
    for n in 1..=3 {
        old.ask(Op::Apply(n)).await.unwrap();
    }
    settle().await; // snapshot at 3 saved, 1..=3 deleted
    let gate = Arc::new(tokio::sync::Notify::new());
    let gated = GatedSnapshots {
        inner: memory.clone(),
        gate: Arc::new(Mutex::new(Some(gate.clone()))),
        waiting: Arc::new(AtomicU64::new(0)),
    };
    // The failover's new instance starts while the old one still runs.
    let new =
        PersistentHandle::<Ledger>::start_supervised(Arc::new(gated.clone()), ledger_id(), config)
            .unwrap();
    settle().await;
    assert_eq!(
        gated.waiting.load(Ordering::SeqCst),
        1,
        "read the snapshot at 3"
    );
    for n in 4..=5 {
        old.ask(Op::Apply(n)).await.unwrap();
    }
    settle().await; // snapshot at 5 saved, 4..=5 deleted
    let waiting = actix::spawn(new.ask(Op::Total)); // waits for the recovery
    settle().await;
    gate.notify_one();
    let total = waiting.await.unwrap();
    settle_for(100).await;
    let later = new.ask(Op::Total).await;
    assert!(
        matches!(total, Ok(5)) && matches!(later, Ok(5)),
        "the new instance could not recover a consistent journal: {total:?}; \
         supervised, it then answers: {later:?}"
    );
}

/// D8. While one append is in flight, every command that arrives is decided and held in the
/// pending batch. Nothing used to bound it (`max_recovery_buffer` bounds only recovery): a
/// journal that stalls let the actor accumulate any number of decided commands, replies and
/// encoded entries in memory, then write them as one append of unbounded size. Now at most
/// `max_pending_commands` (default 10 000) wait for their commit; the rest are refused
/// `Overloaded` and counted.
#[actix::test]
async fn review_d8_pending_batch_is_unbounded_under_a_slow_journal() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let config = PersistentConfig {
        max_recovery_buffer: 100,
        ..PersistentConfig::default()
    };
    let ledger =
        PersistentHandle::<Ledger>::start(Arc::new(journal.clone()), ledger_id(), config).unwrap();
    ledger.ask(Op::Total).await.unwrap();
    journal.faults().hold_commits();
    let first = actix::spawn(ledger.ask(Op::Apply(0)));
    settle().await;
    assert_eq!(journal.faults().held(), 1);
    let asks: Vec<_> = (1..=20_000)
        .map(|n| actix::spawn(ledger.ask(Op::Apply(n))))
        .collect();
    settle_for(1_000).await;
    let refused_now = asks.iter().filter(|a| a.is_finished()).count();
    journal.faults().release();
    first.await.unwrap().unwrap();
    let mut overloaded = 0u64;
    for ask in asks {
        if let Err(CommandError::Overloaded { .. }) = ask.await.unwrap() {
            overloaded += 1;
        }
    }
    let state = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    assert_eq!(
        ledger.stats().await.unwrap().overloaded,
        overloaded,
        "every refusal counted"
    );
    assert!(
        overloaded > 0 || refused_now > 0,
        "all {} commands were held in memory behind one stalled append (no bound); {} stored",
        20_000,
        state.total
    );
}

// ---------------------------------------------------------------------------------------------
// SQLite journal
// ---------------------------------------------------------------------------------------------

/// D9. The SQLite journal's fence trusts the writer's in-memory map of buffered streams (the
/// writer consults `event_buffer` only for streams in it), and the one-writer rule rests on a
/// lock file named `<path>-lock`. The same database reached through another name (a symlink
/// or hard link to the file) used to get another lock file, so two journals opened it as
/// writers; each fenced against its own map only, and both acknowledged an append at seq 1:
/// two different events committed under one seq (the documented "a loser gets `Conflict`"
/// failed). Now the lock file is named after the canonical path and a file with several hard
/// links is refused (see `sqlite_a_file_is_one_journal_whatever_its_name` in
/// tests/journal.rs), so the second open fails.
#[actix::test]
async fn review_d9_sqlite_second_writer_through_a_symlink_breaks_the_fence() {
    use actix_delivery::journal::{SqliteJournal, SqliteOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let alias = dir.path().join("alias.db");
    let first = SqliteJournal::open(&path).await.unwrap();
    std::os::unix::fs::symlink(&path, &alias).unwrap();
    // Refused after waiting this long for the first to let go.
    let waiting = SqliteOptions::default().busy_timeout(Duration::from_millis(50));
    let second = SqliteJournal::open_with(&alias, waiting).await;
    let Ok(second) = second else {
        return; // refused: sound
    };
    let id = PersistenceId::new("s").unwrap();
    first
        .append(&id, 1, vec![b"from first".to_vec()])
        .await
        .unwrap();
    let raced = second.append(&id, 1, vec![b"from second".to_vec()]).await;
    let events = first.replay(&id, 1, u64::MAX, 10).await;
    assert!(
        matches!(raced, Err(JournalError::Conflict { .. })),
        "the second writer's append at seq 1 was acknowledged: {raced:?}; stream now: {events:?}"
    );
}

/// D10. A `PersistentActor` never stopped by itself: it holds its own address (the outbox's
/// `ReplyTo`) and a never-ending spawned future (`after_each_drain`), so dropping every
/// `PersistentHandle` left the actor, its state, its delivery record and its journal handle
/// alive for the life of the arbiter. An application that starts an entity per id on demand
/// and drops it leaked one actor per id; starting the same id again later made a *second live
/// writer* of the stream (conflicts, catch-ups, two outboxes resending). Now, as with
/// `ProducerHandle`, dropping the last handle lets the actor finish what it decided and stop
/// for good, releasing its journal.
#[actix::test]
async fn review_d10_dropped_persistent_handles_leak_the_actor() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let ledger = PersistentHandle::<Ledger>::start(
        journal.clone(),
        ledger_id(),
        PersistentConfig::default(),
    )
    .unwrap();
    ledger.ask(Op::Apply(1)).await.unwrap();
    let weak = ledger.addr().downgrade();
    drop(ledger);
    settle_for(60_000).await;
    assert!(
        weak.upgrade().is_none() && Arc::strong_count(&journal) == 1,
        "the entity is still alive after its last handle was dropped (journal handles: {})",
        Arc::strong_count(&journal)
    );
}

/// A state whose snapshot can never be encoded (17 MiB > the codec's 16 MiB), counting how
/// often a snapshot of it is attempted.
#[derive(Default, Deserialize)]
struct Big {
    blob: Blob,
    ticks: u64,
}

static BIG_ENCODES: AtomicU64 = AtomicU64::new(0);

impl Serialize for Big {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        BIG_ENCODES.fetch_add(1, Ordering::SeqCst);
        let mut s = serializer.serialize_struct("Big", 2)?;
        s.serialize_field("blob", &self.blob)?;
        s.serialize_field("ticks", &self.ticks)?;
        s.end()
    }
}

/// Bytes serialized in one call (no per-byte traversal), as `serde_bytes` would.
#[derive(Default, Deserialize)]
struct Blob(Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

#[derive(Serialize, Deserialize)]
enum BigEvent {
    Grow,
    Tick,
}

impl EventSourced for Big {
    type Command = ();
    type Event = BigEvent;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, (): &()) -> Result<Decision<Self>, String> {
        let event = if self.blob.0.is_empty() {
            BigEvent::Grow
        } else {
            BigEvent::Tick
        };
        Ok(Decision::persist([event], ()))
    }

    fn apply(&mut self, event: &BigEvent) {
        match event {
            BigEvent::Grow => self.blob = Blob(vec![7; 17 << 20]),
            BigEvent::Tick => self.ticks += 1,
        }
    }
}

/// D11. A state whose snapshot exceeds the codec's 16 MiB could never be snapshotted: the
/// failure was only logged, `events_since_snapshot` was not reset, so *every* later append
/// serialized the whole state again (and logged a warning), and with
/// `delete_events_on_snapshot` nothing was ever deleted: journal size and recovery time grew
/// without bound, silently (SPEC §6.2: "so recovery time and journal size stay bounded"). A
/// durable producer hits this with a backlog over 16 MiB (its snapshot holds every unsettled
/// body): e.g. 85 000 unsettled messages of 200 bytes, within its default room. Now snapshots
/// have their own limit (`max_snapshot_bytes`, default 256 MiB) and are serialized once
/// each (not sized first); one that fails anyway is counted and tried again only after
/// another `snapshot_every` events.
#[actix::test]
async fn review_d11_unencodable_snapshot_is_retried_every_append_and_never_compacts() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let config = PersistentConfig {
        snapshot_every: Some(10),
        delete_events_on_snapshot: true,
        ..PersistentConfig::default()
    };
    let big = PersistentHandle::<Big>::start(
        Arc::new(journal.clone()),
        PersistenceId::new("review-big").unwrap(),
        config,
    )
    .unwrap();
    for _ in 0..100 {
        big.ask(()).await.unwrap();
    }
    settle().await;
    let attempts = BIG_ENCODES.load(Ordering::SeqCst);
    let kept = journal
        .replay(
            &PersistenceId::new("review-big").unwrap(),
            1,
            u64::MAX,
            1_000,
        )
        .await
        .unwrap()
        .len();
    assert!(
        attempts <= 12 && kept <= 20,
        "{attempts} full-state serializations for 100 appends (one snapshot due per 10 events); \
         {kept} of 100 events kept: nothing is ever compacted"
    );
}

// ---------------------------------------------------------------------------------------------
// Checked and found sound (regression tests, not ignored)
// ---------------------------------------------------------------------------------------------

/// S1. The effectively-once consumer with a `handler_timeout` shorter than the commit: the
/// consumer abandons the deferred outcome, the producer retransmits, the second command is
/// answered as a duplicate of the one still in flight (held until its commit): each event once.
#[actix::test]
async fn review_s1_abandoned_deferred_outcome_then_commit_is_answered_as_duplicate() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let ledger = PersistentHandle::<Ledger>::start(
        Arc::new(journal.clone()),
        ledger_id(),
        PersistentConfig::default(),
    )
    .unwrap();
    ledger.ask(Op::Total).await.unwrap();
    let handler = ledger.delivery_handler(Op::Apply);
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(handler)
            .handler_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    );
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(consumer.consumer_ref())
            .producer_id("s1")
            .window_size(4)
            .resend_timeout(Duration::from_millis(100))
            .build()
            .unwrap(),
    );
    journal.faults().hold_commits();
    let confirmations = common::Confirmations::default();
    for n in 1..=6u64 {
        producer
            .tell(n, common::confirm_into(&confirmations, n))
            .unwrap();
    }
    settle_for(3_000).await; // many handler timeouts and retransmissions
    assert!(
        confirmations.snapshot().is_empty(),
        "nothing ACKed before the commit"
    );
    journal.faults().release();
    settle_for(3_000).await;
    producer.idle().await;
    assert!(confirmations.snapshot().iter().all(|(_, r)| r.is_ok()));
    let state = recover_state::<Ledger>(&journal, &ledger_id())
        .await
        .unwrap();
    let expected: BTreeMap<u64, u32> = (1..=6).map(|n| (n, 1)).collect();
    assert_eq!(state.applied, expected, "each message's event exactly once");
    assert!(ledger.stats().await.unwrap().duplicates > 0);
    assert!(
        consumer.stats().await.unwrap().handler_timeouts > 0,
        "the consumer really abandoned outcomes"
    );
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Warehouse {
    shipped: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
struct Shipped(u64);

impl EventSourced for Warehouse {
    type Command = u64;
    type Event = Shipped;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, &order: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Shipped(order)], ()))
    }

    fn apply(&mut self, Shipped(order): &Shipped) {
        self.shipped.push(*order);
    }
}

/// S2. Two live instances of one entity with an outbox, commands alternating between them:
/// conflicts hit batches that carry deliveries and confirmations. Every order is stored once,
/// every shipment is applied once by an effectively-once receiver, and the outboxes go quiet.
#[actix::test]
async fn review_s2_two_outbox_instances_racing_deliver_each_once() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let warehouse_id = PersistenceId::new("review-warehouse").unwrap();
    let warehouse = PersistentHandle::<Warehouse>::start(
        Arc::new(journal.clone()),
        warehouse_id.clone(),
        PersistentConfig::default(),
    )
    .unwrap();
    let receiver = ReliableDelivery::consumer(
        ConsumerOptions::builder(warehouse.delivery_handler(|Ship(order)| order))
            .build()
            .unwrap(),
    );
    let sent = Arc::new(AtomicU64::new(0));
    let start_instance = || {
        let (target, count) = (receiver.consumer_ref(), sent.clone());
        let link = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Ship>>| {
            count.fetch_add(deliveries.len() as u64, Ordering::SeqCst);
            target.do_send_all(deliveries.into_iter());
        });
        let lane = ProducerConfig {
            window_size: 8,
            resend_timeout: Duration::from_millis(100),
            ..ProducerConfig::default()
        };
        let outbox = Outbox::new().destination("shipping", link, lane).unwrap();
        PersistentHandle::<Orders>::start_with_outbox(
            Arc::new(journal.clone()),
            orders_id(),
            PersistentConfig::default(),
            outbox,
        )
        .unwrap()
    };
    let (a, b) = (start_instance(), start_instance());
    let mut asks = Vec::new();
    for order in 1..=40u64 {
        let instance = if order % 2 == 0 { &a } else { &b };
        asks.push(actix::spawn(instance.ask(order)));
        if order % 5 == 0 {
            settle_for(30).await;
        }
    }
    for ask in asks {
        ask.await.unwrap().unwrap();
    }
    settle_for(20_000).await;
    let quiet = sent.load(Ordering::SeqCst);
    settle_for(5_000).await;
    let orders = recover_state::<Orders>(&journal, &orders_id())
        .await
        .unwrap();
    let mut placed = orders.placed.clone();
    placed.sort_unstable();
    assert_eq!(placed, (1..=40).collect::<Vec<_>>());
    let shipped = recover_state::<Warehouse>(&journal, &warehouse_id)
        .await
        .unwrap();
    let mut got = shipped.shipped.clone();
    got.sort_unstable();
    assert_eq!(got, (1..=40).collect::<Vec<_>>(), "each shipment once");
    assert_eq!(
        sent.load(Ordering::SeqCst),
        quiet,
        "the outboxes keep resending confirmed deliveries"
    );
    let conflicts = a.stats().await.unwrap().conflicts + b.stats().await.unwrap().conflicts;
    assert!(conflicts > 0, "the instances really raced");
}

/// D12 (fixed: when deliveries stall, the actor reads the journal's highest seq and catches up
/// if another writer appended). Two live instances of an entity with an outbox (two nodes on a shared journal, or an
/// overlapping failover): the instance that does not write never learns of the other's
/// confirmations, and its lane resends the deliveries it recovered as unconfirmed. Once the
/// other instance's lane has moved the receiver's floor past them (its `window_start`), those
/// resends are *stale* at the receiver: never ACKed, so the idle instance never records
/// anything, never hits the fence, never catches up, and (with the default unbounded
/// `max_attempts`) retransmits them forever.
#[actix::test]
async fn review_d12_idle_second_outbox_instance_resends_forever() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let warehouse = PersistentHandle::<Warehouse>::start(
        Arc::new(journal.clone()),
        PersistenceId::new("review-warehouse").unwrap(),
        PersistentConfig::default(),
    )
    .unwrap();
    let receiver = ReliableDelivery::consumer(
        ConsumerOptions::builder(warehouse.delivery_handler(|Ship(order)| order))
            .build()
            .unwrap(),
    );
    let instance = |link: ConsumerRef<Ship>| {
        let lane = ProducerConfig {
            window_size: 8,
            resend_timeout: Duration::from_millis(100),
            ..ProducerConfig::default()
        };
        let outbox = Outbox::new().destination("shipping", link, lane).unwrap();
        PersistentHandle::<Orders>::start_with_outbox(
            Arc::new(journal.clone()),
            orders_id(),
            PersistentConfig::default(),
            outbox,
        )
        .unwrap()
    };
    let (link_a, cut_a, _) = cuttable(receiver.consumer_ref());
    let (link_b, cut_b, seen_b) = cuttable(receiver.consumer_ref());
    cut_a.store(true, Ordering::SeqCst);
    cut_b.store(true, Ordering::SeqCst);
    let a = instance(link_a);
    for order in 1..=5 {
        a.ask(order).await.unwrap();
    }
    // The second node starts: it recovers 1..=5 as unconfirmed.
    let b = instance(link_b);
    settle().await; // recovered (it writes nothing)
    cut_a.store(false, Ordering::SeqCst);
    settle_for(2_000).await; // A delivers 1..=5, records their confirmations
    a.ask(6).await.unwrap();
    settle_for(2_000).await; // 6 goes out with window_start 6
    cut_b.store(false, Ordering::SeqCst);
    settle_for(10_000).await;
    let before = seen_b.len();
    settle_for(60_000).await;
    let after = seen_b.len();
    let stats = receiver.stats().await.unwrap();
    assert!(
        b.stats().await.unwrap().catch_ups >= 1,
        "the idle one caught up"
    );
    assert_eq!(
        after,
        before,
        "the idle instance sent {} more resends in a minute (receiver: {} stale, {} duplicates)",
        after - before,
        stats.stale,
        stats.duplicates
    );
}

/// S3. Recovery from a snapshot plus later entries rebuilds the same delivery record as a
/// full replay, LRU eviction (`max_producers`), incarnations, window starts (stale) and
/// must-follow included: two entities fed the same random deliveries, one snapshotting every
/// 3 events and one never, answer every command alike, before and after restarts.
#[actix::test]
async fn review_s3_snapshot_recovery_equals_full_replay_for_the_delivery_record() {
    use actix_delivery::persistence::Outcome;
    use actix_delivery::{DeliveryInfo, IncarnationId, ProducerId};
    use rand::{rngs::SmallRng, Rng, SeedableRng};
    tokio::time::pause();
    for (seed, must_follow) in [(1u64, false), (2, true), (3, false), (4, true)] {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (with_snapshots, without) = (MemoryJournal::new(), MemoryJournal::new());
        let config = |snapshot_every| PersistentConfig {
            snapshot_every,
            max_producers: 2,
            must_follow,
            ..PersistentConfig::default()
        };
        let start = |journal: &MemoryJournal, every| {
            PersistentHandle::<Ledger>::start(Arc::new(journal.clone()), ledger_id(), config(every))
                .unwrap()
        };
        let mut n = 0u64;
        let mut kinds: BTreeMap<String, u32> = BTreeMap::new();
        for life in 0..4 {
            let a = start(&with_snapshots, Some(3));
            let b = start(&without, None);
            for _ in 0..60 {
                let seq = rng.random_range(1..=8u64);
                let info = DeliveryInfo {
                    producer_id: ProducerId::from(["p", "q", "r"][rng.random_range(0..3)]),
                    incarnation: IncarnationId::from_u128(rng.random_range(1..=2)),
                    seq,
                    window_start: rng.random_range(1..=seq),
                };
                n += 1;
                let show = |answer: Result<Outcome<i64>, CommandError<String>>| match answer {
                    Ok(Outcome::Done(_)) => "done".to_string(),
                    Ok(Outcome::AlreadyProcessed) => "duplicate".to_string(),
                    Err(error) => error.to_string(),
                };
                let left = show(a.ask_delivered(info.clone(), Op::Apply(n)).await);
                let right = show(b.ask_delivered(info.clone(), Op::Apply(n)).await);
                assert_eq!(
                    left, right,
                    "seed {seed}, life {life}, command {n}: {info:?}"
                );
                *kinds.entry(left).or_default() += 1;
            }
            a.stop();
            b.stop();
            a.stopped().await;
            b.stopped().await;
        }
        assert!(with_snapshots
            .load_snapshot(&ledger_id())
            .await
            .unwrap()
            .is_some());
        assert!(kinds.len() >= 3, "seed {seed}: {kinds:?}");
    }
}

/// S4. An append committed but reported failed (fsync error, lost connection after COMMIT):
/// the entity answers the error and restarts on the journal; the retransmission of the same
/// delivery is answered "already processed", never applied twice. And an outbox delivery of
/// that append, which does exist, is sent after the restart.
#[actix::test]
async fn review_s4_commit_reported_failed_is_deduplicated_on_retry_and_its_delivery_sent() {
    use actix_delivery::persistence::Outcome;
    use actix_delivery::{DeliveryInfo, IncarnationId, ProducerId};
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let journal = CommitThenFail::new(memory.clone());
    let ledger = PersistentHandle::<Ledger>::start_supervised(
        Arc::new(journal.clone()),
        ledger_id(),
        PersistentConfig::default(),
    )
    .unwrap();
    let info = DeliveryInfo {
        producer_id: ProducerId::from("p"),
        incarnation: IncarnationId::from_u128(9),
        seq: 1,
        window_start: 1,
    };
    journal.armed.store(true, Ordering::SeqCst);
    let failed = ledger.ask_delivered(info.clone(), Op::Apply(1)).await;
    assert!(
        matches!(failed, Err(CommandError::Journal(_))),
        "{failed:?}"
    );
    let retried = ledger.ask_delivered(info, Op::Apply(1)).await;
    assert!(
        matches!(retried, Ok(Outcome::AlreadyProcessed)),
        "{retried:?}"
    );
    let state = recover_state::<Ledger>(&memory, &ledger_id())
        .await
        .unwrap();
    assert_eq!(state.total, 1);

    let (consumer, shipped) = recording_consumer::<Ship>();
    let outbox = Outbox::new()
        .destination(
            "shipping",
            consumer.consumer_ref(),
            ProducerConfig::default(),
        )
        .unwrap();
    let orders = PersistentHandle::<Orders>::start_with_outbox(
        Arc::new(journal.clone()),
        orders_id(),
        PersistentConfig::default(),
        outbox,
    )
    .unwrap();
    journal.armed.store(true, Ordering::SeqCst);
    assert!(orders.ask(1).await.is_err());
    settle_for(5_000).await;
    assert_eq!(
        shipped.snapshot(),
        [Ship(1)],
        "its events exist, so it is delivered"
    );
}
