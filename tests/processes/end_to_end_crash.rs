//! Effectively once end to end, across real crashes: a child process runs a durable producer
//! (SQLite journal) sending transfers to a persistent bank (its own SQLite journal,
//! must-follow on, snapshots with compaction on both sides). The test SIGKILLs the child at
//! seeded moments (at least 30 times) and restarts it until every transfer is confirmed.
//!
//! After each kill, from the bank's journal: the total balance is still 0, transfers were
//! applied in send order without a gap (must-follow), none twice, and every transfer the
//! child had reported confirmed is applied. At the end every transfer it reported stored is
//! applied exactly once and nothing else is. The kills land before write-ahead commits, after
//! them before the bank's commit, after the bank's commit before the confirmation was
//! recorded (counted below), during recoveries and during compactions (snapshots every 20
//! writes). Half the lives are aimed: the bank's journal prints a marker when an append is
//! handed to it and after each commit ([`process::hook::Hooked`]), and holds a seeded append,
//! either before it reaches the journal or after its commit; the test kills the child a seeded
//! 0–30 ms after the held append's marker: decided and not stored, or stored and not yet ACKed
//! (each counted, and at least [`MIN_HELD_KILLS`] of each asserted). After every kill, every
//! append the bank's journal reported committed is in it.
//!
//! The two-process variant runs the durable producer and the bank in two child processes, each
//! with its own SQLite journal, connected over TCP (`tcp::NodeHandle`, 127.0.0.1), and SIGKILLs
//! each of them on its own seeded schedule (`E2E_TWO_PROCESS_KILLS` kills each, default 12),
//! restarting it at once. The same invariants hold after every kill of the bank, and at the
//! end; the kills land with transfers applied but not confirmed and stored but not applied on
//! both sides (counted below). Every other life of the bank is aimed like above.
//!
//! Replay a seed with `E2E_SEED=5 cargo test --test processes end_to_end_crash:: -- --nocapture`.

use crate::process;
use crate::remote;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix_delivery::durable::{DurableConfirmation, DurableOptions};
use actix_delivery::journal::{Journal, PersistenceId};
use actix_delivery::persistence::{
    recover_state, Decision, EventSourced, PersistentConfig, PersistentHandle, PersistentOptions,
};
use actix_delivery::tcp::{NodeHandle, NodeOptions};
use actix_delivery::{
    ConsumerHandle, ConsumerOptions, ConsumerRef, Delivery, DeliveryHandler, ProducerOptions,
    ReliableDelivery, ReplyTo,
};
use process::hook::{Hold, Markers};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

const ENTRY: &str = concat!(module_path!(), "::child_process_entry");
const CHILD_DIR: &str = "E2E_CHILD_DIR";
const CHILD_ACK_DELAY: &str = "E2E_CHILD_ACK_DELAY_MS";
/// Set for a child of the two-process variant: `producer` or `consumer`.
const CHILD_ROLE: &str = "E2E_CHILD_ROLE";
/// Set for a child of the two-process variant: the port the consumer's node listens on.
const CHILD_PORT: &str = "E2E_CHILD_PORT";
/// Set for a child: the bank's append its journal holds ([`Hold::encode`]).
const CHILD_HOLD: &str = "E2E_CHILD_HOLD";
/// The marker of the bank's journal's lines.
const MARKER: &str = "bank-journal";
/// Aimed kills of each kind (before a commit of the bank, and between it and its ACK) the
/// single-process run must have.
const MIN_HELD_KILLS: u32 = 4;
const TRANSFERS: u64 = 1_500;
const KILLS: u32 = 32;
const ACCOUNTS: u64 = 5;

/// A transfer; `id` is its message id at the producer (its seq).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Transfer {
    id: u64,
    from: u64,
    to: u64,
    amount: i64,
}

impl Transfer {
    fn number(id: u64) -> Self {
        Self {
            id,
            from: id % ACCOUNTS,
            to: (id * 7 + 3) % ACCOUNTS,
            amount: (id % 97) as i64 + 1,
        }
    }
}

