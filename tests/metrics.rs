//! The `metrics` feature: a recording recorder sees every counter of the stats structs under
//! its documented name and the application's label, with the struct's values, and the
//! histograms and gauges of a scripted run.
//!
//! A test binary of its own: the recorder is the process's, and beside other suites it would
//! count their producers, journals and nodes too, under labels they share (`orders`).
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use actix::prelude::*;
use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal, SqliteOptions};
use actix_delivery::tcp::{NodeHandle, NodeOptions, NodeSecret};
use actix_delivery::{
    Ack, Acks, ConsumerController, ConsumerOptions, Deliveries, Delivery, DeliveryHandler,
    ProducerOptions, ReliableDelivery, ReplyTo, SingleAck,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;

/// The recorder of this test binary (installed once; tests tell their metrics apart by label).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// Every metric labelled `key=value` (and no other label), by name, as recorded since the
/// start. A snapshot of the debugging recorder resets what it reads (counters and gauges to 0,
/// histograms emptied), and tests run in parallel: every snapshot is added to one total here.
fn metrics_of(key: &str, value: &str) -> HashMap<String, DebugValue> {
    let total = recorded();
    total
        .iter()
        .filter(|(composite, _)| {
            let labels: Vec<_> = composite.key().labels().collect();
            labels.len() == 1 && labels[0].key() == key && labels[0].value() == value
        })
        .map(|(composite, value)| {
            let value = match value {
                DebugValue::Counter(n) => DebugValue::Counter(*n),
                DebugValue::Gauge(n) => DebugValue::Gauge(*n),
                DebugValue::Histogram(values) => DebugValue::Histogram(values.clone()),
            };
            (composite.key().name().to_string(), value)
        })
        .collect()
}

/// How many series (a name and its labels) were registered so far with a label value that
/// `matches`.
fn series_count(matches: impl Fn(&str) -> bool) -> usize {
    recorded()
        .iter()
        .filter(|(composite, _)| composite.key().labels().any(|l| matches(l.value())))
        .count()
}

/// Everything recorded since the start, with the latest snapshot added.
fn recorded() -> std::sync::MutexGuard<'static, Vec<(CompositeKey, DebugValue)>> {
    static TOTAL: Mutex<Vec<(CompositeKey, DebugValue)>> = Mutex::new(Vec::new());
    let mut total = TOTAL.lock().unwrap();
    for (composite, _, _, value) in snapshotter().snapshot().into_vec() {
        match total.iter_mut().find(|(k, _)| *k == composite) {
            None => total.push((composite, value)),
            Some((_, sum)) => match (sum, value) {
                (DebugValue::Counter(sum), DebugValue::Counter(n)) => *sum += n,
                (DebugValue::Gauge(sum), DebugValue::Gauge(n)) => *sum += n,
                (DebugValue::Histogram(sum), DebugValue::Histogram(values)) => sum.extend(values),
                (sum, value) => panic!("{composite:?}: {sum:?} then {value:?}"),
            },
        }
    }
    total
}

fn counter(metrics: &HashMap<String, DebugValue>, name: &str) -> u64 {
    match metrics.get(name) {
        Some(DebugValue::Counter(value)) => *value,
        other => panic!("{name}: not a counter: {other:?}"),
    }
}

fn gauge(metrics: &HashMap<String, DebugValue>, name: &str) -> f64 {
    match metrics.get(name) {
        Some(DebugValue::Gauge(value)) => value.into_inner(),
        other => panic!("{name}: not a gauge: {other:?}"),
    }
}

fn histogram(metrics: &HashMap<String, DebugValue>, name: &str) -> Vec<f64> {
    match metrics.get(name) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
        other => panic!("{name}: not a histogram: {other:?}"),
    }
}

/// Between a producer and a consumer: delivers the first transmission of seq 1 twice and
/// drops the first transmission of seq 2.
struct Relay {
    consumer: Recipient<Delivery<u32>>,
    producer: Option<ReplyTo>,
    seen: HashMap<u64, u32>,
}

impl Actor for Relay {
    type Context = Context<Self>;
}

