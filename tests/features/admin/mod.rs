//! The admin console (feature `admin`) over real parts: a durable producer whose consumer
//! never confirms, a consumer stuck in its handler, a pool without workers, a projection
//! stopped on a poison event, an entity host, a shard coordinator (memory leases here,
//! PostgreSQL leases below), TCP nodes, a NATS carrier, and dead letters with a replay route
//! into an effectively-once entity. Every endpoint, the bearer guard, the confirmation
//! tokens, bad input and the page's escaping; `browser.rs` drives the page in Chromium.

mod browser;

use std::sync::Arc;
use std::time::Duration;

use actix_delivery::admin::Console;
use actix_delivery::codec::{Codec, Manifest};
use actix_delivery::dead_letters::{
    DeadLetterCause, DeadLetterLimits, DeadLetters, MemoryDeadLetters, NewDeadLetter, Replay,
    Replayed, SourceKind,
};
use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{Journal, MemoryJournal, PersistenceId, Tag, TagQuery};
use actix_delivery::persistence::{
    Decision, EventSourced, Outcome, PersistentHandle, PersistentOptions,
};
use actix_delivery::projection::{
    Envelope, MemoryOffsetStore, Projection, ProjectionHandle, ProjectionOptions,
};
use actix_delivery::sharding::{
    CoordinatorOptions, EntityHostHandle, EntityHostOptions, EntityId, LeaseStore,
    MemoryLeaseStore, NoTransport, ShardCoordinatorHandle,
};
use actix_delivery::work_pulling::{WorkPullingOptions, WorkerRegistry};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, DeliveryHandler, ProducerHandle, ProducerOptions,
    ReliableDelivery,
};
use actix_web::body::MessageBody;
use actix_web::dev::ServiceResponse;
use actix_web::http::StatusCode;
use actix_web::{test, App};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::common::entities::{ledger_id, Ledger, Op};

/// What a peer might send: markup in a dead letter's error and body.
pub const SCRIPT_ERROR: &str = "<script>window.injected = 1</script> refused";
const SCRIPT_BODY: &str = "</code><script>window.injected = 2</script>";

/// Notes, each filed under the tag `notes`: a projection of them stops at note 13.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Notes(Vec<u64>);

#[derive(Debug, Serialize, Deserialize)]
pub struct Noted(u64);

impl EventSourced for Notes {
    type Command = u64;
    type Event = Noted;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, note: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Noted(*note)], ()))
    }

    fn apply(&mut self, Noted(note): &Noted) {
        self.0.push(*note);
    }

    fn tags(_: &Noted) -> Vec<Tag> {
        vec![Tag::from_static("notes")]
    }
}

/// The parts the console is given, kept alive for the test.
pub struct World {
    pub console: Console,
    pub dead_letters: DeadLetters,
    /// The effectively-once destination of the `jobs` dead letters.
    pub ledger: PersistentHandle<Ledger>,
    /// A given-up job (MessagePack 13), its error holding markup: replayable.
    pub job: u64,
    /// A given-up job whose body the route no longer reads (a string, read as `u64`).
    pub unread: u64,
    /// An undecodable delivery of the stuck consumer, in bincode (shown in hex).
    pub refused: u64,
    pub durable: ProducerHandle<u64>,
    pub stuck: ConsumerHandle<u64>,
    pub coordinator: ShardCoordinatorHandle<Ledger>,
    pub projection: ProjectionHandle,
    _parts: Vec<Box<dyn std::any::Any>>,
}

fn letter(
    kind: SourceKind,
    source: &str,
    cause: DeadLetterCause,
    key: &str,
    manifest: Manifest,
    body: Vec<u8>,
    error: &str,
) -> NewDeadLetter {
    NewDeadLetter {
        kind,
        source: source.into(),
        cause,
        key: key.into(),
        origin: None,
        manifest,
        body_len: body.len() as u64,
        body: Some(body),
        attempts: 3,
        error: error.into(),
    }
}

/// The `jobs` letter of job 13 (its key `job-13`): keeping it again updates the entry.
pub fn job_13() -> NewDeadLetter {
    letter(
        SourceKind::WorkPulling,
        "jobs",
        DeadLetterCause::GivenUp,
        "job-13",
        Manifest::new(Codec::MessagePack, "u64", 1),
        Codec::MessagePack.encode(&13u64, 64).unwrap(),
        SCRIPT_ERROR,
    )
}

/// Waits (real time) until `done`, at most 10 s.
pub async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 10 s"
        );
        actix::clock::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts every part on the current arbiter (real time) and registers it with a console.
