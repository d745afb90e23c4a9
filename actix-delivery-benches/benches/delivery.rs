//! End to end through real actors, in one criterion group per placement, so that every case is
//! compared with the plain Actix baselines measured in the same run:
//!
//! - `plain_do_send`: N × `do_send` to a counting actor, until a `send(Total).await` reply
//!   shows all N were counted;
//! - `plain_send_sequential`: N × `send().await` round trips, one at a time;
//! - `plain_send_pipelined_16`: N × `send()` round trips, 16 in flight;
//! - `reliable_<handler>/<window>`: N − 1 × `tell(_, Confirmation::none())` and one
//!   `send().await`, until the producer's stats show all N confirmed (handle → producer →
//!   consumer → handler → ACK → confirmation), at windows 1, 16, 64, 256, with a handler that
//!   is ready at once (`ready`), one that returns `Pending` once (`yield_once`) and, at
//!   window 16, one that returns `Pending` twice (`yield_twice`: always a trip through the
//!   executor; see `support::HandlerKind` for what `yield_once` costs where). The producer sends through the consumer's
//!   `ConsumerRef` (`ProducerOptions::builder(&consumer)`, deliveries batched);
//!   `reliable_ready_via_recipient/<window>` sends through `consumer.recipient()` instead (one
//!   actor message per delivery), at windows 16 and 256.
//!
//! One criterion iteration is one message (`Throughput::Elements(1)`): the reported time is
//! per message, and the fixed cost of draining the pipeline at the end of a sample is absorbed
//! by criterion's linear fit. Placements: `same_arbiter` (everything on one thread) and
//! `two_arbiters` (the consumer or counter on its own arbiter thread).
//!
//! Each sample runs inside `SystemRunner::block_on` of one Actix `System` per group; the
//! actors are started once per benchmark, outside the measured time.
//!
//! `cargo bench -p actix-delivery-benches --bench delivery` (add e.g. `-- --quick`, or `-- reliable_ready` to filter).

use actix::System;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

#[path = "../../benches/support/mod.rs"]
mod support;

use support::{
    HandlerKind, Placement, PlainRig, ReliableRig, Route, Site, PIPELINE_DEPTH, WINDOWS,
};

fn delivery(c: &mut Criterion) {
    for placement in Placement::ALL {
        let runner = System::new();
        let site = runner.block_on(async { Site::new(placement) });
        let mut group = c.benchmark_group(format!("delivery/{}", placement.id()));
        group.throughput(Throughput::Elements(1));

        let mut plain = runner.block_on(async { PlainRig::new(&site) });
        group.bench_function("plain_do_send", |b| {
            b.iter_custom(|n| runner.block_on(plain.do_send_burst(n)))
        });
        group.bench_function("plain_send_sequential", |b| {
            b.iter_custom(|n| runner.block_on(plain.send_sequential(n)))
        });
        group.bench_function(format!("plain_send_pipelined_{PIPELINE_DEPTH}"), |b| {
            b.iter_custom(|n| runner.block_on(plain.send_pipelined(n, PIPELINE_DEPTH)))
        });
        drop(plain);

        let cases = [HandlerKind::Ready, HandlerKind::YieldOnce]
            .into_iter()
            .flat_map(|kind| WINDOWS.map(|window| (kind, window, Route::ConsumerRef)))
            .chain([(HandlerKind::YieldTwice, 16, Route::ConsumerRef)])
            .chain([16, 256].map(|window| (HandlerKind::Ready, window, Route::Recipient)));
        for (kind, window, route) in cases {
            let mut rig =
                runner.block_on(async { ReliableRig::with_route(&site, window, kind, route) });
            let suffix = match route {
                Route::ConsumerRef => "",
                Route::Recipient => "_via_recipient",
            };
            let id = BenchmarkId::new(format!("reliable_{}{suffix}", kind.id()), window);
            group.bench_function(id, |b| {
                b.iter_custom(|n| runner.block_on(rig.tell_burst(n)))
            });
            runner.block_on(rig.check_consumer());
        }
        group.finish();
        site.stop();
    }
}

criterion_group!(benches, delivery);
criterion_main!(benches);