impl Relay {
    fn forward(&mut self, mut delivery: Delivery<u32>, ctx: &mut Context<Self>) {
        if let Some(reply_to) = delivery.reply_to.take() {
            self.producer.get_or_insert(reply_to);
        }
        let addr = ctx.address();
        delivery.reply_to = Some(ReplyTo::batching(
            addr.clone().recipient(),
            addr.recipient(),
        ));
        let seen = self.seen.entry(delivery.seq).or_default();
        *seen += 1;
        match (delivery.seq, *seen) {
            (2, 1) => {} // lost
            (1, 1) => {
                let copy = Delivery {
                    producer_id: delivery.producer_id.clone(),
                    incarnation: delivery.incarnation,
                    seq: delivery.seq,
                    window_start: delivery.window_start,
                    trace_context: delivery.trace_context.clone(),
                    body: delivery.body,
                    reply_to: delivery.reply_to.clone(),
                };
                self.consumer.do_send(delivery);
                self.consumer.do_send(copy);
            }
            _ => self.consumer.do_send(delivery),
        }
    }

    fn back(&self, ack: Ack) {
        if let Some(producer) = &self.producer {
            producer.do_send(ack);
        }
    }
}

impl Handler<Delivery<u32>> for Relay {
    type Result = ();
    fn handle(&mut self, delivery: Delivery<u32>, ctx: &mut Context<Self>) {
        self.forward(delivery, ctx);
    }
}

impl Handler<Deliveries<u32>> for Relay {
    type Result = ();
    fn handle(&mut self, Deliveries(batch): Deliveries<u32>, ctx: &mut Context<Self>) {
        batch.into_iter().for_each(|d| self.forward(d, ctx));
    }
}

impl Handler<SingleAck> for Relay {
    type Result = ();
    fn handle(&mut self, SingleAck(ack): SingleAck, _: &mut Context<Self>) {
        self.back(ack);
    }
}

impl Handler<Acks> for Relay {
    type Result = ();
    fn handle(&mut self, Acks(acks): Acks, _: &mut Context<Self>) {
        acks.into_iter().for_each(|a| self.back(a));
    }
}