pub async fn world() -> World {
    let journal = Arc::new(MemoryJournal::new());
    let shared: Arc<dyn Journal> = journal.clone();
    let console = Console::new();
    let mut parts: Vec<Box<dyn std::any::Any>> = Vec::new();

    // Dead letters, replayed into an effectively-once ledger.
    let dead_letters =
        DeadLetters::new(MemoryDeadLetters::new(DeadLetterLimits::default()).unwrap());
    let ledger =
        PersistentHandle::<Ledger>::start(PersistentOptions::new(shared.clone(), ledger_id()))
            .unwrap();
    let route = ledger.clone();
    dead_letters.on_replay("jobs", move |replay: Replay<u64>| {
        let answer = route.ask_delivered(replay.info, Op::Apply(replay.body));
        async move {
            match answer.await {
                Ok(Outcome::Done(_)) => Ok(Replayed::Applied),
                Ok(Outcome::AlreadyProcessed) => Ok(Replayed::AlreadyApplied),
                Err(error) => Err(error.to_string().into()),
            }
        }
    });
    let job = dead_letters.keep(job_13()).await.unwrap().id;
    let unread = dead_letters
        .keep(letter(
            SourceKind::WorkPulling,
            "jobs",
            DeadLetterCause::GivenUp,
            "job-14",
            Manifest::new(Codec::MessagePack, "OldJob", 1),
            Codec::MessagePack.encode(SCRIPT_BODY, 256).unwrap(),
            "no worker confirmed it",
        ))
        .await
        .unwrap()
        .id;
    let refused = dead_letters
        .keep(letter(
            SourceKind::Consumer,
            "stuck",
            DeadLetterCause::Undecodable,
            "p/1/7",
            Manifest::new(Codec::Bincode, "u64", 1),
            vec![0xde, 0xad],
            "the body does not decode as the consumer's message type",
        ))
        .await
        .unwrap()
        .id;
    console.dead_letters(&dead_letters);

    // A durable producer whose consumer never confirms: 3 messages stored, unconfirmed.
    let lost: ConsumerRef<u64> = ConsumerRef::from_fn(|_deliveries| {});
    let durable = ReliableDelivery::durable_producer(
        ProducerOptions::builder(lost)
            .resend_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
        DurableOptions::new(
            shared.clone(),
            PersistenceId::new("orders-out").unwrap(),
            "orders",
        ),
    )
    .unwrap();
    for order in 1..=3u64 {
        durable.store(order).await.unwrap();
    }
    console.producer("orders", &durable);

    // A consumer stuck in its handler: the first message never ends, the others wait.
    let stuck = ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(|_: u64| async {
            std::future::pending::<Result<(), String>>().await
        }))
        .build()
        .unwrap(),
    );
    let to_stuck = ReliableDelivery::producer(ProducerOptions::builder(&stuck).build().unwrap());
    for n in 1..=3u64 {
        to_stuck.tell(n, |_| {}).unwrap();
    }
    console
        .consumer("stuck", &stuck)
        .producer("to-stuck", &to_stuck);
    parts.push(Box::new(to_stuck));

    // A pool without workers, holding one job.
    let registry = WorkerRegistry::<u64>::new();
    let pool = ReliableDelivery::work_pulling_producer(
        WorkPullingOptions::builder(&registry).build().unwrap(),
    );
    pool.tell(1, |_| {}).unwrap();
    console.work_pulling("pool", &pool);
    parts.push(Box::new((registry, pool)));

    // A projection stopped on note 13, with 13 and 14 behind it.
    let notes = PersistentHandle::<Notes>::start(PersistentOptions::new(
        shared.clone(),
        PersistenceId::new("notes-1").unwrap(),
    ))
    .unwrap();
    for note in [12, 13, 14] {
        notes.ask(note).await.unwrap();
    }
    let options = ProjectionOptions::builder("notes", Tag::from_static("notes"))
        .max_retries(0)
        .poll_interval(Duration::from_millis(10))
        .build()
        .unwrap();
    let projection = Projection::of::<Notes>(shared.clone(), options).at_least_once(
        MemoryOffsetStore::new(),
        |events: &[Envelope<Noted>]| {
            let poison = events.iter().any(|envelope| envelope.event.0 == 13);
            Box::pin(async move {
                match poison {
                    true => Err("note 13 breaks the read model".into()),
                    false => Ok(()),
                }
            })
        },
    );
    assert!(projection.stopped().await.is_err(), "stopped on note 13");
    console.projection_with_lag(
        "notes",
        &projection,
        shared.clone(),
        TagQuery::new(Tag::from_static("notes")),
    );
    parts.push(Box::new(notes));

    // An entity host with one entity running.
    let host = EntityHostHandle::<Ledger>::start(
        shared.clone(),
        EntityHostOptions::builder("hosted").build().unwrap(),
    )
    .unwrap();
    host.ask(EntityId::new("e1").unwrap(), Op::Apply(1))
        .await
        .unwrap();
    console.entity_host("hosted", &host);
    parts.push(Box::new(host));

    // A shard coordinator over memory leases, owning every shard.
    let leases = MemoryLeaseStore::new();
    let coordinator = ShardCoordinatorHandle::<Ledger>::start(
        shared.clone(),
        EntityHostOptions::builder("sharded")
            .shards(4)
            .build()
            .unwrap(),
        Arc::new(leases.clone()),
        CoordinatorOptions::builder("node-a")
            .lease_ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_millis(200))
            .build()
            .unwrap(),
        |_| NoTransport,
    )
    .unwrap();
    console.coordinator("sharded", &coordinator, Arc::new(leases));
    let owner = coordinator.clone();
    until("the coordinator owns its 4 shards", async || {
        owner.stats().await.unwrap().shards_owned == 4
    })
    .await;

    // Two TCP nodes, one dialled by the other.
    let listening = crate::remote::listening_node().await;
    let sending = crate::remote::sending_node().await;
    sending
        .dial(listening.local_addr().unwrap())
        .await
        .expect("connected");
    console
        .node("sender", &sending)
        .node("listener", &listening);
    parts.push(Box::new((listening, sending)));

    #[cfg(feature = "nats")]
    {
        let carrier = crate::nats_support::carrier().await;
        console.nats("carrier", &carrier);
        parts.push(Box::new(carrier));
    }

    World {
        console,
        dead_letters,
        ledger,
        job,
        unread,
        refused,
        durable,
        stuck,
        coordinator,
        projection,
        _parts: parts,
    }
}

/// GET `$uri` of `$app`: its status and JSON body.
macro_rules! get {
    ($app:expr, $uri:expr) => {
        status_and_json(
            test::call_service($app, test::TestRequest::get().uri(&$uri).to_request()).await,
        )
        .await
    };
}