/// The bank: balances, and the transfers applied in order.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Bank {
    balances: BTreeMap<u64, i64>,
    applied: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
struct Moved(Transfer);

impl EventSourced for Bank {
    type Command = Transfer;
    type Event = Moved;
    type Reply = ();
    type Rejection = String;

    fn decide(&self, transfer: &Transfer) -> Result<Decision<Self>, String> {
        Ok(Decision::persist([Moved(transfer.clone())], ()))
    }

    fn apply(&mut self, Moved(transfer): &Moved) {
        *self.balances.entry(transfer.from).or_default() -= transfer.amount;
        *self.balances.entry(transfer.to).or_default() += transfer.amount;
        self.applied.push(transfer.id);
    }
}

fn bank_id() -> PersistenceId {
    PersistenceId::new("bank").unwrap()
}

fn snapshots() -> PersistentConfig {
    PersistentConfig {
        snapshot_every: Some(20),
        delete_events_on_snapshot: true,
        must_follow: true,
        ..Default::default()
    }
}

/// Prints the confirmations of transfers resent after a restart.
struct Sink;

impl Actor for Sink {
    type Context = Context<Self>;
}

impl Handler<DurableConfirmation> for Sink {
    type Result = ();
    fn handle(&mut self, confirmation: DurableConfirmation, _: &mut Context<Self>) {
        if confirmation.result.is_ok() {
            println!("confirmed {}", confirmation.id.0);
        }
    }
}

/// The bank, recovered from `bank.db` in `dir`; its journal prints [`MARKER`] lines and
/// holds the append `hold` says.
async fn start_bank(dir: &Path, hold: Hold) -> PersistentHandle<Bank> {
    let journal = process::open_journal(dir.join("bank.db")).await.unwrap();
    let journal = process::hook::Hooked::new(journal, MARKER, hold);
    PersistentHandle::<Bank>::start(
        PersistentOptions::new(Arc::new(journal), bank_id()).config(snapshots()),
    )
    .unwrap()
}

/// `target` with every ACK held back `delay` ms, so that kills land between the bank's commit
/// and the confirmation. One delayed reply address per producer reply address.
fn delayed_acks(target: ConsumerRef<Transfer>, delay: u64) -> ConsumerRef<Transfer> {
    let wrapped: Mutex<Option<(ReplyTo, ReplyTo)>> = Mutex::default();
    ConsumerRef::from_fn(move |deliveries: Vec<Delivery<Transfer>>| {
        let delayed = deliveries.into_iter().map(|mut delivery| {
            let reply_to = delivery.reply_to.take().expect("a producer's delivery");
            let mut wrapped = wrapped.lock().unwrap();
            if !wrapped
                .as_ref()
                .is_some_and(|(of, _)| of.same_as(&reply_to))
            {
                let inner = reply_to.clone();
                let later = ReplyTo::from_fn(move |acks| {
                    let inner = inner.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(delay));
                        inner.do_send_all(acks.into_iter());
                    });
                });
                *wrapped = Some((reply_to, later));
            }
            delivery.reply_to = wrapped.as_ref().map(|(_, later)| later.clone());
            delivery
        });
        target.do_send_all(delayed);
    })
}

/// The durable producer on `producer.db` in `dir`, storing transfers up to [`TRANSFERS`] and
/// sending them to `target`; prints `ready <next id>`, `stored <id>` and `confirmed <id>`
/// lines, and `idle` once all transfers are confirmed. Never returns.
async fn produce(dir: &Path, target: ConsumerRef<Transfer>) {
    let producer_journal = process::open_journal(dir.join("producer.db"))
        .await
        .unwrap();
    let durable = DurableOptions::new(
        Arc::new(producer_journal),
        PersistenceId::new("transfers").unwrap(),
        "bank-client",
    )
    .snapshot_every(20)
    .confirmations(Sink.start().recipient());
    let options = ProducerOptions::builder(target)
        .producer_id("bank-client")
        .window_size(8)
        .resend_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let producer = ReliableDelivery::durable_producer(options, durable).unwrap();
    let next = loop {
        let next = producer.stats().await.unwrap().next_message_id;
        if next > 0 {
            break next;
        }
        actix::clock::sleep(Duration::from_millis(1)).await;
    };
    println!("ready {next}");
    for id in next..=TRANSFERS {
        let stored = producer.store(Transfer::number(id)).await.unwrap();
        assert_eq!(stored.id.0, id, "transfer numbers are message ids");
        println!("stored {id}");
        actix::spawn(async move {
            if stored.confirmed().await.is_ok() {
                println!("confirmed {id}");
            }
        });
        if id % 4 == 0 {
            actix::clock::sleep(Duration::from_millis(1)).await;
        }
    }
    producer.idle().await;
    println!("idle");
    std::future::pending::<()>().await;
}

