//! Throughput of the PostgreSQL journal: one append at a time against 64 concurrent
//! appenders (group commit), beside the SQLite journal on the same machine in the same run,
//! printed as the markdown table `benches/README.md` quotes.
//!
//! ```text
//! cargo run --release --features postgres --example postgres_bench            # 2 s per case, median of 5 runs
//! cargo run --release --features postgres --example postgres_bench -- 1 3     # seconds per case, runs
//! ```
//!
//! The server comes from `ACTIX_DELIVERY_POSTGRES` (default
//! `host=127.0.0.1 port=5432 user=postgres dbname=test`); the bench works in a schema of its
//! own, dropped at the end. Every appender owns one stream and awaits each append before the
//! next (as a persistent actor does); one 200-byte event per append. The runs of all cases
//! are interleaved, so that a noisy neighbour hurts them alike.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_delivery::journal::{
    Journal, PersistenceId, PostgresJournal, PostgresOptions, SqliteJournal,
};

#[path = "support/thousands.rs"]
mod thousands;

use thousands::thousands;

const EVENT_BYTES: usize = 200;
const URL_VAR: &str = "ACTIX_DELIVERY_POSTGRES";
const DEFAULT_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";

#[derive(Clone, Copy, PartialEq)]
enum Store {
    Postgres,
    Sqlite,
}

#[derive(Clone, Copy)]
struct Case {
    store: Store,
    appenders: usize,
}

const CASES: [Case; 4] = [
    Case {
        store: Store::Postgres,
        appenders: 1,
    },
    Case {
        store: Store::Postgres,
        appenders: 64,
    },
    Case {
        store: Store::Sqlite,
        appenders: 1,
    },
    Case {
        store: Store::Sqlite,
        appenders: 64,
    },
];

struct Measured {
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
        .map_or(2.0, |a| a.parse().expect("seconds per case"));
    let runs: usize = args.next().map_or(5, |a| a.parse().expect("runs"));
    let url = std::env::var(URL_VAR).unwrap_or_else(|_| DEFAULT_URL.to_string());
    let schema = format!("actix_delivery_bench_{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let postgres = runtime
        .block_on(PostgresJournal::connect_with(
            &url,
            PostgresOptions::builder()
                .schema(&schema)
                .build()
                .expect("valid options"),
        ))
        .unwrap_or_else(|err| panic!("cannot connect ({URL_VAR}, default {DEFAULT_URL:?}): {err}"));
    let mut results: Vec<Vec<Measured>> = CASES.iter().map(|_| Vec::new()).collect();
    for run in 0..runs {
        for (case, results) in CASES.iter().zip(&mut results) {
            let duration = Duration::from_secs_f64(seconds);
            let measured = runtime.block_on(async {
                match case.store {
                    Store::Postgres => {
                        measure(&postgres, *case, run, duration, || {
                            let stats = postgres.stats();
                            (stats.appends, stats.transactions)
                        })
                        .await
                    }
                    Store::Sqlite => {
                        let dir = tempfile::tempdir().expect("a temporary directory");
                        let sqlite = SqliteJournal::open(dir.path().join("bench.db"))
                            .await
                            .expect("open the SQLite journal");
                        let stats = || {
                            let stats = sqlite.stats();
                            (stats.appends, stats.transactions)
                        };
                        measure(&sqlite, *case, run, duration, stats).await
                    }
                }
            });
            results.push(measured);
        }
        eprintln!("run {} of {runs} done", run + 1);
    }
    print_table(&results, seconds, runs);
    runtime.block_on(async {
        postgres.close().await;
        drop_schema(&url, &schema).await;
    });
}

/// Runs `case` for `duration`; `stats` reads (appends, transactions) of the journal.
async fn measure<J: Journal + Clone>(
    journal: &J,
    case: Case,
    run: usize,
    duration: Duration,
    stats: impl Fn() -> (u64, u64),
) -> Measured {
    let payload = vec![0xA5u8; EVENT_BYTES];
    let stop = Rc::new(Cell::new(false));
    let local = tokio::task::LocalSet::new();
    let (appends_before, transactions_before) = stats();
    let started = Instant::now();
    let appenders: Vec<_> = (0..case.appenders)
        .map(|i| {
            let (journal, stop, payload) = (journal.clone(), stop.clone(), payload.clone());
            local.spawn_local(async move {
                let id = PersistenceId::new(format!("bench-{run}-{}-{i}", case.appenders))
                    .expect("a valid id");
                let mut next = 1;
                while !stop.get() {
                    journal
                        .append(&id, next, vec![payload.clone()])
                        .await
                        .expect("append");
                    next += 1;
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
    let (appends_after, transactions_after) = stats();
    let appends = (appends_after - appends_before) as f64;
    let transactions = (transactions_after - transactions_before) as f64;
    Measured {
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

fn print_table(results: &[Vec<Measured>], seconds: f64, runs: usize) {
    println!("# PostgreSQL journal throughput\n");
    println!(
        "One {EVENT_BYTES}-byte event per append, each appender awaits its append before the \
         next; {seconds} s per case, median of {runs} runs.\n"
    );
    println!(
        "| journal | appenders | appends/s | appends per transaction | µs per append | \
         vs the same journal, 1 appender |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut sequential = 0.0;
    for (case, measured) in CASES.iter().zip(results) {
        let rate = median(measured.iter().map(|m| m.appends_per_second));
        if case.appenders == 1 {
            sequential = rate;
        }
        println!(
            "| {} | {} | {} | {:.1} | {:.0} | {:.1}× |",
            match case.store {
                Store::Postgres => "PostgreSQL",
                Store::Sqlite => "SQLite",
            },
            case.appenders,
            thousands(rate),
            median(measured.iter().map(|m| m.appends_per_transaction)),
            median(measured.iter().map(|m| m.micros_per_append)),
            rate / sequential,
        );
    }
    println!();
}

async fn drop_schema(url: &str, schema: &str) {
    let Ok((client, connection)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else {
        eprintln!("could not connect to drop schema {schema}");
        return;
    };
    tokio::spawn(connection);
    if let Err(err) = client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
    {
        eprintln!("could not drop schema {schema}: {err}");
    }
}