/// POST `$body` as JSON to `$uri` of `$app`: its status and JSON body.
macro_rules! post {
    ($app:expr, $uri:expr, $body:expr $(,)?) => {
        status_and_json(
            test::call_service(
                $app,
                test::TestRequest::post()
                    .uri(&$uri)
                    .set_json($body)
                    .to_request(),
            )
            .await,
        )
        .await
    };
}

/// A response's status and JSON body.
pub async fn status_and_json<B: MessageBody>(response: ServiceResponse<B>) -> (StatusCode, Value) {
    let status = response.status();
    (status, json_of(test::read_body(response).await))
}

fn json_of(body: actix_web::web::Bytes) -> Value {
    serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&body)))
}

/// The part named `name` in a section's views.
fn part<'a>(views: &'a Value, name: &str) -> &'a Value {
    views
        .as_array()
        .expect("a list of parts")
        .iter()
        .find(|view| view["name"] == name)
        .unwrap_or_else(|| panic!("no part `{name}` in {views}"))
}

/// Asserts an error's body: its message holds `says`, its field, nothing happened.
fn refused(body: &Value, field: Option<&str>, says: &str) {
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|error| error.contains(says)),
        "{body}"
    );
    assert_eq!(body.get("field").and_then(Value::as_str), field, "{body}");
    assert_eq!(body["happened"], "certainly_not", "{body}");
}