#[actix::test]
async fn producer_and_consumer_counters_equal_their_stats_and_latencies_are_recorded() {
    tokio::time::pause();
    snapshotter();
    const N: u32 = 20;
    let handler = DeliveryHandler::from_fn(|n: u32| async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let _ = n;
        Ok::<(), std::io::Error>(())
    });
    let consumer = ConsumerController::new(
        ConsumerOptions::builder(handler)
            .name("orders-consumer")
            .build()
            .unwrap(),
    )
    .start();
    let relay = Relay {
        consumer: consumer.clone().recipient(),
        producer: None,
        seen: HashMap::new(),
    }
    .start();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(relay.recipient::<Delivery<u32>>())
            .window_size(4)
            .resend_timeout(Duration::from_millis(100))
            .metrics_label("orders")
            .build()
            .unwrap(),
    );
    for n in 1..=N {
        producer.send(n).await.unwrap();
    }
    producer.idle().await;
    tokio::time::sleep(Duration::from_millis(50)).await; // the consumer's last drain
    let stats = producer.stats().await.unwrap();
    let consumed = consumer
        .send(actix_delivery::GetConsumerStats)
        .await
        .unwrap();
    assert_eq!(stats.sent, u64::from(N));
    assert_eq!(stats.retransmitted, 1, "the lost seq 2: {stats:?}");
    assert_eq!(consumed.delivered, u64::from(N));

    let metrics = metrics_of("producer", "orders");
    for (name, value) in [
        ("sent", stats.sent),
        ("retransmitted", stats.retransmitted),
        ("confirmed", stats.confirmed),
        ("ignored_acks", stats.ignored_acks),
        ("given_up", stats.given_up),
        ("refused", stats.refused),
    ] {
        let name = format!("actix_delivery_producer_{name}_total");
        assert_eq!(counter(&metrics, &name), value, "{name}");
    }
    // Neither durable nor chunking: what only those have is not exported.
    for name in [
        "stored",
        "resumed",
        "resumed_confirmed",
        "chunk_rounds",
        "partially_stored",
    ] {
        let name = format!("actix_delivery_producer_{name}_total");
        assert!(!metrics.contains_key(&name), "{name}");
    }
    assert!(!metrics.contains_key("actix_delivery_producer_unconfirmed"));
    assert_eq!(gauge(&metrics, "actix_delivery_producer_in_flight"), 0.0);
    assert_eq!(gauge(&metrics, "actix_delivery_producer_queued"), 0.0);
    // One send at a time: each waits for its handler run (10 ms), the lost one also for its
    // retransmission (100 ms).
    let latencies = histogram(&metrics, "actix_delivery_producer_confirm_seconds");
    assert_eq!(latencies.len(), N as usize);
    assert!(latencies.iter().all(|s| *s >= 0.010), "{latencies:?}");
    assert_eq!(latencies.iter().filter(|s| **s >= 0.100).count(), 1);

    let metrics = metrics_of("consumer", "orders-consumer");
    // The copy of seq 1 arrived while its handler ran.
    assert_eq!(consumed.in_progress, 1, "{consumed:?}");
    for (name, value) in [
        ("delivered", consumed.delivered),
        ("duplicates", consumed.duplicates),
        ("in_progress", consumed.in_progress),
        ("stale", consumed.stale),
        ("dead_letters", consumed.dead_letters),
        ("refused", consumed.refused),
        ("handler_failures", consumed.handler_failures),
        ("handler_panics", consumed.handler_panics),
        ("handler_timeouts", consumed.handler_timeouts),
        ("evictions", consumed.evictions),
        ("swept", consumed.swept),
        ("replaced_incarnations", consumed.replaced_incarnations),
        ("shared_id_messages", consumed.shared_id_messages),
        ("assembled", consumed.assembled),
        ("chunks_refused", consumed.chunks_refused),
        (
            "partial_messages_dropped",
            consumed.partial_messages_dropped,
        ),
    ] {
        let name = format!("actix_delivery_consumer_{name}_total");
        assert_eq!(counter(&metrics, &name), value, "{name}");
    }
    assert_eq!(
        gauge(&metrics, "actix_delivery_consumer_tracked_producers"),
        1.0
    );
    assert_eq!(gauge(&metrics, "actix_delivery_consumer_waiting"), 0.0);
    let runs = histogram(&metrics, "actix_delivery_consumer_handler_seconds");
    assert_eq!(runs.len(), N as usize);
    // Each run sleeps 10 ms of virtual time (Tokio's timer rounds up to its next millisecond).
    assert!(runs.iter().all(|s| (0.010..0.012).contains(s)), "{runs:?}");
}

/// A burst costs the metrics a publish and a latency sample per 10 ms, not per message, and a
/// part that falls quiet still publishes its last state: under a paused clock a burst takes no
/// time, so it gets one sample of each histogram, and the consumer's counters arrive 10 ms
/// after its last message, without anyone asking for its stats.
#[actix::test]
async fn a_burst_is_published_and_sampled_once_per_interval_and_its_end_arrives() {
    tokio::time::pause();
    snapshotter();
    const N: u64 = 200;
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u64| async {
            Ok::<(), std::io::Error>(())
        }))
        .name("burst-consumer")
        .build()
        .unwrap(),
    );
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(&consumer)
            .window_size(1)
            .metrics_label("burst")
            .build()
            .unwrap(),
    );
    for n in 1..=N {
        producer.send(n).await.unwrap(); // one at a time: each its own batch
    }
    producer.idle().await;
    // `idle()` answered: the producer's counters agree at once.
    let metrics = metrics_of("producer", "burst");
    assert_eq!(
        counter(&metrics, "actix_delivery_producer_confirmed_total"),
        N
    );
    let latencies = histogram(&metrics, "actix_delivery_producer_confirm_seconds");
    assert!(
        !latencies.is_empty() && latencies.len() < N as usize / 10,
        "{} latency samples for {N} messages one at a time",
        latencies.len()
    );
    tokio::time::sleep(Duration::from_millis(11)).await;
    let metrics = metrics_of("consumer", "burst-consumer");
    assert_eq!(
        counter(&metrics, "actix_delivery_consumer_delivered_total"),
        N
    );
    let runs = histogram(&metrics, "actix_delivery_consumer_handler_seconds");
    assert!(
        !runs.is_empty() && runs.len() < N as usize / 10,
        "{} handler samples for {N} runs",
        runs.len()
    );
}

