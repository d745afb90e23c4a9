//! What work pulling costs and how it scales, printed as the markdown `benches/README.md`
//! quotes.
//!
//! ```text
//! cargo run --release --example work_pulling_bench              # defaults below
//! cargo run --release --example work_pulling_bench -- 50000 3000 5
//! #                                  fast jobs per run ─┘     │    └─ runs
//! #            1 ms jobs per run (at least; 1 000 per worker) ┘
//! WP_BENCH_ONLY=fast cargo run --release --example work_pulling_bench   # one table only
//! ```
//!
//! Every case runs in this one process, on one arbiter (thread): the code that sends, the
//! producer, the pool, the worker streams and the workers. Two handlers:
//!
//! - **fast**: `async { Ok(()) }`, ready at once: what the machinery itself costs per job;
//! - **1 ms**: `tokio::time::sleep(1 ms)`: a worker that waits (I/O, not CPU), where adding
//!   workers should multiply the throughput (the consumer runs one handler at a time, so one
//!   worker does at most ~1 000 jobs/s).
//!
//! A run hands all its jobs over at once (`tell` with no confirmation callback, `max_pending`
//! large enough, so the pool is always fed) and is timed until the producer is idle: every job
//! confirmed (a work-pulling job is confirmed when a worker's stream confirmed it). Each case
//! gets a warm-up run (a fifth of the jobs, not counted), then the runs of all cases are
//! interleaved so that a noisy neighbour hurts them alike; the table gives the median and the
//! spread (min–max) of the runs.
//!
//! Baselines measured in the same run: plain Actix `do_send` to a counting actor (fast case
//! only) and a plain point-to-point reliable producer (`ReliableDelivery::producer`, window
//! 16, the default, which is also the worker streams' default) to one consumer with the same
//! handler.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use actix::System;
use actix_delivery::work_pulling::{Job, WorkPullingHandle, WorkPullingOptions, WorkerRegistry};
use actix_delivery::ProducerConfig;
use actix_delivery::{
    Confirmation, ConsumerHandle, ConsumerOptions, DeliveryHandler, ProducerHandle,
    ProducerOptions, ReliableDelivery,
};

#[path = "support/report_header.rs"]
mod report_header;
#[path = "../benches/support/mod.rs"]
mod support;
#[path = "support/thousands.rs"]
mod thousands;

use support::{Placement, PlainRig, Site, MAX_PENDING};
use thousands::thousands;

/// What the workers' (and the point-to-point consumer's) handler does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    /// Ready at once.
    Fast,
    /// Waits 1 ms on a timer.
    Timer,
}

impl Work {
    async fn run(self) -> Result<(), Infallible> {
        if self == Work::Timer {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    fn label(self) -> &'static str {
        match self {
            Work::Fast => "fast handler (ready at once)",
            Work::Timer => "1 ms handler (timer)",
        }
    }
}

/// One throughput case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// Plain Actix `do_send` to a counter (no reliability at all).
    PlainDoSend,
    /// A plain reliable producer to one consumer, window 16.
    PointToPoint(Work),
    /// A work-pulling producer with `workers` workers, worker streams of `window`.
    WorkPulling {
        work: Work,
        workers: usize,
        window: usize,
    },
}

impl Case {
    fn work(self) -> Work {
        match self {
            Case::PlainDoSend => Work::Fast,
            Case::PointToPoint(work) | Case::WorkPulling { work, .. } => work,
        }
    }

    fn label(self) -> String {
        match self {
            Case::PlainDoSend => "plain Actix `do_send` (no reliability)".into(),
            Case::PointToPoint(_) => {
                "point-to-point reliable producer → 1 consumer, window 16".into()
            }
            Case::WorkPulling {
                workers, window, ..
            } => format!(
                "work pulling, {workers} worker{}, worker window {window}{}",
                if workers == 1 { "" } else { "s" },
                if window == 16 { " (default)" } else { "" }
            ),
        }
    }
}

