//! The outbox across real crashes of both sides: one child process runs an order service
//! whose decisions deliver shipments through its outbox (`Decision::deliver`, SQLite journal,
//! snapshots with compaction), another runs the shipping entity (its own SQLite journal,
//! must-follow on) behind an effectively-once consumer, exposed over TCP (`tcp::NodeHandle`,
//! 127.0.0.1). The test SIGKILLs the order service, the shipping side, or both (shipping first,
//! the order service 0–30 ms later), at seeded moments aimed by what they print: right after
//! an order is recorded (its delivery in flight) or right after a shipment is stored (its ACK
//! in flight). Each killed side restarts at once.
//!
//! What the order service's journal marks confirmed is read by a probe (a third child that
//! recovers the order service with a destination that never ACKs: recovery sends again
//! exactly the deliveries not confirmed). After every kill of the order service, every order
//! it reported placed is recorded; after every kill of shipping, its journal holds the orders
//! 1..=k in order, each once, among them every shipment it reported and every delivery the
//! order service had marked confirmed at its last kill (none is confirmed without the
//! destination's ACK, which follows its commit; a round that kills both compares the two
//! journals as the kills left them). At the end every recorded delivery is stored exactly
//! once. The kills land with deliveries recorded and unconfirmed, sent and not stored,
//! and stored and unconfirmed (each counted and asserted).
//!
//! Replay a seed with
//! `OUTBOX_CRASH_SEED=5 cargo test --test processes outbox_crash:: -- --nocapture`.

use crate::process;
use crate::remote;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_delivery::journal::PersistenceId;
use actix_delivery::persistence::{
    recover_state, CommandError, Decision, EventSourced, Outbox, PersistentConfig,
    PersistentHandle, PersistentOptions,
};
use actix_delivery::tcp::{NodeHandle, NodeOptions};
use actix_delivery::{
    ConsumerOptions, ConsumerRef, Delivery, DeliveryHandler, ProducerConfig, ReliableDelivery,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

const ENTRY: &str = concat!(module_path!(), "::child_process_entry");
/// Set for a child: the directory of both journals.
const CHILD_DIR: &str = "OUTBOX_CRASH_DIR";
/// Set for a child: `orders`, `shipping` or `probe`.
const CHILD_ROLE: &str = "OUTBOX_CRASH_ROLE";
/// Set for a child: the port the shipping node listens on.
const CHILD_PORT: &str = "OUTBOX_CRASH_PORT";
const DEFAULT_SEED: u64 = 14;
const ORDERS: u64 = 400;
/// Kills of either side (a round that kills both counts two).
const KILLS: u32 = 24;
/// The probe's window: above every number of deliveries that can be open.
const PROBE_WINDOW: usize = 1024;

/// The order service: how many orders it placed.
#[derive(Default, Serialize, Deserialize)]
struct Orders {
    placed: u64,
}

enum OrderCommand {
    Place,
    Count,
}

#[derive(Serialize, Deserialize)]
struct Placed(u64);

#[derive(Clone, Serialize, Deserialize)]
struct Ship {
    order: u64,
}

impl EventSourced for Orders {
    type Command = OrderCommand;
    type Event = Placed;
    type Reply = u64;
    type Rejection = String;

    fn decide(&self, command: &OrderCommand) -> Result<Decision<Self>, String> {
        Ok(match command {
            OrderCommand::Place => {
                let order = self.placed + 1;
                Decision::persist([Placed(order)], order).deliver("shipping", &Ship { order })
            }
            OrderCommand::Count => Decision::reply(self.placed),
        })
    }

    fn apply(&mut self, Placed(order): &Placed) {
        self.placed = *order;
    }
}

/// The shipping entity: the orders it shipped, in order.
#[derive(Default, Serialize, Deserialize)]
struct Shipping {
    shipped: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
struct Shipped(u64);

impl EventSourced for Shipping {
    type Command = u64;
    type Event = Shipped;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, order: &u64) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Shipped(*order)], ()))
    }

    fn apply(&mut self, Shipped(order): &Shipped) {
        self.shipped.push(*order);
    }
}