/// The bank's effectively-once consumer for the two-process variant: what
/// [`PersistentHandle::delivery_handler`] does, printing `applied <id>` once the bank answered
/// that the transfer is stored (now or before), so the test knows, at a kill of the producer,
/// what the bank had committed.
fn reporting_consumer(bank: PersistentHandle<Bank>) -> ConsumerHandle<Transfer> {
    let handler = DeliveryHandler::pipelined(move |info, transfer: Transfer| {
        let id = transfer.id;
        let answer = bank.ask_delivered(info, transfer);
        async move {
            answer.await?;
            println!("applied {id}");
            Ok::<(), actix_delivery::persistence::CommandError<String>>(())
        }
    });
    ReliableDelivery::consumer(ConsumerOptions::builder(handler).build().unwrap())
}

/// The child. Without [`CHILD_ROLE`]: bank, consumer and durable producer in one process,
/// linked in memory. With it, one side of the two-process variant: `consumer` (the bank and
/// its consumer, exposed as "bank" by a node listening on [`CHILD_PORT`], printing `ready`)
/// or `producer` (the durable producer, sending through a node to that port).
#[test]
fn child_process_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return; // run as an ordinary test: nothing to do
    };
    let delay: u64 = std::env::var(CHILD_ACK_DELAY).map_or(0, |d| d.parse().unwrap());
    let role = std::env::var(CHILD_ROLE).ok();
    let hold = std::env::var(CHILD_HOLD).map_or(Hold::Never, |hold| Hold::parse(&hold));
    let consumer_addr = || -> SocketAddr {
        let port = std::env::var(CHILD_PORT).expect("the consumer's port");
        format!("127.0.0.1:{port}").parse().unwrap()
    };
    actix::System::new().block_on(async move {
        let dir = Path::new(&dir);
        match role.as_deref() {
            None => {
                let bank = start_bank(dir, hold).await;
                let consumer = ReliableDelivery::consumer(
                    ConsumerOptions::builder(bank.delivery_handler(|transfer: Transfer| transfer))
                        .build()
                        .unwrap(),
                );
                produce(dir, delayed_acks(consumer.consumer_ref(), delay)).await;
            }
            Some("consumer") => {
                let consumer = reporting_consumer(start_bank(dir, hold).await);
                let options = remote::fast(NodeOptions::builder().secret(remote::secret()))
                    .listen(consumer_addr())
                    .build()
                    .unwrap();
                let node = NodeHandle::start(options).await.expect("bind the port");
                node.expose("bank", &consumer).unwrap();
                println!("ready");
                std::future::pending::<()>().await;
            }
            Some("producer") => {
                let options = remote::fast(NodeOptions::builder().secret(remote::secret()))
                    .build()
                    .unwrap();
                let node = NodeHandle::start(options).await.unwrap();
                let bank = node
                    .consumer_ref::<Transfer>(consumer_addr(), "bank")
                    .unwrap();
                produce(dir, delayed_acks(bank, delay)).await;
            }
            Some(other) => panic!("unknown role {other:?}"),
        }
    });
}

