//! A deterministic, seeded simulator of chunked delivery, built only from the crate's pure
//! cores: `ChunkedProducer`s (a `ProducerCore` underneath) and one `ConsumerCore` reassembling
//! their messages, in virtual time (no actix, no tokio, no real time).
//!
//! # What it models
//!
//! One to three producers, windows of 1 to 8 chunks (often fewer than a message's chunks),
//! chunks of 128 to 512 bytes, messages of up to 4000 bytes (up to 32 chunks) handed over at
//! seeded times. Links in both directions lose, duplicate and delay (so reorder) messages.
//! Handlers take virtual time and fail (no ACK). The consumer restarts (its dedup windows and
//! partial messages lost, its running handler abandoned); producers restart mid-message (a new
//! incarnation: what they held is settled as stopped and handed to them again). In the tight
//! class, several producers share a `max_reassembly_bytes` of one to two largest messages,
//! with a `max_out_of_order` of 1 to 4. After `heal_at` links lose nothing, handlers succeed
//! and nothing restarts. The consumer expects messages at half the slowest producer's pace
//! once healed (`min_reassembly_rate`: a window of chunks per round trip), as a deployment
//! must (before the heal, a message may outlive its lifetime: it is dropped, and sent again
//! in a round).
//!
//! Six classes (seed `s` is of class `s % 6`): lossy, ordered, consumer restarts, producer
//! restarts, tight, all together.
//!
//! # Invariants
//!
//! As the run goes: the handler only ever runs on a whole message, byte for byte the one
//! handed to its producer, for the producer incarnation and last seq it was sent under, with
//! its first chunk's seq as `first_seq`; no message runs successfully twice while the consumer
//! lives; a message is confirmed at most once, and only after a successful handler run of it
//! (its last chunk's ACK); no honest chunk becomes a dead letter; a producer never has more
//! chunks in flight than its window; the consumer never holds more than
//! `max_reassembly_bytes`, nor more partial messages than producer incarnations. After the
//! run: every message confirmed exactly once within the liveness bound after the heal (no
//! stall). Per class, the class's faults were injected (counters > 0), so nothing passes
//! vacuously. Two planted faults are caught: a consumer that ACKs the last chunk on receipt
//! (confirmed without a handler run), and a producer that sends no rounds (a consumer restart
//! then stalls the message).
//!
//! # Replay
//!
//! `CHUNK_SIM_SEED=17 cargo test -p actix-delivery-proto --test simulations chunking_sim --
//! --nocapture` runs one seed;
//! `CHUNK_SIM_SEEDS=1000` runs more seeds per class (default 40).

mod scenario;
mod world;

use scenario::{Class, Scenario, Wiring, CLASSES};
use world::{Counts, World};

/// Seeds per class: `CHUNK_SIM_SEEDS`, default 40.
fn seeds_per_class() -> u64 {
    std::env::var("CHUNK_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
}

/// The seeds to run: `CHUNK_SIM_SEED` alone, or the matrix.
fn seeds() -> Vec<u64> {
    match std::env::var("CHUNK_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => vec![seed],
        None => (0..seeds_per_class() * CLASSES.len() as u64).collect(),
    }
}

/// Runs `sc`; its counts, or a report of what it broke.
fn run(sc: &Scenario) -> Result<Counts, String> {
    let mut world = World::new(sc);
    world.run();
    if world.violations.is_empty() {
        return Ok(world.counts);
    }
    let shown: Vec<&String> = world.violations.iter().take(8).collect();
    Err(format!(
        "seed {} ({:?}, {:?}) broke {} rule(s): {shown:#?}\nscenario: {sc:#?}\ncounts: {:?}",
        sc.seed,
        sc.class,
        sc.wiring,
        world.violations.len(),
        world.counts
    ))
}

/// Runs the seeds of `class` and checks that its faults were injected.
fn run_class(class: Class) {
    let mut totals = Counts::default();
    let mut runs = 0;
    for seed in seeds() {
        let sc = Scenario::of_seed(seed);
        if sc.class != class {
            continue;
        }
        match run(&sc) {
            Ok(counts) => totals.add(&counts),
            Err(report) => panic!("{report}"),
        }
        runs += 1;
    }
    if runs < 10 {
        return; // a replay of one seed: no totals to speak of
    }
    println!("{class:?}: {runs} runs, {totals:?}");
    assert!(
        totals.messages > 0 && totals.runs >= totals.messages,
        "{totals:?}"
    );
    let injected = match class {
        Class::Lossy | Class::Ordered => {
            vec![
                ("dropped", totals.dropped),
                ("duplicated", totals.duplicated),
            ]
        }
        Class::ConsumerRestarts => vec![
            ("consumer restarts", totals.consumer_restarts),
            ("rounds", totals.rounds),
        ],
        Class::ProducerRestarts => vec![
            ("producer restarts", totals.producer_restarts),
            ("partial messages dropped", totals.partials_dropped),
        ],
        Class::Tight => vec![
            ("chunks refused", totals.chunks_refused),
            ("handler failures", totals.handler_failures),
            ("out-of-order refusals", totals.refused),
        ],
        Class::All => vec![
            ("dropped", totals.dropped),
            ("consumer restarts", totals.consumer_restarts),
            ("producer restarts", totals.producer_restarts),
            ("rounds", totals.rounds),
            ("chunks refused", totals.chunks_refused),
        ],
    };
    for (what, n) in injected {
        assert!(n > 0, "{class:?}: no {what} in {runs} runs: {totals:?}");
    }
}

#[test]
fn lossy_links_every_message_is_handled_whole_and_confirmed_once() {
    run_class(Class::Lossy);
}

#[test]
fn ordered_consumer_every_message_is_handled_whole_and_confirmed_once() {
    run_class(Class::Ordered);
}

#[test]
fn consumer_restarts_mid_message_are_recovered_by_rounds() {
    run_class(Class::ConsumerRestarts);
}

#[test]
fn producer_restarts_mid_message_leave_nothing_half_delivered() {
    run_class(Class::ProducerRestarts);
}

#[test]
fn tight_reassembly_bounds_never_stall_a_message() {
    run_class(Class::Tight);
}

#[test]
fn all_faults_together() {
    run_class(Class::All);
}

/// The first seeds of `classes` that a planted fault breaks, if any.
fn caught(wiring: Wiring, classes: &[Class], needle: &str) -> Option<String> {
    (0..120).find_map(|seed| {
        let mut sc = Scenario::of_seed(seed);
        if !classes.contains(&sc.class) {
            return None;
        }
        sc.wiring = wiring;
        run(&sc).err().filter(|report| report.contains(needle))
    })
}

#[test]
fn planted_a_consumer_acking_the_last_chunk_on_receipt_is_caught() {
    let report = caught(
        Wiring::AckLastOnReceipt,
        &[Class::Lossy, Class::Tight],
        "confirmed without a successful handler run",
    );
    assert!(report.is_some(), "the planted fault went unnoticed");
}

#[test]
fn planted_a_producer_without_rounds_is_caught() {
    let report = caught(
        Wiring::NoRounds,
        &[Class::ConsumerRestarts],
        "confirmed 0 times",
    );
    assert!(report.is_some(), "the planted fault went unnoticed");
}