fn orders_id() -> PersistenceId {
    PersistenceId::new("orders").unwrap()
}

fn shipping_id() -> PersistenceId {
    PersistenceId::new("shipping").unwrap()
}

fn compacting() -> PersistentConfig {
    PersistentConfig {
        snapshot_every: Some(25),
        delete_events_on_snapshot: true,
        ..Default::default()
    }
}

/// The order service on `orders.db` in `dir`, delivering to `shipping`.
async fn start_orders(
    dir: &Path,
    shipping: ConsumerRef<Ship>,
    window_size: usize,
) -> PersistentHandle<Orders> {
    let journal = process::open_journal(dir.join("orders.db"))
        .await
        .expect("open the orders' journal");
    let lane = ProducerConfig {
        window_size,
        resend_timeout: Duration::from_millis(100),
        ..Default::default()
    };
    let outbox = Outbox::new()
        .destination("shipping", shipping, lane)
        .unwrap();
    PersistentHandle::start(
        PersistentOptions::new(Arc::new(journal), orders_id())
            .config(compacting())
            .outbox(outbox)
            .supervised(),
    )
    .unwrap()
}

/// The child, by [`CHILD_ROLE`]:
/// - `shipping`: the shipping entity behind an effectively-once consumer, exposed as
///   "shipping" on [`CHILD_PORT`]; prints `ready`, then `shipped <order>` once an order's
///   shipment is stored (its ACK follows 15 ms later).
/// - `orders`: the order service delivering to that node; prints `ready <placed>`, then
///   `placed <order>` once each order (and its delivery) is recorded, up to [`ORDERS`].
/// - `probe`: recovers the order service with a destination that never ACKs and prints
///   `placed <n>` and `unconfirmed <orders>` (what recovery sent again), then exits.
#[test]
fn child_process_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // run as an ordinary test: nothing to do
    };
    let role = std::env::var(CHILD_ROLE).expect("a role");
    let shipping_addr = || -> SocketAddr {
        let port = std::env::var(CHILD_PORT).expect("the shipping node's port");
        format!("127.0.0.1:{port}").parse().unwrap()
    };
    actix::System::new().block_on(async move {
        let dir = Path::new(&dir);
        match role.as_str() {
            "shipping" => {
                let journal = process::open_journal(dir.join("shipping.db"))
                    .await
                    .expect("open the shipping journal");
                let config = PersistentConfig {
                    must_follow: true,
                    ..compacting()
                };
                let shipping = PersistentHandle::<Shipping>::start(
                    PersistentOptions::new(Arc::new(journal), shipping_id()).config(config),
                )
                .unwrap();
                let handler = DeliveryHandler::pipelined(move |info, ship: Ship| {
                    let stored = shipping.ask_delivered(info, ship.order);
                    async move {
                        stored.await?;
                        println!("shipped {}", ship.order);
                        // The ACK is held back a little, so that a kill of the order service
                        // aimed at a shipment lands before its ACK in any build profile.
                        actix::clock::sleep(Duration::from_millis(15)).await;
                        Ok::<(), CommandError<String>>(())
                    }
                });
                let consumer =
                    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap());
                let options = remote::fast(NodeOptions::builder().secret(remote::secret()))
                    .listen(shipping_addr())
                    .build()
                    .unwrap();
                let node = NodeHandle::start(options).await.expect("bind the port");
                node.expose("shipping", &consumer).unwrap();
                println!("ready");
                std::future::pending::<()>().await;
            }
            "orders" => {
                let options = remote::fast(NodeOptions::builder().secret(remote::secret()))
                    .build()
                    .unwrap();
                let node = NodeHandle::start(options).await.unwrap();
                let shipping = node
                    .consumer_ref::<Ship>(shipping_addr(), "shipping")
                    .unwrap();
                let orders = start_orders(dir, shipping, 16).await;
                let placed = orders.ask(OrderCommand::Count).await.expect("recovered");
                println!("ready {placed}");
                for _ in placed..ORDERS {
                    match orders.ask(OrderCommand::Place).await {
                        Ok(order) => println!("placed {order}"),
                        Err(error) => println!("refused {error}"),
                    }
                    actix::clock::sleep(Duration::from_millis(2)).await;
                }
                std::future::pending::<()>().await;
            }
            "probe" => {
                let resent = Arc::new(Mutex::new(BTreeSet::new()));
                let into = resent.clone();
                let never_acks = ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Ship>>| {
                    let mut resent = into.lock().unwrap();
                    resent.extend(deliveries.into_iter().map(|d| d.body.order));
                });
                let orders = start_orders(dir, never_acks, PROBE_WINDOW).await;
                // Recovery sent the unconfirmed deliveries before it answered this.
                let placed = orders.ask(OrderCommand::Count).await.expect("recovered");
                let resent: Vec<String> =
                    resent.lock().unwrap().iter().map(u64::to_string).collect();
                println!("placed {placed}");
                println!("unconfirmed {}", resent.join(","));
                std::process::exit(0); // nothing is being written: the journal needs no close
            }
            other => panic!("unknown role {other:?}"),
        }
    });
}