#[actix::test]
async fn every_section_shows_its_parts_as_they_are() {
    let world = world().await;
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;

    let (status, producers) = get!(&app, "/admin/producers");
    assert_eq!(status, StatusCode::OK);
    let orders = part(&producers, "orders");
    assert_eq!(
        (
            &orders["durable"],
            &orders["unconfirmed"],
            &orders["in_doubt"]
        ),
        (&json!(true), &json!(3), &json!(0)),
        "{orders}"
    );
    assert!(orders["oldest_unconfirmed_ms"].is_u64(), "{orders}");
    assert_eq!(orders["producer_id"], "orders");
    let to_stuck = part(&producers, "to-stuck");
    assert_eq!(
        (
            &to_stuck["durable"],
            &to_stuck["in_flight"],
            &to_stuck["confirmed"]
        ),
        (&json!(false), &json!(3), &json!(0)),
        "{to_stuck}"
    );

    let (_, consumers) = get!(&app, "/admin/consumers");
    let stuck = part(&consumers, "stuck");
    assert_eq!(
        (
            &stuck["tracked_producers"],
            &stuck["waiting"],
            &stuck["delivered"]
        ),
        (&json!(1), &json!(2), &json!(0)),
        "{stuck}"
    );
    assert_eq!(
        stuck["dead_letters"]["by_cause"],
        json!({ "undecodable": 1 })
    );

    let (_, pools) = get!(&app, "/admin/work-pulling");
    let pool = part(&pools, "pool");
    assert_eq!((&pool["workers"], &pool["jobs"]), (&json!(0), &json!(1)));

    let (_, projections) = get!(&app, "/admin/projections");
    let notes = part(&projections, "notes");
    assert_eq!(
        (&notes["state"], &notes["running"], &notes["lag_events"]),
        (&json!("failed"), &json!(false), &json!(2)),
        "{notes}"
    );
    let error = notes["last_error"].as_str().unwrap();
    assert!(
        error.contains("notes-1") && error.contains("note 13 breaks"),
        "{error}"
    );
    assert!(notes["lag_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(
        notes["offset"],
        world.projection.stats().offset.to_string(),
        "the stored offset, before note 13"
    );

    let (_, hosts) = get!(&app, "/admin/entity-hosts");
    let hosted = part(&hosts, "hosted");
    assert_eq!(
        (&hosted["entity_type"], &hosted["active"]),
        (&json!("hosted"), &json!(1))
    );
    assert_eq!(part(&hosts, "sharded")["entity_type"], "sharded");

    let (_, coordinators) = get!(&app, "/admin/coordinators");
    let sharded = part(&coordinators, "sharded");
    assert_eq!(sharded["member"], world.coordinator.member());
    assert_eq!(sharded["shards_owned"], 4);

    let (_, maps) = get!(&app, "/admin/shard-maps");
    let map = part(&maps, "sharded");
    let leases = map["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 4, "{map}");
    for lease in leases {
        assert_eq!(lease["owner"], world.coordinator.member(), "{lease}");
        assert_eq!(lease["live"], true, "{lease}");
        assert!(lease["token"].as_u64().unwrap() >= 1, "{lease}");
        let left = lease["expires_in_ms"].as_i64().unwrap();
        assert!(left > 0 && left <= 3000, "{lease}");
    }
    assert_eq!(map["members"].as_array().unwrap().len(), 1);
    assert_eq!(map["without_live_lease"], json!([]));

    let (_, nodes) = get!(&app, "/admin/nodes");
    let sender = part(&nodes, "sender");
    let peers = sender["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "{sender}");
    assert_eq!(peers[0]["connected"], true, "{sender}");
    assert_eq!(
        peers[0]["node_id"],
        part(&nodes, "listener")["node_id"],
        "the peer is the listener"
    );
    assert!(sender["connections_open"].as_u64().unwrap() >= 1);
    assert_eq!(sender["refusals"]["handshake_failures"], 0);
    assert!(part(&nodes, "listener")["listening"].is_string());

    #[cfg(feature = "nats")]
    {
        let (_, carriers) = get!(&app, "/admin/carriers");
        let carrier = part(&carriers, "carrier");
        assert_eq!(carrier["connection"], "connected", "{carrier}");
    }
    let _ = (&world.stuck, &world.durable);
}

/// A durable producer's view, in virtual time: the oldest unconfirmed message's age counts
/// from its store (not from the last one's), a store whose commit was reported failed is
/// shown in doubt until the stream's supervised reopening settles it, and the ages of what was
/// stored before the restart go on.
#[actix::test]
async fn a_durable_streams_oldest_age_counts_from_its_store_and_writes_in_doubt_are_shown() {
    use crate::common::journals::{Fault, Faulty};
    tokio::time::pause();
    let journal = Faulty::new(MemoryJournal::new());
    let lost: ConsumerRef<u64> = ConsumerRef::from_fn(|_deliveries| {});
    let producer = ReliableDelivery::durable_producer(
        ProducerOptions::builder(lost)
            .resend_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
        DurableOptions::new(
            Arc::new(journal.clone()),
            PersistenceId::new("aged").unwrap(),
            "aged",
        ),
    )
    .unwrap();
    let console = Console::new();
    console.producer("aged", &producer);
    let app = test::init_service(App::new().service(console.scope("/admin"))).await;
    let (_, producers) = get!(&app, "/admin/producers");
    let view = part(&producers, "aged");
    assert_eq!(
        (&view["unconfirmed"], &view["oldest_unconfirmed_ms"]),
        (&json!(0), &Value::Null),
        "{view}"
    );

    producer.store(1).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    producer.store(2).await.unwrap();
    let (_, producers) = get!(&app, "/admin/producers");
    let view = part(&producers, "aged");
    assert_eq!(view["unconfirmed"], 2);
    let oldest = view["oldest_unconfirmed_ms"].as_u64().unwrap();
    assert!(
        (5000..5100).contains(&oldest),
        "from the first store: {view}"
    );

    // The next store commits, and the journal reports it failed: in doubt.
    journal.arm(Fault::AfterCommit);
    producer.tell(3, |_| {}).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(journal.injected(Fault::AfterCommit), 1);
    let (_, producers) = get!(&app, "/admin/producers");
    let view = part(&producers, "aged");
    assert_eq!(
        view["in_doubt"], 1,
        "until the stream is opened again: {view}"
    );

    // The supervised restart reads the journal: stored after all.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, producers) = get!(&app, "/admin/producers");
    let view = part(&producers, "aged");
    assert_eq!(
        (&view["in_doubt"], &view["unconfirmed"]),
        (&json!(0), &json!(3)),
        "{view}"
    );
    let oldest = view["oldest_unconfirmed_ms"].as_u64().unwrap();
    assert!(oldest >= 6000, "still from the first store: {view}");
}

/// A shard map read from a lease store alone: a lease past its expiry is shown with the time
/// since (negative), not live, and its owner gone from the members.
#[actix::test]
async fn a_shard_map_shows_an_expired_lease_as_not_live() {
    use actix_delivery::sharding::{Member, ShardId};
    tokio::time::pause();
    let leases = MemoryLeaseStore::new();
    let ttl = Duration::from_secs(1);
    let member = Member {
        id: "gone#1".into(),
        address: Some("gone:1".into()),
    };
    leases.heartbeat("orders", &member, ttl).await.unwrap();
    leases
        .acquire("orders", &[ShardId(0), ShardId(1)], "gone#1", ttl)
        .await
        .unwrap();
    let console = Console::new();
    console.shard_map("orders", Arc::new(leases.clone()), "orders");
    let app = test::init_service(App::new().service(console.scope("/admin"))).await;
    let (_, maps) = get!(&app, "/admin/shard-maps");
    let map = part(&maps, "orders");
    assert_eq!(map["leases"][0]["live"], true, "{map}");
    assert_eq!(map["leases"][0]["address"], "gone:1", "{map}");
    assert_eq!(map["leases"][0]["expires_in_ms"], 1000, "{map}");

    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (_, maps) = get!(&app, "/admin/shard-maps");
    let map = part(&maps, "orders");
    for (shard, lease) in map["leases"].as_array().unwrap().iter().enumerate() {
        assert_eq!(
            (
                &lease["shard"],
                &lease["owner"],
                &lease["token"],
                &lease["live"]
            ),
            (&json!(shard), &json!("gone#1"), &json!(1), &json!(false)),
            "{map}"
        );
        let left = lease["expires_in_ms"].as_i64().unwrap();
        assert!((-1600..=-1500).contains(&left), "expired 1.5 s ago: {map}");
    }
    assert_eq!(map["members"], json!([]), "{map}");
    assert_eq!(
        map["without_live_lease"],
        Value::Null,
        "no shard count: {map}"
    );
}

#[actix::test]
async fn the_overview_names_the_stuck_stream_the_stalled_consumer_and_the_failed_projection() {
    let world = world().await;
    world.console.stuck_after(Duration::from_millis(50));
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    // The first look notes what waits; the second, later, sees it has not moved.
    let _ = get!(&app, "/admin/overview");
    actix::clock::sleep(Duration::from_millis(100)).await;
    let (status, overview) = get!(&app, "/admin/overview");
    assert_eq!(status, StatusCode::OK);
    let attention = overview["attention"].as_array().unwrap();
    let says = |section: &str, name: &str, what: &str| {
        attention.iter().any(|item| {
            item["section"] == section
                && item["name"] == name
                && item["what"].as_str().unwrap().contains(what)
        })
    };
    assert!(
        says("producers", "orders", "durable stream stuck: 3 unconfirmed"),
        "{overview:#}"
    );
    assert!(
        says("consumers", "stuck", "stalled: 2 waiting"),
        "{overview:#}"
    );
    assert!(
        says("producers", "to-stuck", "stalled: 3 in flight"),
        "{overview:#}"
    );
    assert!(
        says("work_pulling", "pool", "no worker: 1 jobs"),
        "{overview:#}"
    );
    assert!(
        says("projections", "notes", "failed: projection `notes` stopped"),
        "{overview:#}"
    );
    assert!(
        !says("producers", "orders", "stalled"),
        "a durable stream is named stuck once: {overview:#}"
    );
    assert!(
        says("dead_letters", "dead letters", "3 kept"),
        "{overview:#}"
    );
    assert!(
        !attention.iter().any(|item| item["section"] == "shard_maps"),
        "every shard has a live lease: {overview:#}"
    );
    assert_eq!(overview["parts"]["producers"], 2);
    assert_eq!(overview["dead_letters"]["entries"], 3);
}

#[actix::test]
async fn dead_letters_are_listed_by_filter_and_shown_with_their_body() {
    let world = world().await;
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let ids = |list: &Value| -> Vec<u64> {
        let entries = list["entries"].as_array().unwrap();
        entries.iter().map(|e| e["id"].as_u64().unwrap()).collect()
    };
    let (status, all) = get!(&app, "/admin/dead-letters");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ids(&all), [world.job, world.unread, world.refused]);
    assert_eq!(
        all["counts"]["by_cause"],
        json!({"given_up": 2, "undecodable": 1})
    );
    assert_eq!(all["next"], Value::Null);
    let (_, jobs) = get!(&app, "/admin/dead-letters?source=jobs&limit=1");
    assert_eq!(ids(&jobs), [world.job]);
    assert_eq!(jobs["next"], world.job, "the next page starts after it");
    let (_, next) = get!(
        &app,
        &format!("/admin/dead-letters?source=jobs&after_id={}", world.job)
    );
    assert_eq!(ids(&next), [world.unread]);
    let (_, undecodable) = get!(&app, "/admin/dead-letters?cause=undecodable&kind=consumer");
    assert_eq!(ids(&undecodable), [world.refused]);

    let (status, job) = get!(&app, &format!("/admin/dead-letters/{}", world.job));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["body"], 13, "MessagePack, decoded: {job}");
    assert_eq!(
        (&job["source"], &job["cause"], &job["key"], &job["error"]),
        (
            &json!("jobs"),
            &json!("given_up"),
            &json!("job-13"),
            &json!(SCRIPT_ERROR)
        )
    );
    assert_eq!(
        job["manifest"],
        json!({"codec": "msgpack", "type": "u64", "version": 1})
    );
    for action in ["replay", "delete"] {
        assert_eq!(job["confirm"][action].as_str().unwrap().len(), 64, "{job}");
    }
    let (_, refused) = get!(&app, &format!("/admin/dead-letters/{}", world.refused));
    assert_eq!(refused["body_hex"], "dead", "bincode, in hex: {refused}");
    assert!(refused["body_not_json"]
        .as_str()
        .unwrap()
        .contains("bincode"));
    assert_eq!(refused["body"], Value::Null);
}

#[actix::test]
async fn a_replay_with_its_token_applies_the_entry_once_and_removes_it() {
    let world = world().await;
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let uri = format!("/admin/dead-letters/{}", world.job);
    let (_, shown) = get!(&app, &uri);
    let token = shown["confirm"]["replay"].clone();

    let (status, replayed) = post!(&app, &format!("{uri}/replay"), json!({ "confirm": token }));
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_eq!(replayed, json!({ "id": world.job, "replayed": "applied" }));
    assert_eq!(world.ledger.ask(Op::Total).await.unwrap(), 1, "applied");
    assert!(world.dead_letters.get(world.job).await.is_err(), "removed");

    // The same POST again (a double click, a replayed request) finds nothing to do.
    let (status, again) = post!(&app, &format!("{uri}/replay"), json!({ "confirm": token }));
    assert_eq!(status, StatusCode::NOT_FOUND);
    refused(&again, Some("id"), "no dead letter");
    let (status, _) = get!(&app, &uri);
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        world.ledger.ask(Op::Total).await.unwrap(),
        1,
        "applied once"
    );

    // A delete with its own token.
    let uri = format!("/admin/dead-letters/{}", world.refused);
    let (_, shown) = get!(&app, &uri);
    let (status, deleted) = post!(
        &app,
        &format!("{uri}/delete"),
        json!({ "confirm": shown["confirm"]["delete"] }),
    );
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted["deleted"], true);
    assert_eq!(world.dead_letters.counts().await.unwrap().entries, 1);
}