/// The cases of the report, fast ones first (`only`: `fast`, `timer`, or for profiling one
/// case alone, `fast-p2p` or `fast-wp`).
fn cases(only: Option<&str>) -> Vec<Case> {
    match only {
        Some("fast-p2p") => return vec![Case::PointToPoint(Work::Fast)],
        Some("fast-wp") => {
            return vec![Case::WorkPulling {
                work: Work::Fast,
                workers: 1,
                window: 16,
            }]
        }
        _ => {}
    }
    let mut cases = Vec::new();
    if only != Some("timer") {
        cases.push(Case::PlainDoSend);
        cases.push(Case::PointToPoint(Work::Fast));
        for window in [16, 64, 256] {
            cases.push(Case::WorkPulling {
                work: Work::Fast,
                workers: 1,
                window,
            });
        }
    }
    if only != Some("fast") {
        cases.push(Case::PointToPoint(Work::Timer));
        for workers in [1, 2, 4, 8] {
            cases.push(Case::WorkPulling {
                work: Work::Timer,
                workers,
                window: 16,
            });
        }
        for window in [1, 2, 4] {
            cases.push(Case::WorkPulling {
                work: Work::Timer,
                workers: 8,
                window,
            });
        }
    }
    cases
}

fn consumer<T: Send + 'static>(work: Work) -> ConsumerHandle<T> {
    ReliableDelivery::consumer(
        ConsumerOptions::builder(DeliveryHandler::from_fn(move |_: T| work.run()))
            .build()
            .expect("default consumer options are valid"),
    )
}

/// The actors of one case.
enum Rig {
    Plain(PlainRig),
    PointToPoint {
        producer: ProducerHandle<u64>,
        consumer: ConsumerHandle<u64>,
    },
    WorkPulling {
        producer: WorkPullingHandle<u64>,
        workers: Vec<ConsumerHandle<Job<u64>>>,
    },
}

impl Rig {
    async fn new(case: Case, site: &Site) -> Self {
        match case {
            Case::PlainDoSend => Rig::Plain(PlainRig::new(site)),
            Case::PointToPoint(work) => {
                let consumer = consumer::<u64>(work);
                let producer = ReliableDelivery::producer(
                    ProducerOptions::builder(&consumer)
                        .window_size(16)
                        .max_pending(MAX_PENDING)
                        .build()
                        .expect("valid producer options"),
                );
                Rig::PointToPoint { producer, consumer }
            }
            Case::WorkPulling {
                work,
                workers,
                window,
            } => {
                let registry = WorkerRegistry::<u64>::new();
                let workers: Vec<_> = (0..workers)
                    .map(|i| {
                        let worker = consumer::<Job<u64>>(work);
                        registry
                            .register_consumer(&format!("worker-{i}"), &worker)
                            .expect("a fresh name");
                        worker
                    })
                    .collect();
                let options = WorkPullingOptions::builder(&registry)
                    .producer(ProducerConfig {
                        max_pending: MAX_PENDING,
                        ..WorkPullingOptions::<u64>::default_producer()
                    })
                    .worker(ProducerConfig {
                        window_size: window,
                        ..ProducerConfig::default()
                    })
                    .build()
                    .expect("valid work-pulling options");
                let producer = ReliableDelivery::work_pulling_producer(options);
                let present = producer.pool_stats().await.expect("pool runs").workers;
                assert_eq!(present, workers.len(), "every worker joined the pool");
                Rig::WorkPulling { producer, workers }
            }
        }
    }

    fn producer(&self) -> Option<&ProducerHandle<u64>> {
        match self {
            Rig::Plain(_) => None,
            Rig::PointToPoint { producer, .. } => Some(producer),
            Rig::WorkPulling { producer, .. } => Some(producer.producer()),
        }
    }

    /// Hands `n` jobs over at once and returns the time until all are confirmed.
    async fn run(&mut self, n: u64) -> Duration {
        if let Rig::Plain(plain) = self {
            return plain.do_send_burst(n).await;
        }
        let producer = self.producer().expect("a reliable rig");
        let start = Instant::now();
        for body in 0..n {
            if producer.tell(body, Confirmation::none()).is_err() {
                panic!("tell refused (max_pending too small or producer stopped)");
            }
        }
        producer.idle().await;
        start.elapsed()
    }