/// What a probe found in the order service's journal.
struct Probed {
    placed: u64,
    unconfirmed: BTreeSet<u64>,
}

impl Probed {
    /// The recorded deliveries the order service marked confirmed.
    fn confirmed(&self) -> BTreeSet<u64> {
        (1..=self.placed)
            .filter(|order| !self.unconfirmed.contains(order))
            .collect()
    }
}

/// Runs a probe child (no order service may be running).
fn probe(dir: &Path, context: &str) -> Probed {
    let env = [
        (CHILD_DIR, dir.display().to_string()),
        (CHILD_ROLE, "probe".to_string()),
    ];
    let child = process::spawn(ENTRY, &env);
    let line = |prefix: &str| {
        let line = child
            .wait_for(prefix, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{context}: the probe printed no {prefix:?}"));
        line[prefix.len()..].to_string()
    };
    let placed = line("placed ");
    let unconfirmed = line("unconfirmed ");
    let status = child.finish();
    assert!(status.success(), "{context}: the probe failed: {status}");
    let placed = placed
        .parse()
        .unwrap_or_else(|_| panic!("{context}: the probe printed placed {placed:?}"));
    let unconfirmed: BTreeSet<u64> = unconfirmed
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| {
            n.parse()
                .unwrap_or_else(|_| panic!("{context}: the probe printed {unconfirmed:?}"))
        })
        .collect();
    assert!(
        unconfirmed
            .iter()
            .all(|&order| (1..=placed).contains(&order)),
        "{context}: unconfirmed deliveries of orders never placed: {unconfirmed:?} of {placed}"
    );
    Probed {
        placed,
        unconfirmed,
    }
}

/// The orders the shipping journal holds, checked: 1..=k in order, each once.
fn shipped(dir: &Path, context: &str) -> Vec<u64> {
    let shipping = actix::System::new().block_on(async {
        let journal = process::open_journal(dir.join("shipping.db"))
            .await
            .unwrap_or_else(|e| panic!("{context}: reopen the shipping journal: {e}"));
        let shipping = recover_state::<Shipping>(&journal, &shipping_id())
            .await
            .unwrap_or_else(|e| panic!("{context}: recover shipping: {e}"));
        journal.close().await; // lets go of the file before the next child opens it
        shipping
    });
    let expected: Vec<u64> = (1..=shipping.shipped.len() as u64).collect();
    assert_eq!(
        shipping.shipped, expected,
        "{context}: shipped out of order, with a gap or twice"
    );
    shipping.shipped
}

