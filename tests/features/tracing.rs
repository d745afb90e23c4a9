//! The `tracing` feature: the spans of a scripted run (recorded by a layer of the test's own,
//! installed once for the process: journal writers and nodes run on threads of their own, so
//! each test picks out its spans by names only it uses), and trace contexts carried from the
//! producer's hook to the handler, in process, over TCP and over NATS.

use crate::common;
#[cfg(feature = "nats")]
use crate::nats_support;
use crate::remote;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{PersistenceId, SqliteJournal};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, DeadLetterReason, DeliveryHandler, DeliveryInfo,
    ProducerHandle, ProducerOptions, ReliableDelivery, TraceContext,
};
use common::{dead_letter_log, Log};
use remote::{listening_node, sending_node, wait_until};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// A span as recorded: its name and its fields (as text) so far.
#[derive(Clone, Debug)]
struct Recorded {
    name: &'static str,
    fields: HashMap<&'static str, String>,
    parent: Option<u64>,
}

impl Recorded {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

impl Visit for Recorded {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.insert(field.name(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.fields.insert(field.name(), format!("{value:?}"));
    }
}

/// Every span of the process, by id.
type Spans = Arc<Mutex<HashMap<u64, Recorded>>>;

struct Recorder(Spans);

impl<S> Layer<S> for Recorder
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut span = Recorded {
            name: attrs.metadata().name(),
            fields: HashMap::new(),
            parent: ctx
                .span(id)
                .and_then(|s| s.parent())
                .map(|p| p.id().into_u64()),
        };
        attrs.record(&mut span);
        self.0.lock().unwrap().insert(id.into_u64(), span);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(span) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(span);
        }
    }
}

/// The process's recorded spans (installs the recorder on first use).
fn spans() -> Spans {
    static SPANS: OnceLock<Spans> = OnceLock::new();
    SPANS
        .get_or_init(|| {
            let spans = Spans::default();
            let subscriber = tracing_subscriber::registry().with(Recorder(spans.clone()));
            tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
            spans
        })
        .clone()
}

/// The recorded spans named `name` whose field `key` is `value`.
fn spans_where(name: &str, key: &str, value: &str) -> Vec<Recorded> {
    let spans = spans();
    let spans = spans.lock().unwrap();
    spans
        .values()
        .filter(|s| s.name == name && s.field(key) == Some(value))
        .cloned()
        .collect()
}

fn context(n: u8) -> TraceContext {
    TraceContext::new([n; 16], [n.wrapping_add(1); 8], TraceContext::SAMPLED).unwrap()
}

/// A hook that puts even messages (by the counter it keeps) in trace `context(n)`, odd ones in
/// none: the first call is message 1.
fn every_other_traced() -> impl Fn() -> Option<TraceContext> + Send + Sync + 'static {
    let calls = std::sync::atomic::AtomicU8::new(0);
    move || {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        n.is_multiple_of(2).then(|| context(n))
    }
}