#[actix::test]
async fn writes_without_the_entrys_current_token_change_nothing() {
    let world = world().await;
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let uri = format!("/admin/dead-letters/{}", world.job);
    let (_, job) = get!(&app, &uri);
    let (_, other) = get!(&app, &format!("/admin/dead-letters/{}", world.refused));
    let replay = format!("{uri}/replay");

    let (status, body) = post!(&app, &replay, json!({}));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    refused(&body, Some("confirm"), "needs the confirmation token");
    let request = test::TestRequest::post().uri(&replay).to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST, "no body at all");
    for (token, why) in [
        (&job["confirm"]["delete"], "the delete's token"),
        (&other["confirm"]["replay"], "another entry's token"),
        (&json!("00".repeat(32)), "a forged token"),
        (&json!("not hex"), "not a token"),
    ] {
        let (status, body) = post!(&app, &replay, json!({ "confirm": token }));
        assert_eq!(status, StatusCode::CONFLICT, "{why}: {body}");
        refused(&body, Some("confirm"), "does not confirm a replay");
    }
    // A later letter of the same source and key updates the entry: the token shown before no
    // longer confirms it.
    actix::clock::sleep(Duration::from_millis(5)).await;
    world.dead_letters.keep(job_13()).await.unwrap();
    let (status, body) = post!(
        &app,
        &replay,
        json!({ "confirm": job["confirm"]["replay"] })
    );
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        world.ledger.ask(Op::Total).await.unwrap(),
        0,
        "nothing applied"
    );
    assert_eq!(
        world.dead_letters.counts().await.unwrap().entries,
        3,
        "nothing removed"
    );

    // The page's form, without script: the current token, then back to the page.
    let (_, job) = get!(&app, &uri);
    let token = job["confirm"]["replay"].as_str().unwrap();
    let request = test::TestRequest::post()
        .uri(&replay)
        .insert_header(("content-type", "application/x-www-form-urlencoded"))
        .set_payload(format!("confirm={token}"))
        .to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers().get("location").unwrap(), "../../");
    assert_eq!(world.ledger.ask(Op::Total).await.unwrap(), 1, "applied");
}