/// The bank as its journal holds it, and the journal's highest seq.
fn bank_state(dir: &Path, context: &str) -> (Bank, u64) {
    actix::System::new().block_on(async {
        let journal = process::open_journal(dir.join("bank.db"))
            .await
            .unwrap_or_else(|e| panic!("{context}: reopen the bank's journal: {e}"));
        let bank = recover_state::<Bank>(&journal, &bank_id())
            .await
            .unwrap_or_else(|e| panic!("{context}: recover the bank: {e}"));
        let highest = journal
            .highest_seq(&bank_id())
            .await
            .unwrap_or_else(|e| panic!("{context}: the bank's highest seq: {e}"));
        journal.close().await; // lets go of the file before the next child opens it
        (bank, highest)
    })
}

/// Every append the bank's journal reported committed (up to seq `committed`) is in it.
fn check_committed(highest: u64, committed: u64, context: &str) {
    assert!(
        highest >= committed,
        "{context}: the bank's journal reported seq {committed} committed, but holds up to \
         {highest}"
    );
}

/// With `aimed`, a seeded append of the first 4 to hold, before or after its commit. (A
/// life whose bank makes fewer appends is not aimed after all; the consumer commits what
/// arrives together in one append, so a release build makes few of them per life.)
fn aimed(rng: &mut SmallRng, aimed: bool) -> Hold {
    if !aimed {
        return Hold::Never;
    }
    let n = rng.random_range(1..=4);
    if rng.random_bool(0.5) {
        Hold::Before(n)
    } else {
        Hold::After(n)
    }
}

/// The invariants that hold at every moment.
fn check_bank(bank: &Bank, confirmed: &BTreeSet<u64>, context: &str) {
    let total: i64 = bank.balances.values().sum();
    assert_eq!(total, 0, "{context}: the total balance changed");
    let expected: Vec<u64> = (1..=bank.applied.len() as u64).collect();
    assert_eq!(
        bank.applied, expected,
        "{context}: applied out of send order, with a gap or twice"
    );
    if let Some(missing) = confirmed.iter().find(|&&id| id > bank.applied.len() as u64) {
        panic!("{context}: transfer {missing} was confirmed but is not applied");
    }
}

