//! Review of the graceful `stop()` of durable producers (SPEC §9, issue 24 items 1–6): cases
//! where a stop's promise does not hold. Under virtual time, over MemoryJournals.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::durable::{DurableOptions, MessageId};
use actix_delivery::journal::{
    Journal, JournalFuture, MemoryJournal, PersistenceId, Snapshot, StoredEvent,
};
use actix_delivery::{ConsumerRef, Delivery, ProducerHandle, ProducerOptions, ReliableDelivery};
use common::{settle, settle_for, Gate};

fn stream() -> PersistenceId {
    PersistenceId::new("stop-review").unwrap()
}

/// A link that loses every delivery.
fn black_hole<T: Send + 'static>() -> ConsumerRef<T> {
    ConsumerRef::from_fn(|_: Vec<Delivery<T>>| {})
}

fn durable_producer(
    journal: Arc<dyn Journal>,
    configure: impl FnOnce(DurableOptions) -> DurableOptions,
) -> ProducerHandle<u32> {
    let options = ProducerOptions::builder(black_hole())
        .producer_id("reviewed")
        .window_size(4)
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let durable = configure(DurableOptions::new(journal, stream()));
    ReliableDelivery::durable_producer(options, durable).unwrap()
}

/// A MemoryJournal whose next recovery (its first read, `load_snapshot`) waits until released:
/// a journal slow to answer one opening's reads.
#[derive(Clone)]
struct SlowRecovery {
    inner: MemoryJournal,
    hold_next: Arc<AtomicBool>,
    gate: Gate,
}

impl SlowRecovery {
    fn new(inner: MemoryJournal) -> Self {
        Self {
            inner,
            hold_next: Arc::new(AtomicBool::new(false)),
            gate: Gate::default(),
        }
    }
}

impl Journal for SlowRecovery {
    fn append(&self, id: &PersistenceId, first: u64, p: Vec<Vec<u8>>) -> JournalFuture<'_, ()> {
        self.inner.append(id, first, p)
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
            if self.hold_next.swap(false, Ordering::SeqCst) {
                self.gate.pass().await;
            }
            self.inner.load_snapshot(&id).await
        })
    }

    fn max_payload(&self) -> usize {
        self.inner.max_payload()
    }
}

/// A producer stopped before its stream opened, whose stop timed out while its journal was
/// slow, is stopped for good once `stopped()` resolves: nothing of it writes to the stream
/// afterwards, so a producer started on the stream after it keeps the stream.
#[actix::test]
async fn a_producer_stopped_at_its_timeout_before_it_opened_never_takes_the_stream_back() {
    tokio::time::pause();
    let memory = MemoryJournal::new();
    let slow = SlowRecovery::new(memory.clone());
    slow.hold_next.store(true, Ordering::SeqCst);
    let first = durable_producer(Arc::new(slow.clone()), |d| {
        d.stop_timeout(Duration::from_secs(1))
    });
    settle().await; // its opening waits for the journal's reads
    first.stop();
    let stopped = tokio::time::timeout(Duration::from_secs(5), first.stopped()).await;
    assert!(stopped.is_ok(), "the stop is bounded by its timeout");

    // Its successor opens the stream and stores.
    let second = durable_producer(Arc::new(memory.clone()), |d| d);
    let stored = second.store(1).await.expect("the successor stores");
    assert_eq!(stored.id, MessageId(1));

    // The journal answers the stopped producer's reads now.
    slow.gate.open();
    settle_for(100).await;

    let next = second.store(2).await.map(|stored| stored.id);
    assert_eq!(
        next,
        Ok(MessageId(2)),
        "the stopped producer's opening must not land after it stopped for good"
    );
}