#[actix::test]
async fn bad_input_is_refused_naming_the_field_and_changes_nothing() {
    let world = world().await;
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    for (query, field) in [
        ("cause=lost", "cause"),
        ("kind=robot", "kind"),
        ("limit=0", "limit"),
        ("since_ms=yesterday", "since_ms"),
        ("after_id=1&after_id=2", "after_id"),
        ("colour=red", "filter"),
    ] {
        let (status, body) = get!(&app, &format!("/admin/dead-letters?{query}"));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        refused(&body, Some(field), field);
    }
    let (status, body) = get!(&app, "/admin/dead-letters/999");
    assert_eq!(status, StatusCode::NOT_FOUND);
    refused(&body, Some("id"), "no dead letter 999");
    let (status, body) = get!(&app, "/admin/dead-letters/seven");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    refused(&body, Some("id"), "`seven` is not an entry id");
    let (status, body) = post!(
        &app,
        "/admin/dead-letters/999/delete",
        json!({"confirm": "00"})
    );
    assert_eq!(status, StatusCode::NOT_FOUND);
    refused(&body, Some("id"), "no dead letter 999");
    let request = test::TestRequest::post()
        .uri(&format!("/admin/dead-letters/{}/replay", world.job))
        .insert_header(("content-type", "application/json"))
        .set_payload("{not json")
        .to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    refused(
        &json_of(test::read_body(response).await),
        Some("confirm"),
        "the body is not",
    );

    // An entry whose type the application no longer reads: the route reads u64.
    let uri = format!("/admin/dead-letters/{}", world.unread);
    let (_, unread) = get!(&app, &uri);
    let (status, body) = post!(
        &app,
        &format!("{uri}/replay"),
        json!({ "confirm": unread["confirm"]["replay"] }),
    );
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    refused(&body, None, "type `OldJob` version 1");
    let entry = world.dead_letters.get(world.unread).await.unwrap();
    assert_eq!(
        entry.replay_failures, 0,
        "not a failed replay: nothing was tried"
    );
    assert_eq!(world.dead_letters.counts().await.unwrap().entries, 3);
    assert_eq!(world.ledger.ask(Op::Total).await.unwrap(), 0);

    // Unknown routes and sections answer JSON too.
    let (status, body) = get!(&app, "/admin/robots");
    assert_eq!(status, StatusCode::NOT_FOUND);
    refused(&body, Some("section"), "no section `robots`");
    let (status, body) = get!(&app, "/admin/dead-letters/1/2/3");
    assert_eq!(status, StatusCode::NOT_FOUND);
    refused(&body, None, "no route GET /admin/dead-letters/1/2/3");

    // A console without a store says so.
    let bare = Console::new();
    let app = test::init_service(App::new().service(bare.scope("/admin"))).await;
    let (status, body) = get!(&app, "/admin/dead-letters");
    assert_eq!(status, StatusCode::NOT_FOUND);
    refused(&body, None, "no dead-letter store");
}

#[actix::test]
async fn the_bearer_guard_refuses_every_route_without_the_token() {
    let world = world().await;
    assert!(world.console.require_bearer("").is_err(), "an empty token");
    assert!(world.console.require_bearer("two words").is_err());
    world.console.require_bearer("s3cret-token").unwrap();
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let job = format!("/admin/dead-letters/{}", world.job);
    let routes = [
        ("GET", "/admin".to_owned()),
        ("GET", "/admin/".to_owned()),
        ("GET", "/admin/overview".to_owned()),
        ("GET", "/admin/producers".to_owned()),
        ("GET", "/admin/dead-letters".to_owned()),
        ("GET", job.clone()),
        ("POST", format!("{job}/replay")),
        ("POST", format!("{job}/delete")),
        ("GET", "/admin/no-such-route".to_owned()),
    ];
    for authorization in [
        None,
        Some("Bearer wrong"),
        Some("Basic s3cret-token"),
        Some("s3cret-token"),
    ] {
        for (method, uri) in &routes {
            let request = match *method {
                "GET" => test::TestRequest::get(),
                _ => test::TestRequest::post().set_json(json!({"confirm": "00"})),
            };
            let request = match authorization {
                Some(value) => request.insert_header(("authorization", value)),
                None => request,
            };
            let response = test::call_service(&app, request.uri(uri).to_request()).await;
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {uri} {authorization:?}"
            );
            assert!(response.headers().contains_key("www-authenticate"));
            let body = json_of(test::read_body(response).await);
            refused(&body, Some("authorization"), "bearer");
        }
    }
    assert_eq!(world.dead_letters.counts().await.unwrap().entries, 3);
    for uri in ["/admin/", "/admin/overview", &job] {
        let request = test::TestRequest::get()
            .uri(uri)
            .insert_header(("authorization", "bearer s3cret-token"))
            .to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
    }
}