#[test]
fn every_stored_transfer_is_applied_exactly_once_in_order_across_sigkills() {
    let seed: u64 = std::env::var("E2E_SEED").map_or(11, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (mut stored, mut confirmed) = (BTreeSet::new(), BTreeSet::new());
    let (mut kills, mut lives) = (0, 0);
    let (mut applied_unconfirmed, mut stored_unapplied, mut early_kills) = (0, 0, 0);
    // Kills while the bank's journal held an append: before its commit, and after it (before
    // its ACK).
    let (mut held_before, mut held_after) = (0, 0);
    // The highest seq the bank's journal reported committed.
    let mut committed = 0;
    let started = Instant::now();
    loop {
        lives += 1;
        let delay = [0, 10, 40][rng.random_range(0..3)];
        let finishing = kills >= KILLS;
        let aim = !finishing && rng.random_bool(0.5);
        let hold = aimed(&mut rng, aim);
        let hold_delay = Duration::from_millis(rng.random_range(0..=30));
        let env = [
            (CHILD_DIR, dir.path().display().to_string()),
            (CHILD_ACK_DELAY, delay.to_string()),
            (CHILD_HOLD, hold.encode()),
        ];
        let child = process::spawn(ENTRY, &env);
        let life = if finishing {
            Duration::from_secs(120)
        } else if hold != Hold::Never {
            Duration::from_secs(5) // in case the bank commits less often: not aimed then
        } else {
            Duration::from_millis(rng.random_range(0..=250))
        };
        early_kills += u32::from(life < Duration::from_millis(15));
        let born = Instant::now();
        let (mut deadline, mut held) = (born + life, false);
        let (mut idle, mut markers) = (false, Markers::default());
        let mut take = |line: &str, markers: &mut Markers| {
            if markers.take(line, MARKER) {
                return false;
            }
            let mut words = line.split(' ');
            match (words.next(), words.next().map(|n| n.parse::<u64>())) {
                (Some("stored"), Some(Ok(id))) => {
                    stored.insert(id);
                }
                (Some("confirmed"), Some(Ok(id))) => {
                    confirmed.insert(id);
                }
                (Some("idle"), _) => return true,
                _ => {}
            }
            false
        };
        while Instant::now() < deadline && !idle {
            let Some(line) = child.next_line(deadline) else {
                break;
            };
            idle = take(&line, &mut markers);
            if !held && hold.is_held(&markers) {
                // The kill lands while the append is held.
                held = true;
                deadline = Instant::now() + hold_delay;
            }
        }
        for line in child.kill_collect() {
            take(&line, &mut markers); // printed before it died
        }
        committed = committed.max(markers.committed_seq);
        held_before += u32::from(held && matches!(hold, Hold::Before(_)));
        held_after += u32::from(held && matches!(hold, Hold::After(_)));
        let context = format!("seed {seed}, life {lives}");
        let (bank, highest) = bank_state(dir.path(), &context);
        check_committed(highest, committed, &context);
        check_bank(&bank, &confirmed, &context);
        let applied: BTreeSet<u64> = bank.applied.iter().copied().collect();
        applied_unconfirmed += applied.difference(&confirmed).count();
        stored_unapplied += stored.difference(&applied).count();
        if idle && finishing {
            break; // the producer holds nothing unsettled
        }
        kills += 1;
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{context}: no progress"
        );
    }
    let (bank, _) = bank_state(dir.path(), &format!("seed {seed}, the end"));
    assert_eq!(
        bank.applied,
        (1..=TRANSFERS).collect::<Vec<_>>(),
        "seed {seed}"
    );
    assert!(stored.iter().all(|id| *id <= TRANSFERS));
    assert!(kills >= KILLS);
    assert!(
        applied_unconfirmed > 0,
        "seed {seed}: no kill between the bank's commit and the confirmation"
    );
    assert!(
        stored_unapplied > 0,
        "seed {seed}: no kill between a store and the bank's commit"
    );
    assert!(early_kills > 0, "seed {seed}: no kill during a recovery");
    assert!(
        held_before >= MIN_HELD_KILLS && held_after >= MIN_HELD_KILLS,
        "seed {seed}: only {held_before} kills before a commit of the bank (decided), \
         {held_after} between its commit and its ACK"
    );
    // A confirmation fires after its record commits: a kill in between loses the report,
    // never the transfer.
    let unreported = TRANSFERS as usize - confirmed.len();
    println!(
        "seed {seed}: {kills} kills ({held_before} aimed before a commit of the bank, \
         {held_after} between its commit and its ACK); at the kills {applied_unconfirmed} \
         applied-unconfirmed and \
         {stored_unapplied} stored-unapplied transfers, {early_kills} kills within 15 ms of a \
         start; {unreported} confirmations not reported (killed after their record)"
    );
}

/// One child of the two-process variant, killed at seeded moments and restarted at once
/// (and killed when dropped, so a failing test leaves no child behind).
struct Side {
    role: &'static str,
    env: Vec<(&'static str, String)>,
    child: Option<process::Child>,
    born: Instant,
    life: Duration,
    kills: u32,
    /// Kills within 15 ms of a start: during its recovery.
    early_kills: u32,
    /// This life's held bank append, the markers seen in it, and how long after the held
    /// one's marker the kill comes.
    hold: Hold,
    markers: Markers,
    hold_delay: Duration,
    /// Kills while a reply was held: after a commit, before its ACK.
    held_kills: u32,
}

impl Side {
    fn new(role: &'static str, env: Vec<(&'static str, String)>) -> Self {
        Side {
            role,
            env,
            child: None,
            born: Instant::now(),
            life: Duration::ZERO,
            kills: 0,
            early_kills: 0,
            hold: Hold::Never,
            markers: Markers::default(),
            hold_delay: Duration::ZERO,
            held_kills: 0,
        }
    }

