//! Throughput of the SQLite journal: one fsync per append against group commit, printed as
//! the markdown table `benches/README.md` quotes, plus the memory a queued append costs.
//!
//! ```text
//! cargo run --release --example journal_bench            # 1.5 s per case, median of 5 runs
//! cargo run --release --example journal_bench -- 3 7     # seconds per case, runs
//! cargo run --release --example journal_bench -- 3 1 64x1  # only the case 64 × 1
//! ```
//!
//! Every appender owns one stream and awaits each append before the next (as a persistent
//! actor does); events are 200 bytes. The runs of all cases are interleaved, so that a noisy
//! neighbour hurts them alike; each run starts from a fresh file in a temporary directory.

use std::cell::Cell;
use std::time::{Duration, Instant};

use actix_delivery::journal::{Journal, PersistenceId, SqliteJournal, SqliteOptions};
use futures_util::FutureExt;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;
#[path = "support/thousands.rs"]
mod thousands;

use thousands::thousands;

const EVENT_BYTES: usize = 200;

#[derive(Clone, Copy)]
struct Case {
    appenders: usize,
    events_per_append: usize,
}

const CASES: [Case; 5] = [
    Case {
        appenders: 1,
        events_per_append: 1,
    },
    Case {
        appenders: 8,
        events_per_append: 1,
    },
    Case {
        appenders: 64,
        events_per_append: 1,
    },
    Case {
        appenders: 1,
        events_per_append: 100,
    },
    Case {
        appenders: 64,
        events_per_append: 100,
    },
];

struct Measured {
    events_per_second: f64,
    appends_per_second: f64,
    appends_per_transaction: f64,
    micros_per_append: f64,
}

fn main() {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args
        .next()
        .map_or(1.5, |a| a.parse().expect("seconds per case"));
    let runs: usize = args.next().map_or(5, |a| a.parse().expect("runs"));
    let only = args.next();
    let cases: Vec<Case> = CASES
        .into_iter()
        .filter(|case| {
            only.as_deref()
                .is_none_or(|only| only == format!("{}x{}", case.appenders, case.events_per_append))
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let mut results: Vec<Vec<Measured>> = cases.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for (case, results) in cases.iter().zip(&mut results) {
            results.push(runtime.block_on(measure(*case, Duration::from_secs_f64(seconds))));
        }
        eprintln!("run {} of {runs} done", run + 1);
    }
    print_table(&cases, &results, seconds, runs);
    runtime.block_on(memory_per_queued_append());
}

/// Runs `case` for `duration` on a fresh journal.
async fn measure(case: Case, duration: Duration) -> Measured {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = SqliteJournal::open(dir.path().join("bench.db"))
        .await
        .expect("open the journal");
    let payload = vec![0xA5u8; EVENT_BYTES];
    let stop = std::rc::Rc::new(Cell::new(false));
    let local = tokio::task::LocalSet::new();
    let started = Instant::now();
    let before = journal.stats();
    let appenders: Vec<_> = (0..case.appenders)
        .map(|i| {
            let (journal, stop, payload) = (journal.clone(), stop.clone(), payload.clone());
            local.spawn_local(async move {
                let id = PersistenceId::new(format!("bench-{i}")).expect("a valid id");
                let mut next = 1;
                while !stop.get() {
                    let batch = vec![payload.clone(); case.events_per_append];
                    journal.append(&id, next, batch).await.expect("append");
                    next += case.events_per_append as u64;
                }
            })
        })
        .collect();
    local
        .run_until(async {
            tokio::time::sleep(duration).await;
            stop.set(true);
            for appender in appenders {
                appender.await.expect("an appender panicked");
            }
        })
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    let after = journal.stats();
    let appends = (after.appends - before.appends) as f64;
    let transactions = (after.transactions - before.transactions) as f64;
    Measured {
        events_per_second: (after.events - before.events) as f64 / elapsed,
        appends_per_second: appends / elapsed,
        appends_per_transaction: appends / transactions.max(1.0),
        micros_per_append: elapsed * 1e6 * case.appenders as f64 / appends.max(1.0),
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn print_table(cases: &[Case], results: &[Vec<Measured>], seconds: f64, runs: usize) {
    println!("# SQLite journal throughput\n");
    println!(
        "{EVENT_BYTES}-byte events, each appender awaits its append before the next; \
         {seconds} s per case, median of {runs} runs.\n"
    );
    println!(
        "| appenders × events per append | events/s | appends/s | appends per fsync | \
         µs per append | events/s vs one fsync per append |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let baseline = median(results[0].iter().map(|m| m.events_per_second));
    for (case, measured) in cases.iter().zip(results) {
        let events = median(measured.iter().map(|m| m.events_per_second));
        println!(
            "| {} × {} | {} | {} | {:.1} | {:.0} | {:.1}× |",
            case.appenders,
            case.events_per_append,
            thousands(events),
            thousands(median(measured.iter().map(|m| m.appends_per_second))),
            median(measured.iter().map(|m| m.appends_per_transaction)),
            median(measured.iter().map(|m| m.micros_per_append)),
            events / baseline,
        );
    }
    println!();
}

/// Heap bytes per append waiting in the writer's queue: the writer is held up by another
/// connection's write lock while appends pile up.
async fn memory_per_queued_append() {
    const QUEUED: usize = 4_000;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = SqliteJournal::open_with(
        dir.path().join("memory.db"),
        SqliteOptions::builder()
            .queue_capacity(QUEUED + 1)
            .build()
            .expect("valid options"),
    )
    .await
    .expect("open the journal");
    let lock = rusqlite::Connection::open(journal.path()).expect("a second connection");
    lock.execute_batch("BEGIN IMMEDIATE")
        .expect("the write lock");
    let ids: Vec<_> = (0..QUEUED)
        .map(|i| PersistenceId::new(format!("memory-{i}")).expect("a valid id"))
        .collect();
    let mut appends = Vec::with_capacity(QUEUED);
    let baseline = counting_alloc::live_bytes();
    for id in &ids {
        appends.push(journal.append(id, 1, vec![vec![0u8; EVENT_BYTES]]));
    }
    for append in &mut appends {
        let polled = tokio::task::unconstrained(append).now_or_never();
        assert!(polled.is_none(), "the writer is blocked: appends wait");
    }
    let total = counting_alloc::heap_since(baseline) as f64 / QUEUED as f64;
    lock.execute_batch("ROLLBACK").expect("release the lock");
    for append in appends {
        append.await.expect("append");
    }
    let payload = (EVENT_BYTES + std::mem::size_of::<Vec<u8>>()) as f64;
    println!("# Memory per queued append\n");
    println!("| what | bytes |\n|---|---:|");
    println!(
        "| one queued append of one {EVENT_BYTES}-byte event, all in (payload, request, reply \
         channel, the caller's boxed future) | {total:.0} |"
    );
    println!(
        "| of which beyond the payload and its `Vec` | {:.0} |",
        total - payload
    );
    println!();
}