#[actix::test]
async fn sqlite_commits_appear_in_the_commit_histograms() {
    snapshotter();
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open_with(
        dir.path().join("metrics.journal"),
        SqliteOptions::builder()
            .metrics_label("ledger")
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let id = PersistenceId::new("account-1").unwrap();
    for append in 0..5u64 {
        journal
            .append(
                &id,
                1 + 2 * append,
                vec![b"event".to_vec(), b"event".to_vec()],
            )
            .await
            .unwrap();
    }
    // A conflict: rejected, in a transaction that rolls back.
    assert!(journal
        .append(&id, 3, vec![b"late".to_vec()])
        .await
        .is_err());
    let stats = journal.stats();
    journal.close().await;
    let metrics = metrics_of("journal", "ledger");
    assert_eq!(stats.appends, 5);
    for (name, value) in [
        ("appends", stats.appends),
        ("events", stats.events),
        ("transactions", stats.transactions),
        ("rejected", stats.rejected),
        ("folds", stats.folds),
    ] {
        let name = format!("actix_delivery_sqlite_{name}_total");
        assert_eq!(counter(&metrics, &name), value, "{name}");
    }
    assert_eq!(counter(&metrics, "actix_delivery_sqlite_events_total"), 10);
    let writes = histogram(&metrics, "actix_delivery_sqlite_commit_writes");
    let seconds = histogram(&metrics, "actix_delivery_sqlite_commit_seconds");
    assert_eq!(writes.len() as u64, stats.transactions);
    assert_eq!(seconds.len() as u64, stats.transactions);
    // Every write was in a committed transaction (the conflict, too: refused by the fence
    // inside one).
    assert_eq!(writes.iter().sum::<f64>(), 6.0);
}

#[actix::test]
async fn node_counters_equal_its_stats_over_loopback_tcp() {
    snapshotter();
    const N: u64 = 200;
    let options = |label: &str| {
        NodeOptions::builder()
            .secret(NodeSecret::new([7; 32]).unwrap())
            .metrics_label(label)
    };
    let server = NodeHandle::start(
        options("metrics-server")
            .listen("127.0.0.1:0".parse().unwrap())
            .build()
            .unwrap(),
    )
    .await
    .unwrap();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u64| async {
            Ok::<(), std::io::Error>(())
        }))
        .build()
        .unwrap(),
    );
    server.expose("numbers", &consumer).unwrap();
    let client = NodeHandle::start(options("metrics-client").build().unwrap())
        .await
        .unwrap();
    let remote = client
        .consumer_ref::<u64>(server.local_addr().unwrap(), "numbers")
        .unwrap();
    let producer = ReliableDelivery::producer(
        ProducerOptions::builder(remote)
            .window_size(32)
            .build()
            .unwrap(),
    );
    for n in 1..=N {
        producer.tell(n, |_| {}).unwrap();
    }
    producer.idle().await;
    // Everything queued is written, and published, soon after the last ACK.
    let observe = |side: &str| metrics_of("node", side);
    let mut synced = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (c, s) = (client.stats(), server.stats());
        let cm = observe("metrics-client");
        let sm = observe("metrics-server");
        if counter(&cm, "actix_delivery_node_frames_out_total") == c.frames_out
            && counter(&sm, "actix_delivery_node_frames_out_total") == s.frames_out
            && counter(&cm, "actix_delivery_node_acks_in_total") == c.acks_in
        {
            synced = true;
            break;
        }
    }
    assert!(synced, "the metrics caught up with the stats");
    let (c, s) = (client.stats(), server.stats());
    let client_metrics = observe("metrics-client");
    let server_metrics = observe("metrics-server");
    assert_eq!(c.deliveries_out, N);
    assert_eq!(s.deliveries_in, N);
    for (metrics, stats, side) in [
        (&client_metrics, c, "metrics-client"),
        (&server_metrics, s, "metrics-server"),
    ] {
        for (name, value) in [
            ("connections_opened", stats.connections_opened),
            ("connections_accepted", stats.connections_accepted),
            ("handshake_failures", stats.handshake_failures),
            ("deliveries_out", stats.deliveries_out),
            ("deliveries_in", stats.deliveries_in),
            ("acks_out", stats.acks_out),
            ("acks_in", stats.acks_in),
            ("bodies_encoded", stats.bodies_encoded),
            ("decode_failures", stats.decode_failures),
        ] {
            let name = format!("actix_delivery_node_{name}_total");
            assert_eq!(counter(metrics, &name), value, "{side}: {name}");
        }
        assert_eq!(
            gauge(metrics, "actix_delivery_node_connections_open"),
            1.0,
            "{side}"
        );
        // Frames in the socket writes add up to the frames queued (heartbeats included).
        let frames = histogram(metrics, "actix_delivery_node_write_frames");
        let bytes = histogram(metrics, "actix_delivery_node_write_bytes");
        assert!(!frames.is_empty(), "{side}");
        assert_eq!(frames.len(), bytes.len(), "{side}");
        assert!(
            frames.iter().sum::<f64>() <= stats.frames_out as f64,
            "{side}"
        );
        assert!(bytes.iter().all(|b| *b > 0.0), "{side}");
    }
    assert_eq!(
        counter(
            &client_metrics,
            "actix_delivery_node_connections_opened_total"
        ),
        1
    );
    assert_eq!(
        counter(
            &server_metrics,
            "actix_delivery_node_connections_accepted_total"
        ),
        1
    );
    client.stop();
    server.stop();
}