    /// Starts a child that lives a seeded time: from 15 to 500 ms, and every fourth life less
    /// than 15 ms (killed while it recovers). Every other life of the bank is aimed instead:
    /// killed 0–30 ms after the marker of a seeded append its journal holds.
    fn start(&mut self, rng: &mut SmallRng, kills: u32) {
        let mut env = self.env.clone();
        env.push((CHILD_ROLE, self.role.to_string()));
        env.push((
            CHILD_ACK_DELAY,
            [0, 10, 40][rng.random_range(0..3)].to_string(),
        ));
        // Not the last life, which runs until all is confirmed.
        let aimed = self.role == "consumer" && self.kills.is_multiple_of(2) && self.kills < kills;
        self.hold = self::aimed(rng, aimed);
        self.hold_delay = Duration::from_millis(rng.random_range(0..=30));
        self.markers = Markers::default();
        env.push((CHILD_HOLD, self.hold.encode()));
        self.child = Some(process::spawn(ENTRY, &env));
        self.born = Instant::now();
        let short = self.kills % 4 == 3;
        self.life = if aimed {
            Duration::from_secs(5) // in case the bank commits less often: not aimed then
        } else {
            Duration::from_millis(rng.random_range(if short { 0..15 } else { 15..501 }))
        };
    }

    /// Takes a line of this child: counts the bank's journal's markers, and once the held
    /// append's is seen, makes the kill due `hold_delay` later.
    fn marker_line(&mut self, line: &str) {
        let held = self.hold.is_held(&self.markers);
        if self.markers.take(line, MARKER) && !held && self.hold.is_held(&self.markers) {
            self.life = self.born.elapsed() + self.hold_delay;
        }
    }

    fn child(&self) -> &process::Child {
        self.child.as_ref().expect("started")
    }

    fn is_due(&self, kills: u32) -> bool {
        self.kills < kills && self.born.elapsed() >= self.life
    }