#[actix::test]
async fn the_page_shows_every_section_and_escapes_what_it_renders() {
    let world = world().await;
    world.console.stuck_after(Duration::ZERO);
    world
        .dead_letters
        .keep(letter(
            SourceKind::Consumer,
            "<img src=x onerror=alert(1)>",
            DeadLetterCause::Malformed,
            "\"><svg onload=alert(2)>",
            Manifest::new(Codec::MessagePack, "<b>T</b>", 1),
            Codec::MessagePack
                .encode(&json!({"note": SCRIPT_BODY}), 256)
                .unwrap(),
            SCRIPT_ERROR,
        ))
        .await
        .unwrap();
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let response =
        test::call_service(&app, test::TestRequest::get().uri("/admin").to_request()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(response
        .headers()
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    let csp = response
        .headers()
        .get("content-security-policy")
        .unwrap()
        .to_str()
        .unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(response.headers().get("x-frame-options").unwrap(), "DENY");
    let html = String::from_utf8(test::read_body(response).await.to_vec()).unwrap();
    for id in [
        "attention",
        "producers",
        "consumers",
        "work_pulling",
        "projections",
        "entity_hosts",
        "coordinators",
        "shard_maps",
        "nodes",
        "dead-letters",
    ] {
        assert!(
            html.contains(&format!("<section id=\"{id}\">")),
            "section {id}"
        );
    }
    assert!(
        html.contains("<base href=\"/admin/\">"),
        "relative links from /admin"
    );
    assert!(html.contains("durable stream stuck: 3 unconfirmed"));
    assert!(html.contains("note 13 breaks the read model"));
    assert!(html.contains(&format!("id=\"dead-letter-{}\"", world.job)));
    assert!(html.contains(&format!("action=\"dead-letters/{}/replay\"", world.job)));
    // Markup from a peer is shown as text, never as markup.
    for raw in [
        "<script>window",
        "<img src=x",
        "<svg onload",
        "<b>T</b>",
        "</code><script>",
    ] {
        assert!(!html.contains(raw), "{raw} unescaped");
    }
    assert!(html.contains("&lt;script&gt;window.injected = 1&lt;/script&gt; refused"));
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(html.contains("&quot;&gt;&lt;svg onload=alert(2)&gt;"));
    // The page lists entries without their bodies (read without them): each links to its
    // show endpoint instead.
    assert!(!html.contains("window.injected = 2"), "no body on the page");
    assert!(html.contains(&format!(
        "<a href=\"dead-letters/{}\">{} bytes</a>",
        world.job,
        job_13().body_len
    )));
    // The page's own script is the only one.
    assert_eq!(html.matches("<script>").count(), 1);
}

/// The shard map of coordinators on PostgreSQL leases, read from the lease table: owner,
/// token and time left on each lease, the live members, and a shard whose owner left.
#[cfg(feature = "postgres")]
#[actix::test]
async fn the_shard_map_of_postgres_leases_shows_owner_token_expiry_and_members() {
    use actix_delivery::sharding::PostgresLeaseStore;
    if std::env::var(crate::postgres_support::URL_VAR).is_err() {
        eprintln!(
            "skipped: {} is not set: the shard map on PostgreSQL leases needs a server (see \
             .ci/run)",
            crate::postgres_support::URL_VAR
        );
        return;
    }
    let schema = crate::postgres_support::unique("admin_leases");
    let leases: Arc<dyn LeaseStore> = Arc::new(
        PostgresLeaseStore::connect(
            &crate::postgres_support::url(),
            &schema,
            Duration::from_secs(10),
        )
        .await
        .unwrap(),
    );
    let journal: Arc<dyn Journal> = Arc::new(MemoryJournal::new());
    let node = |name: &str| {
        ShardCoordinatorHandle::<Ledger>::start(
            journal.clone(),
            EntityHostOptions::builder("pg-sharded")
                .shards(4)
                .build()
                .unwrap(),
            leases.clone(),
            CoordinatorOptions::builder(name)
                .address(format!("{name}:1"))
                .lease_ttl(Duration::from_secs(5))
                .renew_interval(Duration::from_millis(200))
                .build()
                .unwrap(),
            |_| NoTransport,
        )
        .unwrap()
    };
    let (a, b) = (node("pg-a"), node("pg-b"));
    let console = Console::new();
    console
        .coordinator("a", &a, leases.clone())
        .coordinator("b", &b, leases.clone());
    let app = test::init_service(App::new().service(console.scope("/admin"))).await;
    let (sa, sb) = (a.clone(), b.clone());
    until("the two nodes own the 4 shards", async || {
        sa.stats().await.unwrap().shards_owned + sb.stats().await.unwrap().shards_owned == 4
    })
    .await;

    let (status, maps) = get!(&app, "/admin/shard-maps");
    assert_eq!(status, StatusCode::OK, "{maps}");
    let map = part(&maps, "a");
    assert_eq!(map["namespace"], "pg-sharded");
    let members: Vec<&str> = map["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(
        members.contains(&a.member()) && members.contains(&b.member()),
        "{map}"
    );
    let leases_shown = map["leases"].as_array().unwrap();
    assert_eq!(leases_shown.len(), 4, "{map}");
    for lease in leases_shown {
        let owner = lease["owner"].as_str().unwrap();
        assert!(owner == a.member() || owner == b.member(), "{lease}");
        assert_eq!(lease["live"], true, "{lease}");
        let left = lease["expires_in_ms"].as_i64().unwrap();
        assert!(left > 0 && left <= 5000, "{lease}");
        let address = lease["address"].as_str().unwrap();
        assert!(address == "pg-a:1" || address == "pg-b:1", "{lease}");
    }

    // b leaves: its shards are released (no expiry left), then a takes them.
    let held_by_b: Vec<u64> = leases_shown
        .iter()
        .filter(|lease| lease["owner"] == b.member())
        .map(|lease| lease["shard"].as_u64().unwrap())
        .collect();
    b.stop();
    b.stopped().await;
    until("a owns the 4 shards", async || {
        a.stats().await.unwrap().shards_owned == 4
    })
    .await;
    let (_, maps) = get!(&app, "/admin/shard-maps");
    let map = part(&maps, "a");
    for lease in map["leases"].as_array().unwrap() {
        assert_eq!(lease["owner"], a.member(), "{lease}");
        let shard = lease["shard"].as_u64().unwrap();
        let token = lease["token"].as_u64().unwrap();
        if held_by_b.contains(&shard) {
            assert!(token >= 2, "acquired again, a newer token: {lease}");
        }
    }
    assert_eq!(map["members"].as_array().unwrap().len(), 1);
    a.stop();
    a.stopped().await;
    crate::postgres_support::admin()
        .await
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
}

#[actix::test]
async fn a_wrong_method_and_an_oversized_body_are_refused_as_json() {
    let world = world().await;
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let job = format!("/admin/dead-letters/{}", world.job);
    for (method, uri, allowed) in [
        ("GET", format!("{job}/replay"), "POST"),
        ("PUT", format!("{job}/delete"), "POST"),
        ("POST", "/admin/overview".to_owned(), "GET"),
        ("DELETE", job.clone(), "GET"),
        ("POST", "/admin/producers".to_owned(), "GET"),
        ("POST", "/admin/".to_owned(), "GET"),
    ] {
        let request = test::TestRequest::default()
            .method(method.parse().unwrap())
            .uri(&uri)
            .to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(
            response.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {uri}"
        );
        assert_eq!(
            response.headers().get("allow").unwrap(),
            allowed,
            "{method} {uri}"
        );
        let body = json_of(test::read_body(response).await);
        refused(&body, None, &format!("{method} is not allowed"));
    }
    let (_, shown) = get!(&app, &job);
    let request = test::TestRequest::post()
        .uri(&format!("{job}/delete"))
        .set_json(json!({ "confirm": shown["confirm"]["delete"], "pad": "x".repeat(20_000) }))
        .to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    refused(
        &json_of(test::read_body(response).await),
        Some("confirm"),
        "larger than",
    );
    assert_eq!(world.dead_letters.counts().await.unwrap().entries, 3);
}

#[actix::test]
async fn replicas_sharing_a_confirm_key_accept_each_others_tokens() {
    let world = world().await;
    let short = Console::new().confirm_key(b"fifteen bytes!!").unwrap_err();
    assert_eq!(short.field, "confirm_key");
    let secret = b"a secret of the whole deployment";
    let replica = Console::new();
    replica.dead_letters(&world.dead_letters);
    let one = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let two = test::init_service(App::new().service(replica.scope("/admin"))).await;
    let job = format!("/admin/dead-letters/{}", world.job);
    let (_, shown) = get!(&one, &job);
    let token = json!({ "confirm": shown["confirm"]["delete"] });
    let (status, _) = post!(&two, &format!("{job}/delete"), token.clone());
    assert_eq!(status, StatusCode::CONFLICT, "keys drawn apart");
    world.console.confirm_key(secret).unwrap();
    replica.confirm_key(secret).unwrap();
    let (status, _) = post!(&two, &format!("{job}/delete"), token);
    assert_eq!(status, StatusCode::CONFLICT, "a token of the old key");
    let (_, shown) = get!(&one, &job);
    let token = json!({ "confirm": shown["confirm"]["delete"] });
    let (status, body) = post!(&two, &format!("{job}/delete"), token);
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(world.dead_letters.counts().await.unwrap().entries, 2);
}

#[actix::test]
async fn a_large_body_is_previewed_from_its_first_bytes() {
    let world = world().await;
    for (source, codec, body) in [
        (
            "big-json",
            Codec::MessagePack,
            Codec::MessagePack
                .encode(&"x".repeat(70_000), 1 << 20)
                .unwrap(),
        ),
        ("big-raw", Codec::Bincode, vec![0xab; 300_000]),
    ] {
        world
            .dead_letters
            .keep(letter(
                SourceKind::Consumer,
                source,
                DeadLetterCause::Undecodable,
                source,
                Manifest::new(codec, "Big", 1),
                body,
                "too big",
            ))
            .await
            .unwrap();
    }
    let app = test::init_service(App::new().service(world.console.scope("/admin"))).await;
    let (_, big) = get!(&app, "/admin/dead-letters?source=big-json");
    let preview = big["entries"][0]["preview"].as_str().unwrap();
    assert!(preview.contains("too large to preview"), "{preview}");
    assert!(preview.chars().count() <= 201, "{preview}");
    let (_, raw) = get!(&app, "/admin/dead-letters?source=big-raw");
    let preview = raw["entries"][0]["preview"].as_str().unwrap();
    assert!(
        preview.starts_with("abab") && preview.ends_with('…'),
        "{preview}"
    );
    assert!(preview.chars().count() <= 201, "{preview}");
    // The small MessagePack body still previews as JSON.
    let (_, jobs) = get!(&app, "/admin/dead-letters?source=jobs&limit=1");
    assert_eq!(jobs["entries"][0]["preview"], "13");
}
