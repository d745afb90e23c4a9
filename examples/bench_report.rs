//! A short benchmark of the end-to-end cases, printed as the markdown `benches/README.md` quotes.
//!
//! ```text
//! cargo run --release --example bench_report                 # 10 000 messages, median of 5
//! cargo run --release --example bench_report -- 50000 7     # messages per run, runs
//! cargo run --release --features metrics --example bench_report  # with a recorder installed
//! cargo run --release --example bench_report --features tracing  # with spans recorded
//! ```
//!
//! With the feature `metrics`, a Prometheus recorder (`metrics-exporter-prometheus`, no HTTP
//! listener) is installed first and aggregates every metric of the run, as in production; the
//! report ends with how many series it rendered.
//!
//! With the feature `tracing`, a subscriber records the crate's spans at `INFO` (a registry
//! with a `fmt` layer, writing to a sink): the cost of the spans with a real subscriber.
//! `BENCH_TRACING=debug` records `DEBUG` too, which includes a span per handler run.
//!
//! For profiles, `BENCH_REPORT_ONLY=<text>` keeps only the cases whose label contains it
//! (plain `do_send`, the reference, always runs), only the first placement unless the text is
//! also in the placement's label (`BENCH_REPORT_ONLY=<text>@<placement text>`), and skips the
//! latency tables: `BENCH_REPORT_ONLY='window 64, ready@same'`.
//!
//! Every case runs in this one process, against plain Actix messaging measured alongside it:
//! throughput (messages per second until the last is confirmed, median of the runs; the runs
//! of all cases are interleaved so that a noisy neighbour hurts them alike) and latency from
//! the `send` call to the confirmation. The workloads are those of the criterion bench `delivery`
//! (shared through `benches/support/mod.rs`); use the criterion benches for confidence
//! intervals.

use std::time::Duration;

use actix::System;

#[path = "support/report_header.rs"]
mod report_header;
#[path = "../benches/support/mod.rs"]
mod support;
#[path = "support/thousands.rs"]
mod thousands;

use support::{
    HandlerKind, Placement, PlainRig, ReliableRig, Route, Site, PIPELINE_DEPTH, WINDOWS,
};
use thousands::thousands;

/// A throughput case.
#[derive(Clone, Copy)]
enum Case {
    PlainDoSend,
    PlainSendSequential,
    PlainSendPipelined,
    Reliable(HandlerKind, usize, Route),
}

impl Case {
    fn all() -> Vec<Case> {
        let mut cases = vec![
            Case::PlainDoSend,
            Case::PlainSendSequential,
            Case::PlainSendPipelined,
        ];
        for kind in [HandlerKind::Ready, HandlerKind::YieldOnce] {
            cases.extend(WINDOWS.map(|window| Case::Reliable(kind, window, Route::ConsumerRef)));
        }
        cases.push(Case::Reliable(
            HandlerKind::YieldTwice,
            16,
            Route::ConsumerRef,
        ));
        for window in [16, 256] {
            cases.push(Case::Reliable(HandlerKind::Ready, window, Route::Recipient));
        }
        cases
    }

    fn label(self) -> String {
        match self {
            Case::PlainDoSend => "plain `do_send`".into(),
            Case::PlainSendSequential => "plain `send().await`, 1 in flight".into(),
            Case::PlainSendPipelined => format!("plain `send().await`, {PIPELINE_DEPTH} in flight"),
            Case::Reliable(kind, window, Route::ConsumerRef) => {
                format!("reliable, window {window}, {}", kind.label())
            }
            Case::Reliable(kind, window, Route::Recipient) => format!(
                "reliable, window {window}, {}, via `recipient()` (unbatched)",
                kind.label()
            ),
        }
    }
}

/// The actors of one placement: a counter and one reliable pipeline per reliable case.
struct Rigs {
    site: Site,
    plain: PlainRig,
    reliable: Vec<((HandlerKind, usize, Route), ReliableRig)>,
}

impl Rigs {
    fn new(placement: Placement, cases: &[Case]) -> Self {
        let site = Site::new(placement);
        let plain = PlainRig::new(&site);
        let reliable = cases
            .iter()
            .filter_map(|case| match *case {
                Case::Reliable(kind, window, route) => Some((
                    (kind, window, route),
                    ReliableRig::with_route(&site, window, kind, route),
                )),
                _ => None,
            })
            .collect();
        Self {
            site,
            plain,
            reliable,
        }
    }

    fn reliable(&mut self, kind: HandlerKind, window: usize, route: Route) -> &mut ReliableRig {
        self.reliable
            .iter_mut()
            .find(|(key, _)| *key == (kind, window, route))
            .map(|(_, rig)| rig)
            .expect("a rig per reliable case")
    }

    async fn run(&mut self, case: Case, n: u64) -> Duration {
        match case {
            Case::PlainDoSend => self.plain.do_send_burst(n).await,
            Case::PlainSendSequential => self.plain.send_sequential(n).await,
            Case::PlainSendPipelined => self.plain.send_pipelined(n, PIPELINE_DEPTH).await,
            Case::Reliable(kind, window, route) => {
                self.reliable(kind, window, route).tell_burst(n).await
            }
        }
    }
}