    /// SIGKILLs the child; returns what it printed last.
    fn kill(&mut self) -> Vec<String> {
        self.early_kills += u32::from(self.born.elapsed() < Duration::from_millis(15));
        self.held_kills += u32::from(self.hold.is_held(&self.markers));
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

/// What the test has seen so far, from both children's output.
#[derive(Default)]
struct Seen {
    stored: BTreeSet<u64>,
    confirmed: BTreeSet<u64>,
    /// Reported applied by the bank's consumer (stored in its journal by then).
    applied: BTreeSet<u64>,
    /// The current producer printed `idle`: it holds nothing unconfirmed.
    idle: bool,
}

impl Seen {
    fn line(&mut self, line: &str) {
        let mut words = line.split(' ');
        match (words.next(), words.next().map(|n| n.parse::<u64>())) {
            (Some("stored"), Some(Ok(id))) => {
                self.stored.insert(id);
            }
            (Some("confirmed"), Some(Ok(id))) => {
                self.confirmed.insert(id);
            }
            (Some("applied"), Some(Ok(id))) => {
                self.applied.insert(id);
            }
            (Some("idle"), _) => self.idle = true,
            _ => {}
        }
    }
}

#[test]
fn every_stored_transfer_is_applied_exactly_once_in_order_with_producer_and_bank_killed_apart() {
    let seed: u64 = std::env::var("E2E_SEED").map_or(13, |s| s.parse().unwrap());
    let kills: u32 = std::env::var("E2E_TWO_PROCESS_KILLS").map_or(12, |s| s.parse().unwrap());
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let port = remote::reusable_addr().port();
    let env = vec![
        (CHILD_DIR, dir.path().display().to_string()),
        (CHILD_PORT, port.to_string()),
    ];
    let mut bank_side = Side::new("consumer", env.clone());
    let mut producer_side = Side::new("producer", env);
    bank_side.start(&mut rng, kills);
    producer_side.start(&mut rng, kills);
    let mut seen = Seen::default();
    // At the kills of the bank, from its journal; at the kills of the producer, from what the
    // bank's consumer reported applied by then.
    let (mut bank_applied_unconfirmed, mut bank_stored_unapplied) = (0, 0);
    let (mut producer_applied_unconfirmed, mut producer_stored_unapplied) = (0, 0);
    let started = Instant::now();
    let mut kills_done = None;
    // The highest seq the bank's journal reported committed.
    let mut committed = 0;
    loop {
        for side in [&mut bank_side, &mut producer_side] {
            while let Ok(Some(line)) = side.child().try_line() {
                seen.line(&line);
                side.marker_line(&line);
            }
        }
        if producer_side.is_due(kills) {
            for line in producer_side.kill() {
                seen.line(&line);
            }
            seen.idle = false;
            producer_applied_unconfirmed += seen.applied.difference(&seen.confirmed).count();
            producer_stored_unapplied += seen.stored.difference(&seen.applied).count();
            producer_side.start(&mut rng, kills);
        }
        if bank_side.is_due(kills) {
            for line in bank_side.kill() {
                seen.line(&line);
                bank_side.markers.take(&line, MARKER);
            }
            committed = committed.max(bank_side.markers.committed_seq);
            let context = format!("seed {seed}, bank kill {}", bank_side.kills);
            let (bank, highest) = bank_state(dir.path(), &context);
            check_committed(highest, committed, &context);
            check_bank(&bank, &seen.confirmed, &context);
            let applied: BTreeSet<u64> = bank.applied.iter().copied().collect();
            assert!(
                seen.applied.is_subset(&applied),
                "{context}: reported applied but not in the journal"
            );
            bank_applied_unconfirmed += applied.difference(&seen.confirmed).count();
            bank_stored_unapplied += seen.stored.difference(&applied).count();
            bank_side.start(&mut rng, kills);
        }
        let finishing = producer_side.kills >= kills && bank_side.kills >= kills;
        if finishing && kills_done.is_none() {
            kills_done = Some(started.elapsed());
        }
        if finishing && seen.idle {
            break; // the producer holds nothing unconfirmed
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "seed {seed}: no progress: {} stored, {} confirmed, {} applied",
            seen.stored.len(),
            seen.confirmed.len(),
            seen.applied.len()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let (producer_kills, producer_early) = (producer_side.kills, producer_side.early_kills);
    let (bank_kills, bank_early) = (bank_side.kills, bank_side.early_kills);
    let bank_held = bank_side.held_kills;
    drop((producer_side, bank_side));
    let (bank, _) = bank_state(dir.path(), &format!("seed {seed}, the end"));
    check_bank(&bank, &seen.confirmed, &format!("seed {seed}, the end"));
    assert_eq!(
        bank.applied,
        (1..=TRANSFERS).collect::<Vec<_>>(),
        "seed {seed}: every transfer applied exactly once, in order"
    );
    // A kill between a store's commit and its line loses the line, not the transfer.
    assert!(seen.stored.iter().all(|id| *id <= TRANSFERS));
    assert!(producer_kills >= kills && bank_kills >= kills);
    if kills >= 4 {
        assert!(
            producer_early > 0 && bank_early > 0,
            "seed {seed}: kills during recoveries"
        );
    }
    assert!(
        bank_held >= kills / 4,
        "seed {seed}: only {bank_held} kills of the bank while its journal held an append"
    );
    assert!(
        bank_applied_unconfirmed > 0 && producer_applied_unconfirmed > 0,
        "seed {seed}: no kill between the bank's commit and the confirmation"
    );
    assert!(
        bank_stored_unapplied > 0 && producer_stored_unapplied > 0,
        "seed {seed}: no kill between a store and the bank's commit"
    );
    println!(
        "seed {seed}: {producer_kills} producer kills ({producer_early} within 15 ms of a \
         start), {bank_kills} bank kills ({bank_early} within 15 ms, {bank_held} aimed before \
         a commit or between it and its ACK); at the bank's kills \
         {bank_applied_unconfirmed} applied-unconfirmed and {bank_stored_unapplied} \
         stored-unapplied transfers (its journal), at the producer's kills \
         {producer_applied_unconfirmed} applied-unconfirmed and {producer_stored_unapplied} \
         stored-unapplied (as the bank reported); kills over after {:.1} s, done after {:.1} s",
        kills_done.unwrap_or_default().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
