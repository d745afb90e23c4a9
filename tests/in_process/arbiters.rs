//! Parts run on the arbiter their options name: persistent entities (plain, supervised, with
//! an outbox) and producers (durable or not); their handles used from here.

use std::sync::Arc;
use std::thread::{self, ThreadId};

use actix::prelude::*;
use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{MemoryJournal, PersistenceId};
use actix_delivery::persistence::{
    Decision, EventSourced, Outbox, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::{ConsumerRef, Delivery, ProducerConfig, ProducerOptions, ReliableDelivery};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;

/// An entity that answers with the thread it decided on, and delivers a `()` through its
/// outbox's `probe` destination if it has one.
#[derive(Default, Serialize, Deserialize)]
struct Where;

impl EventSourced for Where {
    type Command = bool;
    type Event = ();
    type Reply = ThreadId;
    type Rejection = String;

    fn decide(&self, &deliver: &bool) -> Result<Decision<Self>, String> {
        let decision = Decision::persist([()], thread::current().id());
        Ok(if deliver {
            decision.deliver("probe", &())
        } else {
            decision
        })
    }

    fn apply(&mut self, (): &()) {}
}

/// The thread `arbiter` runs on.
async fn thread_of(arbiter: &ArbiterHandle) -> ThreadId {
    let (tx, rx) = tokio::sync::oneshot::channel();
    assert!(arbiter.spawn(async move {
        let _ = tx.send(thread::current().id());
    }));
    rx.await.unwrap()
}

/// A link that drops deliveries and reports the thread each batch was sent from.
fn recording_threads<T: Send + 'static>() -> (ConsumerRef<T>, UnboundedReceiver<ThreadId>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let link = ConsumerRef::from_fn(move |_: Vec<Delivery<T>>| {
        let _ = tx.send(thread::current().id());
    });
    (link, rx)
}

fn id(name: &str) -> PersistenceId {
    PersistenceId::new(name).unwrap()
}

#[actix::test]
async fn persistent_entities_whose_options_name_an_arbiter_run_on_it() {
    let arbiter = Arbiter::new();
    let there = thread_of(&arbiter.handle()).await;
    assert_ne!(there, thread::current().id());
    let journal = Arc::new(MemoryJournal::new());
    let config = PersistentConfig::default;
    let plain = PersistentHandle::<Where>::start(
        PersistentOptions::new(journal.clone(), id("a"))
            .config(config())
            .arbiter(&arbiter.handle()),
    )
    .unwrap();
    assert_eq!(plain.ask(false).await.unwrap(), there);
    let supervised = PersistentHandle::<Where>::start(
        PersistentOptions::new(journal.clone(), id("b"))
            .config(config())
            .supervised()
            .arbiter(&arbiter.handle()),
    )
    .unwrap();
    assert_eq!(supervised.ask(false).await.unwrap(), there);
    // After a failed append the supervised one restarts, on the arbiter still; the plain one
    // stops for good.
    journal.faults().fail_nth_append(1);
    assert!(supervised.ask(false).await.is_err());
    assert_eq!(
        supervised.ask(false).await.unwrap(),
        there,
        "restarted there"
    );
    journal.faults().fail_nth_append(1);
    assert!(plain.ask(false).await.is_err());
    assert!(plain.stopped().await.is_err(), "not supervised: stopped");
    let (probe, mut sent_from) = recording_threads::<()>();
    let outbox = Outbox::new()
        .destination("probe", probe, ProducerConfig::default())
        .unwrap();
    let with_outbox = PersistentHandle::<Where>::start(
        PersistentOptions::new(journal.clone(), id("c"))
            .config(config())
            .outbox(outbox)
            .supervised()
            .arbiter(&arbiter.handle()),
    )
    .unwrap();
    assert_eq!(with_outbox.ask(true).await.unwrap(), there);
    let sender = sent_from
        .recv()
        .await
        .expect("the outbox sends its delivery");
    assert_eq!(sender, there, "from the arbiter");
    with_outbox.stop();
    with_outbox.stopped().await.unwrap();
    let invalid = PersistentConfig {
        replay_page: 0,
        ..config()
    };
    let refused = PersistentHandle::<Where>::start(
        PersistentOptions::new(journal, id("d"))
            .config(invalid)
            .arbiter(&arbiter.handle()),
    );
    assert_eq!(
        refused.unwrap_err().field,
        "replay_page",
        "refused here, at once"
    );
    arbiter.stop();
}

#[actix::test]
async fn a_producer_whose_options_name_an_arbiter_runs_on_it() {
    let arbiter = Arbiter::new();
    let there = thread_of(&arbiter.handle()).await;
    let (to, mut sent_from) = recording_threads::<u32>();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(to)
            .arbiter(&arbiter.handle())
            .build()
            .unwrap(),
    );
    producer.tell(7, |_| ()).unwrap();
    let sender = sent_from
        .recv()
        .await
        .expect("the producer sends its message");
    assert_eq!(sender, there, "from the arbiter");
    assert_ne!(sender, thread::current().id());
    producer.stop();
    producer.stopped().await.unwrap();
    arbiter.stop();
}

#[actix::test]
async fn a_durable_producer_whose_options_name_an_arbiter_runs_on_it() {
    let arbiter = Arbiter::new();
    let there = thread_of(&arbiter.handle()).await;
    let (to, mut sent_from) = recording_threads::<u32>();
    let durable = DurableOptions::new(Arc::new(MemoryJournal::new()), id("out"), "p");
    let producer = ReliableDelivery::durable_producer(
        ProducerOptions::builder(to)
            .arbiter(&arbiter.handle())
            .build()
            .unwrap(),
        durable,
    )
    .unwrap();
    let stored = producer.store(7).await.unwrap();
    assert_eq!(stored.id.0, 1);
    let sender = sent_from
        .recv()
        .await
        .expect("the producer sends its message");
    assert_eq!(sender, there, "from the arbiter");
    producer.stop();
    producer.stopped().await.unwrap();
    let invalid = DurableOptions::new(Arc::new(MemoryJournal::new()), id("out"), "");
    let (to, _) = recording_threads::<u32>();
    let refused = ReliableDelivery::durable_producer(
        ProducerOptions::builder(to)
            .arbiter(&arbiter.handle())
            .build()
            .unwrap(),
        invalid,
    );
    assert_eq!(refused.unwrap_err().field, "producer_id");
    arbiter.stop();
}
