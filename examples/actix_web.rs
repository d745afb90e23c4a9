//! An order service on actix-web, run the way production services are: `POST /orders` stores
//! each order through a durable producer and answers `202 Accepted` once it is stored; a
//! persistent ledger (the effectively-once consumer) applies every stored order exactly once;
//! backpressure reaches HTTP as `503` with `Retry-After`; `/health`, `/ready` and (with the
//! `metrics` feature) a Prometheus `/metrics` report from the handles; SIGTERM (or Ctrl-C)
//! drains and exits 0.
//!
//! ```sh
//! cargo run --example actix_web --features metrics [-- <directory> [<listen address>]]
//! curl -i -X POST localhost:8080/orders -H 'content-type: application/json' \
//!      -d '{"id": "order-1", "amount": 25}'
//! curl localhost:8080/ledger; curl localhost:8080/stats; curl localhost:8080/ready
//! curl localhost:8080/metrics
//! cargo run --example actix_web --features metrics,admin   # and open localhost:8080/admin/
//! ```
//!
//! Both journals (SQLite) live in `<directory>` (default: a directory in the system's
//! temporary directory). Kill the process at any moment, even with `kill -9`, and start it
//! again: every order answered `202` is in the ledger exactly once. `tests/actix_web.rs`
//! drives this exact service over HTTP, sends SIGTERM in the middle of a load, restarts it and
//! checks that.
//!
//! Draining on SIGTERM, by a [`Shutdown`] in its phases: `/ready` turns 503 and new orders are
//! refused; the HTTP server stops accepting and finishes the requests it has (`StopIntake`);
//! the producer's `idle()` waits (at most [`Settings::drain_deadline`]) until the ledger
//! confirmed every stored order (`Drain`); then the producer and the ledger stop gracefully,
//! their journal writes in flight finished (`Producers`, `Entities`), the shutdown's report is
//! printed and the process exits 0. Whatever the deadline cut short is stored and is resent at
//! the next start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix_delivery::dead_letters::{DeadLetterLimits, DeadLetters};
use actix_delivery::durable::DurableOptions;
use actix_delivery::journal::{Journal, PersistenceId, SqliteDeadLetters, SqliteJournal};
use actix_delivery::persistence::{Decision, EventSourced, PersistentHandle, PersistentOptions};
use actix_delivery::shutdown::{Phase, Shutdown, ShutdownWatch, TaskOutcome};
use actix_delivery::ReliableDelivery;
use actix_delivery::{ConsumerOptions, Happened, ProducerHandle, ProducerOptions};
use actix_web::http::header;
use actix_web::{get, post, web, App, HttpResponse, HttpServer, Responder};
use serde::{Deserialize, Serialize};

/// An order, as posted and as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Order {
    /// The client's id for the order.
    pub id: String,
    /// Its amount, in cents.
    pub amount: u64,
}

/// The ledger: every order it applied, with how often (an order applied twice would show 2:
/// the ledger does not deduplicate by order id itself, reliable delivery does).
#[derive(Default, Serialize, Deserialize)]
pub struct Ledger {
    applied: BTreeMap<String, u32>,
    total: u64,
}

/// What `GET /ledger` answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LedgerView {
    /// Order id → how many times the ledger applied it.
    pub applied: BTreeMap<String, u32>,
    /// The sum of the applied amounts.
    pub total: u64,
}

/// A command to the ledger.
pub enum LedgerCommand {
    /// Applies an order (it arrives by reliable delivery).
    Apply(Order),
    /// Reads the ledger.
    Read,
}

/// The ledger's one event.
#[derive(Serialize, Deserialize)]
pub struct Applied(Order);

impl EventSourced for Ledger {
    type Command = LedgerCommand;
    type Event = Applied;
    type Reply = Option<LedgerView>;
    type Rejection = String;

    fn decide(&self, command: &LedgerCommand) -> Result<Decision<Self>, String> {
        Ok(match command {
            LedgerCommand::Apply(order) => Decision::persist([Applied(order.clone())], None),
            LedgerCommand::Read => Decision::reply(Some(LedgerView {
                applied: self.applied.clone(),
                total: self.total,
            })),
        })
    }

    fn apply(&mut self, Applied(order): &Applied) {
        *self.applied.entry(order.id.clone()).or_default() += 1;
        self.total += order.amount;
    }
}

/// How the service runs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where both journals live.
    pub dir: PathBuf,
    /// The HTTP address.
    pub listen: SocketAddr,
    /// How long `POST /orders` waits for room in the producer before it answers 503.
    pub store_timeout: Duration,
    /// How long a drain waits for the ledger to confirm what is stored.
    pub drain_deadline: Duration,
}

impl Settings {
    /// The settings from the command line: `[<directory> [<listen address>]]`.
    pub fn from_args() -> Result<Self, Box<dyn std::error::Error>> {
        let mut args = std::env::args().skip(1);
        let dir = args.next().map_or_else(
            || std::env::temp_dir().join("actix-delivery-actix-web"),
            PathBuf::from,
        );
        let listen = args.next().as_deref().unwrap_or("127.0.0.1:8080").parse()?;
        Ok(Self {
            dir,
            listen,
            store_timeout: Duration::from_secs(1),
            drain_deadline: Duration::from_secs(10),
        })
    }
}