/// A consumer named `name` recording each body with the trace context its handler saw.
fn tracing_consumer(name: &str) -> (ConsumerHandle<u8>, Log<(u8, Option<TraceContext>)>) {
    let seen = Log::default();
    let log = seen.clone();
    let handler = DeliveryHandler::from_fn_with_info(move |info: DeliveryInfo, body: u8| {
        log.push((body, info.trace_context));
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler)
        .name(name)
        .build()
        .unwrap();
    (ReliableDelivery::consumer(options), seen)
}

fn traced_producer(to: impl Into<ConsumerRef<u8>>, id: &str) -> ProducerHandle<u8> {
    let options = ProducerOptions::builder(to)
        .producer_id(id)
        .resend_timeout(Duration::from_millis(200))
        .trace_context(every_other_traced())
        .build()
        .unwrap();
    ReliableDelivery::producer(options)
}

/// Sends 1..=n, tell and send alternating, and waits for every handler run.
async fn send_and_check(producer: &ProducerHandle<u8>, seen: &Log<(u8, Option<TraceContext>)>) {
    const N: u8 = 6;
    for n in 1..=N {
        if n.is_multiple_of(3) {
            producer.send(n).await.unwrap();
        } else {
            producer.tell(n, |_| {}).unwrap();
        }
    }
    assert!(wait_until(Duration::from_secs(10), || seen.len() >= N as usize).await);
    let mut runs = seen.snapshot();
    runs.sort_by_key(|(body, _)| *body);
    runs.dedup_by_key(|(body, _)| *body);
    let expected: Vec<_> = (1..=N)
        .map(|n| (n, n.is_multiple_of(2).then(|| context(n))))
        .collect();
    assert_eq!(
        runs, expected,
        "each context arrives unchanged, absence stays absent"
    );
}

fn check_handler_spans(consumer: &str, producer_id: &str) {
    let handler_spans = spans_where("handler", "consumer", consumer);
    for seq in 1..=6u8 {
        let span = handler_spans
            .iter()
            .find(|s| s.field("seq") == Some(&seq.to_string()))
            .unwrap_or_else(|| panic!("no handler span for seq {seq}: {handler_spans:?}"));
        assert_eq!(span.field("producer_id"), Some(producer_id));
        let traceparent = seq.is_multiple_of(2).then(|| context(seq).to_traceparent());
        assert_eq!(
            span.field("traceparent"),
            traceparent.as_deref(),
            "{span:?}"
        );
    }
}

#[actix::test]
async fn in_process_the_context_reaches_the_handler_and_its_span_names_consumer_producer_and_seq() {
    spans();
    let (consumer, seen) = tracing_consumer("in-process");
    let producer = traced_producer(&consumer, "p-in-process");
    send_and_check(&producer, &seen).await;
    check_handler_spans("in-process", "p-in-process");
}

#[actix::test]
async fn over_tcp_the_context_arrives_unchanged_and_connection_and_handshake_spans_name_the_peer() {
    spans();
    let server = listening_node().await;
    let (consumer, seen) = tracing_consumer("over-tcp");
    server.expose("traced", &consumer).unwrap();
    let client = sending_node().await;
    let addr = server.local_addr().unwrap();
    let remote = client.consumer_ref::<u8>(addr, "traced").unwrap();
    let producer = traced_producer(remote, "p-over-tcp");
    send_and_check(&producer, &seen).await;
    check_handler_spans("over-tcp", "p-over-tcp");

    let outbound = spans_where("tcp.connection", "peer_addr", &addr.to_string());
    let outbound: Vec<_> = outbound
        .iter()
        .filter(|s| s.field("direction") == Some("outbound"))
        .collect();
    assert_eq!(outbound.len(), 1, "{outbound:?}");
    assert_eq!(
        outbound[0].field("peer_node"),
        Some(server.id().to_string().as_str())
    );
    let inbound = spans_where("tcp.connection", "peer_node", &client.id().to_string());
    assert_eq!(inbound.len(), 1, "{inbound:?}");
    assert_eq!(inbound[0].field("direction"), Some("inbound"));
    // Each connection's handshake is a span inside it, and it was established.
    let recorded = spans();
    let recorded = recorded.lock().unwrap();
    for connection in [outbound[0], &inbound[0]] {
        let id = recorded
            .iter()
            .find(|(_, s)| s.name == "tcp.connection" && s.fields == connection.fields)
            .map(|(id, _)| *id)
            .unwrap();
        let handshake = recorded
            .values()
            .find(|s| s.name == "tcp.handshake" && s.parent == Some(id))
            .unwrap_or_else(|| panic!("no handshake in {connection:?}"));
        assert_eq!(handshake.field("outcome"), Some("established"));
    }
}

/// A context with an all-zero id (which no producer of the crate makes) read from a peer's
/// bytes: the delivery is a dead letter naming it, the other messages are handled.
#[actix::test]
async fn an_all_zero_trace_context_from_a_peer_is_a_dead_letter() {
    let zero: TraceContext = serde_json::from_str(
        r#"{"trace_id":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"span_id":[1,1,1,1,1,1,1,1],"flags":1}"#,
    )
    .unwrap();
    assert!(!zero.is_valid());
    let server = listening_node().await;
    let (sink, dead) = dead_letter_log();
    let seen = Log::default();
    let log = seen.clone();
    let handler = DeliveryHandler::from_fn(move |body: u8| {
        log.push(body);
        async { Ok::<(), String>(()) }
    });
    let options = ConsumerOptions::builder(handler)
        .dead_letters(sink)
        .build()
        .unwrap();
    let consumer = ReliableDelivery::consumer(options);
    server.expose("zero", &consumer).unwrap();
    let client = sending_node().await;
    let remote = client
        .consumer_ref::<u8>(server.local_addr().unwrap(), "zero")
        .unwrap();
    let calls = std::sync::atomic::AtomicU8::new(0);
    let options = ProducerOptions::builder(remote)
        .resend_timeout(Duration::from_millis(200))
        .max_attempts(2)
        .trace_context(move || {
            (calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1).then(|| zero.clone())
        })
        .build()
        .unwrap();
    let producer = ReliableDelivery::producer(options);
    for n in 1..=3 {
        producer.tell(n, |_| {}).unwrap();
    }
    assert!(
        wait_until(Duration::from_secs(10), || dead.len() >= 1
            && seen.len() >= 2)
        .await
    );
    assert_eq!(
        dead.snapshot()[0].reason,
        DeadLetterReason::InvalidTraceContext
    );
    assert_eq!(dead.snapshot()[0].seq, 2);
    let mut handled = seen.snapshot();
    handled.dedup();
    assert_eq!(handled, [1, 3]);
}

#[actix::test]
async fn a_durable_producer_over_sqlite_has_commit_and_recovery_spans_and_recovered_messages_no_context(
) {
    spans();
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(SqliteJournal::open(dir.path().join("j.db")).await.unwrap());
    let stream = "traced-durable-stream";
    let (consumer, seen) = tracing_consumer("durable");
    // First life: the consumer is cut off, so the stored messages stay unsettled.
    let start = |to: ConsumerRef<u8>| {
        let options = ProducerOptions::builder(to)
            .resend_timeout(Duration::from_millis(100))
            .trace_context(|| Some(context(9)))
            .build()
            .unwrap();
        let durable = DurableOptions::new(
            journal.clone(),
            PersistenceId::new(stream).unwrap(),
            "p-durable",
        );
        ReliableDelivery::durable_producer(options, durable).unwrap()
    };
    let nowhere = ConsumerRef::from_fn(|_| {});
    let producer = start(nowhere);
    for n in 1..=2 {
        producer.store(n).await.unwrap();
    }
    producer.stop();
    producer.stopped().await.unwrap();
    let commits = spans_where("journal.commit", "stream", stream);
    assert!(!commits.is_empty());
    assert!(commits.iter().all(|s| s.field("journal") == Some("sqlite")));
    assert!(
        commits.iter().any(|s| s.field("events") == Some("1")),
        "{commits:?}"
    );

    // Second life: it recovers, resends both, and they arrive without a context.
    let producer = start(consumer.consumer_ref());
    assert!(wait_until(Duration::from_secs(10), || seen.len() >= 2).await);
    let mut runs = seen.snapshot();
    runs.dedup();
    assert_eq!(runs, [(1, None), (2, None)]);
    producer.stop();
    producer.stopped().await.unwrap();
    let recoveries = spans_where("recovery", "persistence_id", stream);
    let of = |kind: &str| -> Vec<&Recorded> {
        recoveries
            .iter()
            .filter(|s| s.field("kind") == Some(kind))
            .collect()
    };
    let durable = of("durable_producer");
    assert_eq!(durable.len(), 2, "{recoveries:?}");
    assert!(
        durable.iter().any(|s| s.field("resumed") == Some("2")),
        "{durable:?}"
    );
    let entity = of("persistent_entity");
    assert_eq!(entity.len(), 2, "{recoveries:?}");
    assert!(
        entity
            .iter()
            .any(|s| s.field("events").is_some_and(|n| n != "0")),
        "the second life replays the first one's events: {entity:?}"
    );
}

#[cfg(feature = "nats")]
#[actix::test]
async fn over_nats_the_context_arrives_unchanged_and_the_subscription_has_a_span() {
    spans();
    let subject = nats_support::unique("traced");
    let (server, client) = (nats_support::carrier().await, nats_support::carrier().await);
    let (consumer, seen) = tracing_consumer("over-nats");
    server.expose(&subject, &consumer).await.unwrap();
    let producer = traced_producer(client.consumer_ref::<u8>(&subject).unwrap(), "p-over-nats");
    send_and_check(&producer, &seen).await;
    check_handler_spans("over-nats", "p-over-nats");
    assert_eq!(
        spans_where("nats.subscription", "subject", &subject).len(),
        1
    );
}