#[actix::test]
async fn an_empty_metrics_label_is_refused_at_construction() {
    let handler = DeliveryHandler::from_fn(|_: u32| async { Ok::<(), std::io::Error>(()) });
    let error = ConsumerOptions::builder(handler)
        .name("")
        .build()
        .unwrap_err();
    assert_eq!(error.field, "name");
    let error = NodeOptions::builder()
        .insecure_no_authentication()
        .metrics_label("")
        .build()
        .unwrap_err();
    assert_eq!(error.field, "metrics_label");
}

/// A counter entity of its own type, so that its `entity` label is this test's alone.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct RestartedCounter(u64);

#[derive(serde::Serialize, serde::Deserialize)]
struct Added(u64);

impl actix_delivery::persistence::EventSourced for RestartedCounter {
    type Command = u64;
    type Event = Added;
    type Reply = u64;
    type Rejection = String;

    fn decide(&self, add: &u64) -> Result<actix_delivery::persistence::Decision<Self>, String> {
        Ok(actix_delivery::persistence::Decision::persist(
            [Added(*add)],
            self.0 + add,
        ))
    }

    fn apply(&mut self, Added(add): &Added) {
        self.0 += add;
    }
}

/// A supervised restart replaces the entity's core (its stats start from zero): the counters
/// go on counting across it instead of waiting for the new stats to pass the old ones.
#[actix::test]
async fn counters_go_on_across_a_supervised_restart_of_a_persistent_entity() {
    use actix_delivery::journal::MemoryJournal;
    use actix_delivery::persistence::{PersistentConfig, PersistentHandle, PersistentOptions};
    snapshotter();
    let journal = MemoryJournal::new();
    let entity = PersistentHandle::<RestartedCounter>::start(
        PersistentOptions::new(
            std::sync::Arc::new(journal.clone()),
            PersistenceId::new("counter-1").unwrap(),
        )
        .config(PersistentConfig {
            metrics_label: Some("restarted".into()),
            ..PersistentConfig::default()
        })
        .supervised(),
    )
    .unwrap();
    assert_eq!(entity.ask(1).await.unwrap(), 1);
    assert_eq!(entity.ask(2).await.unwrap(), 3);
    journal.faults().fail_nth_append(1);
    assert!(
        entity.ask(4).await.is_err(),
        "the failed append restarts the entity"
    );
    assert_eq!(
        entity.ask(8).await.unwrap(),
        11,
        "recovered from the journal"
    );
    let stats = entity.stats().await.unwrap();
    assert_eq!(
        (stats.recoveries, stats.appends),
        (1, 1),
        "the new core's own"
    );
    let metrics = metrics_of("entity", "restarted");
    assert_eq!(
        counter(&metrics, "actix_delivery_persistent_recoveries_total"),
        2
    );
    assert_eq!(
        counter(&metrics, "actix_delivery_persistent_appends_total"),
        3
    );
    assert_eq!(
        counter(&metrics, "actix_delivery_persistent_events_total"),
        3
    );
}