#[actix::main]
async fn main() {
    // The crate logs through `log`: show its warnings (or what RUST_LOG asks for) on stderr.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    #[cfg(feature = "metrics")]
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this process");
    let mut args = std::env::args().skip(1);
    let messages: u64 = args
        .next()
        .map_or(10_000, |a| a.parse().expect("messages: a number"));
    let runs: usize = args
        .next()
        .map_or(5, |a| a.parse().expect("runs: a number"));
    assert!(messages > 0 && runs > 0);
    #[cfg(feature = "tracing")]
    {
        use tracing_subscriber::filter::LevelFilter;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::Layer;
        let level = match std::env::var("BENCH_TRACING").as_deref() {
            Ok("debug") => LevelFilter::DEBUG,
            _ => LevelFilter::INFO,
        };
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(level);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only subscriber");
        println!("tracing: the crate's spans at {level} recorded (registry + fmt layer to a sink)");
    }
    let latency_samples = messages as usize;

    print_header(messages, runs);
    // `BENCH_REPORT_ONLY=<case text>[@<placement text>]`: (case, placement), "" for no placement.
    let only = std::env::var("BENCH_REPORT_ONLY").ok();
    let only = only
        .as_deref()
        .map(|only| only.split_once('@').unwrap_or((only, "")));
    let cases: Vec<Case> = Case::all()
        .into_iter()
        .filter(|case| {
            matches!(case, Case::PlainDoSend)
                || only.is_none_or(|(text, _)| case.label().contains(text))
        })
        .collect();
    let placements = Placement::ALL.into_iter().filter(|p| match only {
        None => true,
        Some((_, "")) => *p == Placement::ALL[0],
        Some((_, text)) => p.label().contains(text),
    });
    let mut retransmissions = 0;

    for placement in placements {
        let mut rigs = Rigs::new(placement, &cases);

        // Throughput: a warm-up run per case, then `runs` rounds over all cases.
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
        for &case in &cases {
            rigs.run(case, (messages / 5).max(1)).await;
        }
        for _ in 0..runs {
            for (i, &case) in cases.iter().enumerate() {
                times[i].push(rigs.run(case, messages).await);
            }
        }
        let per_message: Vec<f64> = times
            .iter_mut()
            .map(|t| median(t).as_secs_f64() * 1e6 / messages as f64)
            .collect();
        let plain = per_message[0];
        println!(
            "\n## Throughput, {} (placement: {})\n",
            placement.label(),
            placement_note(placement)
        );
        println!("| case | messages/s | µs per message | time vs plain `do_send` |");
        println!("|---|---:|---:|---:|");
        for (case, us) in cases.iter().zip(&per_message) {
            println!(
                "| {} | {} | {:.3} | {:.1}× |",
                case.label(),
                thousands(1e6 / us),
                us,
                us / plain
            );
        }

        // Latency (not when profiling one case).
        if only.is_none() {
            print_latencies(&mut rigs, placement, latency_samples).await;
        }

        for (_, rig) in &rigs.reliable {
            rig.check_consumer().await;
            retransmissions += rig.retransmissions().await;
        }
        let Rigs { site, .. } = rigs;
        site.stop();
    }
    println!(
        "\nRetransmissions during the run: {retransmissions} (non-zero means a message waited \
         longer than `resend_timeout` for its ACK: an overloaded machine)."
    );
    #[cfg(feature = "metrics")]
    {
        let rendered = prometheus.render();
        let series = rendered.lines().filter(|l| !l.starts_with('#')).count();
        println!("\nMetrics recorded (Prometheus recorder): {series} series rendered.");
    }
    System::current().stop();
}

/// Latency: closed loops with 1 and 16 messages in flight, ready handler, against a plain
/// `send().await` round trip.
async fn print_latencies(rigs: &mut Rigs, placement: Placement, samples: usize) {
    rigs.plain.send_latencies(samples / 5).await;
    let plain_rtt = percentiles(rigs.plain.send_latencies(samples).await);
    let mut rows = vec![("plain `send().await` round trip".to_string(), plain_rtt)];
    for window in [1, 16] {
        let rig = rigs.reliable(HandlerKind::Ready, window, Route::ConsumerRef);
        rig.send_latencies(samples / 5, window).await;
        let latencies = rig.send_latencies(samples, window).await;
        rows.push((
            format!("reliable `send` → confirmation, window {window}, {window} in flight"),
            percentiles(latencies),
        ));
    }
    println!(
        "\n## Latency, {} ({samples} messages, ready handler)\n",
        placement.label()
    );
    println!("| case | p50 µs | p99 µs | p50 vs plain round trip |");
    println!("|---|---:|---:|---:|");
    for (label, (p50, p99)) in &rows {
        println!(
            "| {label} | {:.2} | {:.2} | {:.1}× |",
            micros(*p50),
            micros(*p99),
            p50.as_secs_f64() / plain_rtt.0.as_secs_f64()
        );
    }
}

fn placement_note(placement: Placement) -> &'static str {
    match placement {
        Placement::SameArbiter => "sender, producer and consumer on one thread",
        Placement::TwoArbiters => "sender and producer on one thread, consumer on another",
    }
}

fn print_header(messages: u64, runs: usize) {
    report_header::print("actix-delivery benchmark report");
    println!(
        "- method: {messages} messages per run, median of {runs} runs; reliable = N−1 × \
         `tell(_, Confirmation::none())` + one `send().await`, timed until all N are confirmed; \
         default settings except window_size and max_pending"
    );
}

/// The trimmed standard output of a command, or `unknown`.
fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// p50 and p99.
fn percentiles(mut latencies: Vec<Duration>) -> (Duration, Duration) {
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