    /// Checks that every job was confirmed once and handled once; returns the retransmissions
    /// of the producer (0 unless something waited longer than `resend_timeout`) and, for work
    /// pulling, the jobs per worker.
    async fn check(&self, expected: u64) -> (u64, Vec<u64>) {
        let Some(producer) = self.producer() else {
            return (0, Vec::new());
        };
        let stats = producer.stats().await.expect("producer runs");
        assert_eq!(stats.confirmed, expected, "every job confirmed");
        match self {
            Rig::Plain(_) => unreachable!(),
            Rig::PointToPoint { consumer, .. } => {
                let delivered = consumer.stats().await.expect("consumer runs").delivered;
                assert_eq!(delivered, expected, "one handler run per job");
                (stats.retransmitted, Vec::new())
            }
            Rig::WorkPulling { producer, workers } => {
                let pool = producer.pool_stats().await.expect("pool runs");
                assert_eq!(pool.confirmed, expected, "the pool confirmed every job");
                assert_eq!(pool.rerouted, 0, "no worker left");
                let mut delivered = 0;
                for worker in workers {
                    delivered += worker.stats().await.expect("worker runs").delivered;
                }
                assert_eq!(delivered, expected, "one handler run per job");
                let per_worker = pool.per_worker.iter().map(|w| w.confirmed).collect();
                (stats.retransmitted, per_worker)
            }
        }
    }
}

/// Jobs per run: the fast ones, or for the 1 ms handler at least 1 000 per worker.
fn jobs(case: Case, fast: u64, timer: u64) -> u64 {
    match case {
        Case::WorkPulling {
            work: Work::Timer,
            workers,
            ..
        } => timer.max(1000 * workers as u64),
        case if case.work() == Work::Timer => timer,
        _ => fast,
    }
}