/// One side: its child, restarted at once after each kill (and killed when dropped, so a
/// failing test leaves no child behind).
struct Side {
    role: &'static str,
    env: Vec<(&'static str, String)>,
    child: Option<process::Child>,
    kills: u32,
}

impl Side {
    fn new(role: &'static str, env: &[(&'static str, String)]) -> Self {
        let mut side = Side {
            role,
            env: env.to_vec(),
            child: None,
            kills: 0,
        };
        side.start();
        side
    }

    fn start(&mut self) {
        let mut env = self.env.clone();
        env.push((CHILD_ROLE, self.role.to_string()));
        self.child = Some(process::spawn(ENTRY, &env));
    }

    fn child(&self) -> &process::Child {
        self.child.as_ref().expect("started")
    }

    /// SIGKILLs the child; returns what it printed last.
    fn kill(&mut self) -> Vec<String> {
        self.kills += 1;
        self.child
            .take()
            .map_or_else(Vec::new, process::Child::kill_collect)
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            child.kill(); // the end of the run, or a failed test: not a scheduled kill
        }
    }
}

/// What the test has seen the children print.
#[derive(Default)]
struct Seen {
    placed: BTreeSet<u64>,
    shipped: BTreeSet<u64>,
}

impl Seen {
    /// Takes a line; returns what it reported: `placed` or `shipped`.
    fn line(&mut self, line: &str, context: &str) -> Option<&'static str> {
        let (what, order) = line.split_once(' ')?;
        let set = match what {
            "placed" => &mut self.placed,
            "shipped" => &mut self.shipped,
            _ => return None,
        };
        let order = order
            .parse()
            .unwrap_or_else(|_| panic!("{context}: a child printed {line:?}"));
        set.insert(order);
        Some(if what == "placed" {
            "placed"
        } else {
            "shipped"
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    Orders,
    Shipping,
    Both,
}

#[test]
fn every_recorded_delivery_is_stored_once_and_none_confirmed_without_its_ack_across_sigkills() {
    let seed: u64 = std::env::var("OUTBOX_CRASH_SEED").map_or(DEFAULT_SEED, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("seed {seed}: a temp dir: {e}"));
    let port = remote::reusable_addr().port();
    let env = [
        (CHILD_DIR, dir.path().display().to_string()),
        (CHILD_PORT, port.to_string()),
    ];
    let mut shipping_side = Side::new("shipping", &env);
    shipping_side
        .child()
        .wait_for("ready", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("seed {seed}: the shipping side did not start"));
    let mut orders_side = Side::new("orders", &env);
    let mut seen = Seen::default();
    // What the last probe found the order service had marked confirmed.
    let mut confirmed = BTreeSet::new();
    // Kills with deliveries recorded and unconfirmed (order service), sent and not stored
    // (shipping), stored and not confirmed (order service, after a store it printed).
    let (mut recorded_unconfirmed, mut sent_unstored, mut stored_unconfirmed) = (0, 0, 0);
    let started = Instant::now();
    let mut round = 0;
    // At least KILLS kills, and more (up to 3 × KILLS) until every kind of window was hit:
    // whether an aimed kill lands in its window depends on the timing of the sides.
    let covered = |recorded_unconfirmed, sent_unstored, stored_unconfirmed| {
        recorded_unconfirmed > 0 && sent_unstored > 0 && stored_unconfirmed > 0
    };
    while orders_side.kills + shipping_side.kills < KILLS
        || (!covered(recorded_unconfirmed, sent_unstored, stored_unconfirmed)
            && orders_side.kills + shipping_side.kills < 3 * KILLS)
    {
        round += 1;
        let context = format!("seed {seed}, round {round}");
        let target = [Target::Orders, Target::Shipping, Target::Both][rng.random_range(0..3)];
        let kills_after =
            orders_side.kills + shipping_side.kills + 1 + u32::from(target == Target::Both);
        let context = format!("{context}: {target:?} killed, kill {kills_after}");
        // Aimed by what the sides print: a recorded order (its delivery in flight) before a
        // kill of shipping, a stored shipment (its ACK in flight) before one of orders.
        let trigger = match target {
            Target::Orders if rng.random_bool(0.7) => "shipped",
            Target::Orders => "placed",
            Target::Shipping | Target::Both => "placed",
        };
        let after = rng.random_range(1..=25);
        let then = Duration::from_millis(rng.random_range(0..=30));
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut count = 0;
        while count < after && Instant::now() < deadline {
            let mut idle = true;
            for side in [&shipping_side, &orders_side] {
                while let Ok(Some(line)) = side.child().try_line() {
                    idle = false;
                    count += u32::from(seen.line(&line, &context) == Some(trigger));
                }
            }
            if idle {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        if target != Target::Orders {
            for line in shipping_side.kill() {
                seen.line(&line, &context);
            }
            std::thread::sleep(then); // the order service goes on alone a moment
        }
        if target != Target::Shipping {
            for line in orders_side.kill() {
                seen.line(&line, &context);
            }
            let probed = probe(dir.path(), &context);
            if let Some(missing) = seen.placed.iter().find(|&&o| o > probed.placed) {
                panic!("{context}: order {missing} was reported placed but is not recorded");
            }
            recorded_unconfirmed += u32::from(!probed.unconfirmed.is_empty());
            stored_unconfirmed +=
                u32::from(seen.shipped.iter().any(|o| probed.unconfirmed.contains(o)));
            confirmed = probed.confirmed();
            orders_side.start();
        }
        if target != Target::Orders {
            let shipped = shipped(dir.path(), &context);
            let stored: BTreeSet<u64> = shipped.iter().copied().collect();
            if let Some(lost) = confirmed.difference(&stored).next() {
                panic!(
                    "{context}: the order service marked the delivery of order {lost} \
                     confirmed, but shipping never stored it ({} stored)",
                    stored.len()
                );
            }
            if let Some(lost) = seen.shipped.difference(&stored).next() {
                panic!("{context}: order {lost} was reported shipped but is not stored");
            }
            sent_unstored += u32::from(seen.placed.iter().any(|o| !stored.contains(o)));
            shipping_side.start();
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{context}: no progress: {} placed, {} shipped",
            seen.placed.len(),
            seen.shipped.len()
        );
    }
    // Both run until every order is shipped.
    let context = format!("seed {seed}, the end");
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.shipped.len() < ORDERS as usize && Instant::now() < deadline {
        for side in [&shipping_side, &orders_side] {
            while let Ok(Some(line)) = side.child().try_line() {
                seen.line(&line, &context);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (orders_kills, shipping_kills) = (orders_side.kills, shipping_side.kills);
    drop((orders_side, shipping_side));
    let probed = probe(dir.path(), &context);
    let shipped = shipped(dir.path(), &context);
    assert_eq!(probed.placed, ORDERS, "{context}: every order placed");
    assert_eq!(
        shipped,
        (1..=ORDERS).collect::<Vec<_>>(),
        "{context}: every recorded delivery stored exactly once, in order"
    );
    assert!(
        orders_kills >= KILLS / 3 && shipping_kills >= KILLS / 3,
        "seed {seed}: both sides killed: {orders_kills} and {shipping_kills} kills"
    );
    assert!(
        covered(recorded_unconfirmed, sent_unstored, stored_unconfirmed),
        "seed {seed}: kills with deliveries recorded and unconfirmed {recorded_unconfirmed}, \
         sent and not stored {sent_unstored}, stored and unconfirmed {stored_unconfirmed}"
    );
    println!(
        "seed {seed}: {orders_kills} kills of the order service, {shipping_kills} of shipping in \
         {round} rounds; kills with deliveries recorded and unconfirmed: {recorded_unconfirmed}, \
         sent and not stored: {sent_unstored}, stored and unconfirmed: {stored_unconfirmed}; \
         {} deliveries open at the end; {:.1} s",
        probed.unconfirmed.len(),
        started.elapsed().as_secs_f64()
    );
}