/// What the request handlers share.
struct Service {
    orders: ProducerHandle<Order>,
    orders_journal: Arc<SqliteJournal>,
    ledger: PersistentHandle<Ledger>,
    shutdown: ShutdownWatch,
    settings: Settings,
    #[cfg(feature = "metrics")]
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
}

/// How long `POST /orders` waits for the journal once the order has room.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a health or readiness probe waits for a handle to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

fn stream() -> PersistenceId {
    PersistenceId::new("orders").expect("a valid id")
}

/// `503 Service Unavailable` with `Retry-After`, saying why.
fn unavailable(retry_after_secs: u32, why: impl std::fmt::Display) -> HttpResponse {
    HttpResponse::ServiceUnavailable()
        .insert_header((header::RETRY_AFTER, retry_after_secs.to_string()))
        .body(why.to_string())
}

#[post("/orders")]
async fn post_order(service: web::Data<Service>, order: web::Json<Order>) -> impl Responder {
    if service.shutdown.is_shutting_down() {
        return unavailable(1, "draining: try another instance or later");
    }
    let store = service
        .orders
        .store_timeout(order.into_inner(), service.settings.store_timeout);
    // The deadline bounds the wait for room, not the journal: bound the answer too.
    let Ok(waited) = tokio::time::timeout(ANSWER_TIMEOUT, store).await else {
        return HttpResponse::InternalServerError()
            .body("no answer from the journal in time: the order may or may not be stored");
    };
    match waited {
        Ok(stored) => HttpResponse::Accepted().json(serde_json::json!({ "stored": stored.id.0 })),
        Err(error) => match error.happened() {
            // Certainly not stored (no room, stopping, the journal failed): the client may
            // try again.
            Happened::CertainlyNot => unavailable(1, error),
            // Stored or not, the next start settles it: a blind retry could store it twice.
            Happened::InDoubt | Happened::FailedAfter => {
                HttpResponse::InternalServerError().body(error.to_string())
            }
        },
    }
}

#[get("/ledger")]
async fn get_ledger(service: web::Data<Service>) -> impl Responder {
    match service.ledger.ask(LedgerCommand::Read).await {
        Ok(view) => HttpResponse::Ok().json(view),
        Err(error) => unavailable(1, error),
    }
}

/// The handles' counters, as JSON.
#[get("/stats")]
async fn get_stats(service: web::Data<Service>) -> impl Responder {
    match (service.orders.stats().await, service.ledger.stats().await) {
        (Ok(producer), Ok(ledger)) => {
            HttpResponse::Ok().json(serde_json::json!({ "producer": producer, "ledger": ledger }))
        }
        _ => unavailable(1, "a handle has stopped"),
    }
}

/// Alive: both handles answer.
#[get("/health")]
async fn health(service: web::Data<Service>) -> impl Responder {
    let producer = tokio::time::timeout(PROBE_TIMEOUT, service.orders.stats()).await;
    let ledger = tokio::time::timeout(PROBE_TIMEOUT, service.ledger.stats()).await;
    match (producer, ledger) {
        (Ok(Ok(_)), Ok(Ok(_))) => HttpResponse::Ok().body("ok"),
        _ => unavailable(1, "a handle does not answer"),
    }
}

/// Ready for orders: not draining, the producer's stream is open, the ledger recovered, and
/// the orders journal answers a read.
#[get("/ready")]
async fn ready(service: web::Data<Service>) -> impl Responder {
    let draining = service.shutdown.is_shutting_down();
    let producer = tokio::time::timeout(PROBE_TIMEOUT, service.orders.stats()).await;
    let stream_open = matches!(producer, Ok(Ok(stats)) if stats.next_message_id > 0);
    let ledger = tokio::time::timeout(PROBE_TIMEOUT, service.ledger.stats()).await;
    let recovered = matches!(ledger, Ok(Ok(stats)) if stats.recoveries > 0);
    let stream = stream();
    let read = tokio::time::timeout(PROBE_TIMEOUT, service.orders_journal.highest_seq(&stream));
    let journal = matches!(read.await, Ok(Ok(_)));
    let report = serde_json::json!({
        "draining": draining,
        "producer_stream_open": stream_open,
        "ledger_recovered": recovered,
        "journal_reachable": journal,
    });
    if !draining && stream_open && recovered && journal {
        HttpResponse::Ok().json(report)
    } else {
        HttpResponse::ServiceUnavailable().json(report)
    }
}

#[get("/metrics")]
async fn metrics(service: web::Data<Service>) -> impl Responder {
    #[cfg(feature = "metrics")]
    let response = HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(service.prometheus.render());
    #[cfg(not(feature = "metrics"))]
    let response = {
        let _ = service;
        HttpResponse::NotFound().body("built without the `metrics` feature")
    };
    response
}