#[actix::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let mut args = std::env::args().skip(1);
    let mut arg = |name: &str, default: u64| {
        args.next().map_or(default, |a| {
            a.parse().unwrap_or_else(|_| panic!("{name}: a number"))
        })
    };
    let fast = arg("fast jobs", 50_000);
    let timer = arg("1 ms jobs", 3_000);
    let runs = arg("runs", 5) as usize;
    assert!(fast > 0 && timer > 0 && runs > 0);
    let only = std::env::var("WP_BENCH_ONLY").ok();
    let cases = cases(only.as_deref());

    print_header(fast, timer, runs);
    let site = Site::new(Placement::SameArbiter);
    let mut rigs = Vec::new();
    for &case in &cases {
        rigs.push(Rig::new(case, &site).await);
    }
    let mut expected = vec![0u64; cases.len()];
    for (i, &case) in cases.iter().enumerate() {
        let n = (jobs(case, fast, timer) / 5).max(1);
        rigs[i].run(n).await;
        expected[i] += n;
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    // The fast cases take well under a second a run: each round goes over them three times,
    // so that their medians (of 3 × runs) are less at the mercy of a neighbour's burst.
    for _ in 0..runs {
        for pass in 0..3 {
            for (i, &case) in cases.iter().enumerate() {
                if pass > 0 && case.work() == Work::Timer {
                    continue;
                }
                let n = jobs(case, fast, timer);
                times[i].push(rigs[i].run(n).await);
                expected[i] += n;
            }
        }
    }
    let mut retransmissions = 0;
    let mut spread_note = Vec::new();
    for (i, &case) in cases.iter().enumerate() {
        let (retransmitted, per_worker) = rigs[i].check(expected[i]).await;
        retransmissions += retransmitted;
        if per_worker.len() > 1 {
            let (min, max) = (
                per_worker.iter().min().copied().unwrap_or(0),
                per_worker.iter().max().copied().unwrap_or(0),
            );
            spread_note.push(format!("{}: {min}–{max}", case.label()));
        }
    }

    // Throughput per case: median and spread of the runs.
    let stats: Vec<(f64, f64, f64)> = cases
        .iter()
        .zip(&mut times)
        .map(|(&case, t)| {
            let n = jobs(case, fast, timer) as f64;
            t.sort_unstable();
            let thr = |d: &Duration| n / d.as_secs_f64();
            (thr(&t[t.len() / 2]), thr(&t[t.len() - 1]), thr(&t[0]))
        })
        .collect();
    let thr = |wanted: Case| cases.iter().position(|&c| c == wanted).map(|i| stats[i].0);

    for work in [Work::Fast, Work::Timer] {
        let rows: Vec<usize> = (0..cases.len())
            .filter(|&i| cases[i].work() == work)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let p2p = thr(Case::PointToPoint(work));
        let one = thr(Case::WorkPulling {
            work,
            workers: 1,
            window: 16,
        });
        let ratio = |p2p: Option<f64>, this: Option<f64>| match (p2p, this) {
            (Some(p2p), Some(this)) => format!("{:.2}×", p2p / this),
            _ => String::new(),
        };
        println!(
            "\n## {} ({} jobs per run)\n",
            work.label(),
            if work == Work::Fast {
                fast.to_string()
            } else {
                format!("max({timer}, 1 000 × workers)")
            }
        );
        if work == Work::Fast {
            let plain = thr(Case::PlainDoSend);
            println!(
                "| case | jobs/s (median) | spread of the runs | µs per job | time vs plain `do_send` | point-to-point jobs/s ÷ these |"
            );
            println!("|---|---:|---:|---:|---:|---:|");
            for i in rows {
                let (median, low, high) = stats[i];
                println!(
                    "| {} | {} | {}–{} | {:.3} | {} | {} |",
                    cases[i].label(),
                    thousands(median),
                    thousands(low),
                    thousands(high),
                    1e6 / median,
                    plain.map_or(String::new(), |plain| format!("{:.1}×", plain / median)),
                    ratio(p2p, Some(median)),
                );
            }
        } else {
            println!(
                "| case | jobs/s (median) | spread of the runs | vs 1 worker | efficiency (vs workers × 1 worker) | point-to-point jobs/s ÷ these |"
            );
            println!("|---|---:|---:|---:|---:|---:|");
            for i in rows {
                let (median, low, high) = stats[i];
                let (speedup, efficiency) = match (cases[i], one) {
                    (Case::WorkPulling { workers, .. }, Some(one)) => (
                        format!("{:.2}×", median / one),
                        format!("{:.0} %", 100.0 * median / (workers as f64 * one)),
                    ),
                    _ => ("".into(), "".into()),
                };
                println!(
                    "| {} | {} | {}–{} | {speedup} | {efficiency} | {} |",
                    cases[i].label(),
                    thousands(median),
                    thousands(low),
                    thousands(high),
                    ratio(p2p, Some(median)),
                );
            }
        }
        if let (Some(_), Some(_)) = (p2p, one) {
            println!(
                "\nOverhead, one ready worker (default window 16): point-to-point jobs/s ÷ work \
                 pulling jobs/s = {} (target ≤ 1.3×)",
                ratio(p2p, one)
            );
        }
        if let (Work::Timer, Some(one)) = (work, one)
            && let Some(eight) = thr(Case::WorkPulling {
                work,
                workers: 8,
                window: 16,
            })
        {
            println!(
                "Scaling efficiency at 8 workers: thr(8) / (8 × thr(1)) = {:.0} % (target ≥ 80 %)",
                100.0 * eight / (8.0 * one)
            );
        }
    }
    if !spread_note.is_empty() {
        println!("\nJobs per worker over the whole run (min–max):");
        for note in spread_note {
            println!("- {note}");
        }
    }
    println!(
        "\nRetransmissions by the producers during the run: {retransmissions} (non-zero means a \
         job waited longer than `resend_timeout` for its ACK: an overloaded machine)."
    );
    site.stop();
    System::current().stop();
}

fn print_header(fast: u64, timer: u64, runs: usize) {
    report_header::print("actix-delivery work-pulling benchmark");
    println!(
        "- method: everything on one arbiter; a run = N × `tell(_, Confirmation::none())` at \
         once, timed until `idle()` (all N confirmed); {fast} fast jobs or max({timer}, 1 000 × \
         workers) 1 ms jobs per run, a warm-up run of N/5 per case, then {runs} interleaved runs \
         per case ({} for the fast ones), median; work-pulling producer: default settings but \
         `max_pending`",
        3 * runs
    );
}
