//! The persistence stack at its limits: a burst of stores over one entry's 16 MiB, an outbox
//! lane with less room than the entity's `max_unconfirmed`, commands piling up behind a
//! stalled append, a snapshot over 16 MiB, and an entity whose handles are all dropped.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{Journal, MemoryJournal, PersistenceId};
use actix_delivery::persistence::{
    recover_state, CommandError, Decision, EventSourced, Outbox, PersistentConfig,
    PersistentHandle, PersistentOptions,
};
use actix_delivery::{DeliveryError, ProducerConfig, ProducerOptions, ReliableDelivery};
use common::entities::{ledger_id, orders_id, Ledger, Op, Orders, Ship};
use common::{cuttable, out_stream, recording_consumer, settle, settle_for, Log};
use serde::{Deserialize, Serialize};

/// A store takes as many waiting messages as fit in one journal entry (an entry holds all events
/// of one command and is limited to the codec's 16 MiB); a message too large for any entry is
/// refused alone, clearly. A burst of messages that together exceed 16 MiB (17 messages of
/// 1 MiB here; with the default room of 100 016 messages, ~85 000 messages of 200 bytes) is
/// stored in several appends: none is refused and the producer does not stop, though each
/// message is far below every limit and all of them together fit no entry.
#[actix::test]
async fn a_burst_over_16_mib_is_stored_in_several_appends() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let (consumer, handled) = recording_consumer::<Vec<u8>>();
    let options = ProducerOptions::builder(consumer.consumer_ref())
        .producer_id("bulk")
        .window_size(16)
        .build()
        .unwrap();
    let durable = DurableOptions::new(Arc::new(journal.clone()), out_stream(), "bulk");
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

/// An outbox lane takes each committed delivery under its recorded seq, and never refuses one.
/// A lane whose `window_size + max_pending` is below the entity's `max_unconfirmed` holds more
/// committed deliveries than its `ProducerCore` has room for; were they handed to
/// `handle_send` and its `QueueFull` ignored, the refusal would come out of `poll_settled` like
/// a confirmation and be recorded as confirmed: the delivery would exist with its events but
/// never be sent, and the lane's own numbering would lag the recorded seqs, so later deliveries
/// would go out under other seqs than the journal records (a recovery resends them under the
/// recorded seq: a duplicate the receiver cannot recognise, or a "duplicate" that hides another
/// one).
#[actix::test]
async fn outbox_deliveries_beyond_the_lane_room_keep_their_recorded_seqs() {
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
    // The default settings: max_unconfirmed 10 000.
    let orders = PersistentHandle::<Orders>::start(
        PersistentOptions::new(Arc::new(journal.clone()), orders_id())
            .outbox(outbox)
            .supervised(),
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

/// While one append is in flight, every command that arrives is decided and held in the pending
/// batch. `max_recovery_buffer` bounds only recovery; at most `max_pending_commands` (default
/// 10 000) wait for their commit, and the rest are refused `Overloaded` and counted, so a
/// journal that stalls does not let the actor accumulate any number of decided commands,
/// replies and encoded entries in memory, then write them as one append of unbounded size.
#[actix::test]
async fn commands_beyond_max_pending_commands_are_refused_overloaded_while_an_append_stalls() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let config = PersistentConfig {
        max_recovery_buffer: 100,
        ..PersistentConfig::default()
    };
    let ledger = PersistentHandle::<Ledger>::start(
        PersistentOptions::new(Arc::new(journal.clone()), ledger_id()).config(config),
    )
    .unwrap();
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

/// A `PersistentActor` holds its own address (the outbox's `ReplyTo`) and a never-ending spawned
/// future (`after_each_drain`), so nothing but its handles can stop it. As with
/// `ProducerHandle`, dropping the last `PersistentHandle` lets the actor finish what it decided
/// and stop for good, releasing its state, its delivery record and its journal handle: an
/// application that starts an entity per id on demand and drops it leaks no actor per id, and
/// starting the same id again later makes no second live writer of the stream (conflicts,
/// catch-ups, two outboxes resending).
#[actix::test]
async fn dropping_the_last_persistent_handle_frees_the_actor_and_its_journal() {
    tokio::time::pause();
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let ledger =
        PersistentHandle::<Ledger>::start(PersistentOptions::new(journal.clone(), ledger_id()))
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

/// Snapshots have their own limit (`max_snapshot_bytes`, default 256 MiB), not the codec's
/// 16 MiB for entries, and are serialized once each (not sized first); one that fails anyway is
/// counted and tried again only after another `snapshot_every` events. So a state whose snapshot
/// exceeds 16 MiB (a durable producer with a backlog over 16 MiB, whose snapshot holds every
/// unsettled body: e.g. 85 000 unsettled messages of 200 bytes, within its default room) is
/// serialized about once per `snapshot_every` events, and with `delete_events_on_snapshot` its
/// journal is compacted: journal size and recovery time stay bounded (SPEC §6.2). A snapshot
/// failure that reset nothing would serialize the whole state again on every later append and
/// never delete anything.
#[actix::test]
async fn a_snapshot_over_16_mib_is_serialized_once_per_snapshot_every_and_compacts() {
    tokio::time::pause();
    let journal = MemoryJournal::new();
    let config = PersistentConfig {
        snapshot_every: Some(10),
        delete_events_on_snapshot: true,
        ..PersistentConfig::default()
    };
    let big = PersistentHandle::<Big>::start(
        PersistentOptions::new(
            Arc::new(journal.clone()),
            PersistenceId::new("big").unwrap(),
        )
        .config(config),
    )
    .unwrap();
    for _ in 0..100 {
        big.ask(()).await.unwrap();
    }
    settle().await;
    let attempts = BIG_ENCODES.load(Ordering::SeqCst);
    let kept = journal
        .replay(&PersistenceId::new("big").unwrap(), 1, u64::MAX, 1_000)
        .await
        .unwrap()
        .len();
    assert!(
        attempts <= 12 && kept <= 20,
        "{attempts} full-state serializations for 100 appends (one snapshot due per 10 events); \
         {kept} of 100 events kept: nothing is ever compacted"
    );
}