/// Runs the service until SIGTERM or SIGINT, then drains. Returns once producer and ledger
/// have stopped.
pub async fn run(settings: Settings) -> Result<(), Box<dyn std::error::Error>> {
    // The drain, then a few seconds for the graceful stops.
    let shutdown = Shutdown::new(settings.drain_deadline + Duration::from_secs(10))?;
    // First of all, so that a signal during the start is a drain too (after the start).
    let signalled = shutdown.on_signals()?;
    std::fs::create_dir_all(&settings.dir)?;
    #[cfg(feature = "metrics")]
    let prometheus = {
        let prometheus =
            metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
        // Without a listener the exporter leaves its upkeep (draining histogram samples) to
        // the application: without it, samples pile up between scrapes.
        let upkeep = prometheus.clone();
        actix_web::rt::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(5));
            loop {
                every.tick().await;
                upkeep.run_upkeep();
            }
        });
        prometheus
    };

    let ledger_journal = SqliteJournal::open(settings.dir.join("ledger.db")).await?;
    // What the ledger's consumer refuses is kept beside its journal, to be seen and replayed.
    let dead_letters = DeadLetters::new(
        SqliteDeadLetters::open(&ledger_journal, DeadLetterLimits::default()).await?,
    );
    let ledger = PersistentHandle::<Ledger>::start(PersistentOptions::new(
        Arc::new(ledger_journal),
        PersistenceId::new("ledger")?,
    ))?;
    let consumer = ReliableDelivery::consumer(
        ConsumerOptions::builder(ledger.delivery_handler(LedgerCommand::Apply))
            .name("ledger")
            .keep_dead_letters(dead_letters.clone(), "ledger")
            .build()?,
    );
    let orders_journal = Arc::new(SqliteJournal::open(settings.dir.join("orders.db")).await?);
    let orders = ReliableDelivery::durable_producer(
        ProducerOptions::builder(&consumer)
            .window_size(64)
            .max_pending(1024)
            .build()?,
        DurableOptions::new(orders_journal.clone(), stream(), "orders-api"),
    )?;
    // Serve only once both streams are open: one that cannot be (another producer's stream,
    // another application's data, a corrupt file) ends the start here, saying why.
    ledger.opened().await?;
    orders.opened().await?;

    let service = web::Data::new(Service {
        orders: orders.clone(),
        orders_journal,
        ledger: ledger.clone(),
        shutdown: shutdown.watch(),
        settings: settings.clone(),
        #[cfg(feature = "metrics")]
        prometheus,
    });
    // With the `admin` feature, the operations console at /admin (put it behind your own
    // auth, or `require_bearer`): the orders stream, the ledger's consumer, the dead letters.
    #[cfg(feature = "admin")]
    let console = {
        let console = actix_delivery::admin::Console::new();
        console
            .producer("orders", &orders)
            .consumer("ledger", &consumer)
            .dead_letters(&dead_letters);
        console
    };
    let server = HttpServer::new({
        let service = service.clone();
        #[cfg(feature = "admin")]
        let console = console.clone();
        move || {
            let app = App::new()
                .app_data(service.clone())
                .service(post_order)
                .service(get_ledger)
                .service(health)
                .service(ready)
                .service(get_stats)
                .service(metrics);
            #[cfg(feature = "admin")]
            let app = app.service(console.scope("/admin"));
            app
        }
    })
    .disable_signals() // this function drains on the signals itself
    .bind(settings.listen)?
    .run();
    let http = server.handle();
    let serving = actix_web::rt::spawn(server);
    log::info!("serving on http://{}", settings.listen);
    println!("serving on http://{}", settings.listen);

    // Stop taking orders and let the requests in progress finish (they end in 202 or 503);
    // let the ledger confirm what is stored, for at most the drain deadline (what it cuts
    // short is stored, and resent at the next start); then stop the parts, producer first.
    shutdown.add_task(Phase::StopIntake, "http server", move || async move {
        http.stop(true).await;
        Ok(())
    });
    let drain_deadline = settings.drain_deadline;
    let idle = orders.clone();
    shutdown.add_task(Phase::Drain, "orders confirmed", move || async move {
        tokio::time::timeout(drain_deadline, idle.idle())
            .await
            .map_err(|_| {
                "drain deadline passed: the unconfirmed orders are resent at the next start".into()
            })
    });
    shutdown.add(Phase::Producers, "orders producer", &orders);
    shutdown.add(Phase::Entities, "ledger", &ledger);

    let report = signalled.await;
    serving.await??;
    println!("{report}");
    // A drain cut short by its deadline is no failure (what it cut short is stored); a part
    // that did not stop well is.
    let stopped_well = report
        .tasks()
        .filter(|(phase, _)| *phase > Phase::Drain)
        .all(|(_, task)| task.outcome == TaskOutcome::Done);
    if !stopped_well {
        return Err(report.to_string().into());
    }
    println!("drained");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let settings = Settings::from_args()?;
    actix_web::rt::System::new().block_on(run(settings))
}