/// An entity whose entries are tagged `metered`, for the projection's metrics.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Tally(u64);

impl actix_delivery::persistence::EventSourced for Tally {
    type Command = u64;
    type Event = u64;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, n: &u64) -> Result<actix_delivery::persistence::Decision<Self>, String> {
        Ok(actix_delivery::persistence::Decision::persist([*n], ()))
    }

    fn apply(&mut self, n: &u64) {
        self.0 += n;
    }

    fn tags(_: &u64) -> Vec<actix_delivery::journal::Tag> {
        vec![actix_delivery::journal::Tag::from_static("metered")]
    }
}

#[actix::test]
async fn projection_counters_equal_its_stats_under_its_name_and_slices() {
    use actix_delivery::journal::{MemoryJournal, Slices, Tag};
    use actix_delivery::persistence::{PersistentHandle, PersistentOptions};
    use actix_delivery::projection::{
        MemoryOffsetStore, PoisonPolicy, Projection, ProjectionOptions,
    };

    snapshotter();
    let journal: std::sync::Arc<dyn Journal> = std::sync::Arc::new(MemoryJournal::new());
    let tally = PersistentHandle::<Tally>::start(PersistentOptions::new(
        journal.clone(),
        PersistenceId::new("tally").unwrap(),
    ))
    .unwrap();
    for n in 0..10 {
        tally.ask(n).await.unwrap();
    }
    let options = ProjectionOptions::builder("metered", Tag::from_static("metered"))
        .slices(Slices::new(0, 1023).unwrap())
        .max_retries(0)
        .retry_backoff(Duration::from_millis(1), Duration::from_millis(1))
        .poison(PoisonPolicy::Skip)
        .commit_every(4)
        .build()
        .unwrap();
    let projection = Projection::of::<Tally>(journal, options).at_least_once(
        MemoryOffsetStore::new(),
        |events| {
            let poison = events.iter().any(|e| e.event == 3);
            Box::pin(async move {
                if poison {
                    return Err("three".into());
                }
                Ok(())
            })
        },
    );
    while projection.stats().entries < 10 {
        actix::clock::sleep(Duration::from_millis(5)).await;
    }
    projection.stop();
    projection.stopped().await.unwrap();
    let stats = projection.stats();
    assert_eq!((stats.events, stats.skipped), (9, 1));
    let metrics = metrics_of("projection", "metered");
    for (name, value) in [
        ("events", stats.events),
        ("entries", stats.entries),
        ("batches", stats.batches),
        ("retries", stats.retries),
        ("skipped", stats.skipped),
        ("offsets_saved", stats.offsets_saved),
        ("read_failures", stats.read_failures),
        ("store_failures", stats.store_failures),
        ("conflicts", stats.conflicts),
    ] {
        let metric = format!("actix_delivery_projection_{name}_total");
        assert_eq!(counter(&metrics, &metric), value, "{metric}");
    }
    assert!(stats.retries > 0 && stats.offsets_saved > 0, "{stats:?}");
    // The run ended before `stopped()` resolved, and its meter withdrew what its gauge said
    // (the lag of its last batch, 0 or 1 ms here: comparing it with `stats.lag_ms` failed in
    // CI whenever the last batch took a millisecond).
    assert_eq!(
        gauge(&metrics, "actix_delivery_projection_lag_milliseconds"),
        0.0,
        "a stopped projection's lag is withdrawn ({} ms before)",
        stats.lag_ms
    );
}

/// The sharding parts publish their stats structs: an entity host (label: its entity type),
/// a sharded producer's entity streams (label: the producer's id) and a shard coordinator.
#[actix::test]
async fn entity_host_coordinator_and_sharded_producer_counters_equal_their_stats() {
    use std::sync::Arc;

    use actix_delivery::journal::MemoryJournal;
    use actix_delivery::sharding::{
        CoordinatorOptions, EntityHostHandle, EntityHostOptions, EntityId, MemoryLeaseStore,
        NoTransport, ShardCoordinatorHandle, ShardedProducerOptions,
    };
    use actix_delivery::ProducerConfig;
    tokio::time::pause();
    snapshotter();
    let journal = Arc::new(MemoryJournal::new());
    let options = EntityHostOptions::builder("metrics_counters")
        .build()
        .unwrap();
    let host = EntityHostHandle::<RestartedCounter>::start(journal.clone(), options).unwrap();
    let consumer = host.consumer(|n: u64| n);
    let front = ProducerConfig {
        producer_id: Some("metrics-sharded".into()),
        ..ShardedProducerOptions::<u64>::default_producer()
    };
    let options = ShardedProducerOptions::builder(&consumer)
        .producer(front)
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    for n in 0..10 {
        let entity = EntityId::new(format!("c{}", n % 3)).unwrap();
        producer.send(entity, 1).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = host.stats();
    let metrics = metrics_of("entity_type", "metrics_counters");
    assert_eq!(stats.routed, 10);
    let host_counters = [
        ("routed", stats.routed),
        ("activations", stats.activations),
        ("waited", stats.waited),
    ];
    for (field, value) in host_counters {
        let name = format!("actix_delivery_entity_host_{field}_total");
        assert_eq!(counter(&metrics, &name), value, "{name}");
    }
    assert_eq!(gauge(&metrics, "actix_delivery_entity_host_active"), 3.0);
    let lanes = producer.lane_stats().await.unwrap();
    let metrics = metrics_of("producer", "metrics-sharded");
    assert_eq!(
        counter(&metrics, "actix_delivery_sharded_producer_settled_total"),
        lanes.settled
    );
    assert_eq!(lanes.settled, 10);
    assert_eq!(
        gauge(&metrics, "actix_delivery_sharded_producer_lanes"),
        3.0
    );

    let options = EntityHostOptions::builder("metrics_coordinated")
        .shards(4)
        .build()
        .unwrap();
    let coordinator = ShardCoordinatorHandle::<RestartedCounter>::start(
        journal,
        options,
        Arc::new(MemoryLeaseStore::new()),
        CoordinatorOptions::builder("node").build().unwrap(),
        |_| NoTransport,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let stats = coordinator.stats().await.unwrap();
    let metrics = metrics_of("entity_type", "metrics_coordinated");
    assert_eq!(stats.acquired, 4);
    for (field, value) in [("acquired", stats.acquired), ("rounds", stats.rounds)] {
        let name = format!("actix_delivery_shard_coordinator_{field}_total");
        assert_eq!(counter(&metrics, &name), value, "{name}");
    }
    assert_eq!(
        gauge(&metrics, "actix_delivery_shard_coordinator_shards_owned"),
        4.0
    );
}

/// A sharded producer exports one set of series under the label its application chose,
/// however many entities it sends to: entity ids (often user input) never become labels.
#[actix::test]
async fn a_sharded_producers_series_do_not_grow_with_the_entities_it_sends_to() {
    use std::sync::Arc;

    use actix_delivery::journal::MemoryJournal;
    use actix_delivery::sharding::{
        EntityHostHandle, EntityHostOptions, EntityId, ShardedProducerOptions,
    };
    use actix_delivery::ProducerConfig;
    tokio::time::pause();
    snapshotter();
    let host = EntityHostHandle::<RestartedCounter>::start(
        Arc::new(MemoryJournal::new()),
        EntityHostOptions::builder("churned").build().unwrap(),
    )
    .unwrap();
    let consumer = host.consumer(|n: u64| n);
    let front = ProducerConfig {
        producer_id: Some("churning".into()),
        ..ShardedProducerOptions::<u64>::default_producer()
    };
    let options = ShardedProducerOptions::builder(&consumer)
        .producer(front)
        .cleanup_unused_after(Duration::from_millis(1)) // lanes close and open again
        .build()
        .unwrap();
    let producer = ReliableDelivery::sharded_producer(options);
    let ours = |value: &str| value.starts_with("churning");
    let send = |range: std::ops::Range<u64>| {
        let producer = producer.clone();
        async move {
            for n in range {
                let entity = EntityId::new(format!("user-{n}")).unwrap();
                producer.tell(entity, n, |_| {}).unwrap();
            }
            producer.idle().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    send(0..100).await;
    let after_100 = series_count(ours);
    send(100..10_100).await;
    let after_10_100 = series_count(ours);
    assert!(after_100 > 0, "the producer and its lanes export");
    assert_eq!(after_10_100, after_100, "entity ids never become series");
    assert_eq!(
        series_count(|value| value.contains("user-")),
        0,
        "no label holds an entity id"
    );
    let lanes = producer.lane_stats().await.unwrap();
    assert_eq!(lanes.opened, 10_100);
    assert!(lanes.closed >= 10_000, "{lanes:?}");
}

/// A work-pulling producer's worker streams export under its one label, however many workers
/// come and go: worker names (announced by peers) never become labels.
#[actix::test]
async fn a_work_pulling_producers_series_do_not_grow_with_the_workers_that_come_and_go() {
    use actix_delivery::work_pulling::{Job, WorkPullingOptions, WorkerRegistry};
    use actix_delivery::ProducerConfig;
    tokio::time::pause();
    snapshotter();
    let registry = WorkerRegistry::new();
    let front = ProducerConfig {
        producer_id: Some("pulling".into()),
        ..WorkPullingOptions::<u64>::default_producer()
    };
    let options = WorkPullingOptions::builder(&registry)
        .producer(front)
        .build()
        .unwrap();
    let jobs = ReliableDelivery::work_pulling_producer(options);
    let handler = || DeliveryHandler::from_fn(|_: Job<u64>| async { Ok::<(), String>(()) });
    let churn = |range: std::ops::Range<u64>| {
        let (jobs, registry) = (jobs.clone(), registry.clone());
        async move {
            for n in range {
                let name = format!("peer-{n}");
                let worker = ReliableDelivery::consumer(
                    ConsumerOptions::builder(handler()).build().unwrap(),
                );
                registry.register_consumer(&name, &worker).unwrap();
                jobs.send(n).await.unwrap();
                registry.deregister(&name);
            }
        }
    };
    churn(0..10).await;
    let after_10 = series_count(|value| value.starts_with("pulling"));
    churn(10..1_010).await;
    let after_1_010 = series_count(|value| value.starts_with("pulling"));
    assert!(after_10 > 0, "the producer and its worker streams export");
    assert_eq!(after_1_010, after_10, "worker names never become series");
    assert_eq!(series_count(|value| value.contains("peer-")), 0);
}

/// A durable producer exports what it stored under its label, and its own log is no entity:
/// no `entity` series names a type of the crate's.
#[actix::test]
async fn a_durable_producer_exports_what_it_stored_and_its_log_is_no_entity() {
    use actix_delivery::durable::DurableOptions;
    use actix_delivery::journal::MemoryJournal;
    tokio::time::pause();
    snapshotter();
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u32| async {
            Ok::<(), String>(())
        }))
        .build()
        .unwrap(),
    );
    let producer = ReliableDelivery::durable_producer(
        ProducerOptions::builder(&consumer).build().unwrap(),
        DurableOptions::new(
            std::sync::Arc::new(MemoryJournal::new()),
            PersistenceId::new("metered-durable").unwrap(),
            "metered-durable",
        ),
    )
    .unwrap();
    for n in 0..5 {
        producer.store(n).await.unwrap().confirmed().await.unwrap();
    }
    producer.stop();
    producer.stopped().await.unwrap();
    let metrics = metrics_of("producer", "metered-durable");
    assert_eq!(counter(&metrics, "actix_delivery_producer_stored_total"), 5);
    assert_eq!(
        series_count(|value| value.contains("ProducerLog") || value.contains("::")),
        0,
        "no label is a type path"
    );
}
