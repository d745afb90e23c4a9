//! The proptest strategy over whole scenarios: every setting of the cores, the links, the
//! handler (failing, slow, stuck), the traffic, the restarts, shared ids, forgeries and durable
//! producers or outbox lanes with their crashes, shaped so that shrinking reaches small,
//! readable configurations (faults switch off, counts drop, the seed goes to 0).

use std::time::Duration;

use actix_delivery_proto::config::{Backoff, ConsumerConfig, Limit, ProducerConfig};
use proptest::prelude::*;

use super::scenario::{
    CapRule, CrashMoment, Disruption, Durability, DurableKind, Forgery, HandlerFaults, LinkFaults,
    Scenario, Traffic,
};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// Any scenario, with restarts, evictions, sweeps, give-ups, shared ids, stuck and slow
/// handler runs under a short `handler_timeout`, (when attempts are bounded, so that the
/// victim's messages can settle) forgeries, and (when they are not) durable producers and
/// outbox lanes whose producer restarts become durable crashes: proptest shrinks a failure to
/// a minimal configuration.
pub fn any_scenario() -> impl Strategy<Value = Scenario> {
    // `prop_oneof![Just(none), range]` lets shrinking jump to "this fault is off".
    let rate = |max: f64| prop_oneof![Just(0.0), 0.0..=max];
    let millis = |max: u64| prop_oneof![Just(0u64), 0..=max];
    let sizes = (
        any::<u64>(),
        1usize..=60,
        1usize..=4,
        1usize..=64,
        50u64..=500,
    );
    let consumer = (
        any::<bool>(),
        prop_oneof![Just(Limit::Unbounded), (1usize..=8).prop_map(Limit::At)],
        prop_oneof![Just(Limit::Unbounded), (1usize..=4).prop_map(Limit::At)],
        prop_oneof![Just(300_000u64), 20u64..=2_000],
    );
    let links = (rate(0.5), rate(0.5), rate(0.3), rate(0.3), millis(800));
    let rest = (
        rate(0.2),
        millis(20),
        prop_oneof![Just(None), (1u32..=4).prop_map(Some)],
        any::<bool>(),
        (millis(50), rate(0.1), millis(3_000)),
        prop::collection::vec(
            (any::<bool>(), any::<usize>(), any::<usize>(), 0u64..=20),
            0..=2,
        ),
    );
    let adversity = (
        prop_oneof![Just(None), (1usize..=3).prop_map(Some)],
        prop_oneof![
            Just(None),
            (200u64..=2_000, rate(0.05), rate(0.1)).prop_map(Some)
        ],
        prop::collection::vec(
            (
                any::<usize>(),
                any::<u64>(),
                0u64..=200,
                0..Forgery::JUMPS.len(),
                1u64..=20,
                1u32..=2,
            ),
            0..=2,
        ),
        // Per producer (bits): a durable producer or an outbox lane; the commit latency.
        prop_oneof![Just(None), (any::<u8>(), millis(20)).prop_map(Some)],
    );
    (sizes, consumer, links, rest, adversity).prop_map(
        |(
            (seed, messages, producers, window_size, resend),
            (ordered, max_out_of_order, max_producers, ttl),
            (drop_fwd, drop_back, dup_fwd, dup_back, latency),
            (failure, handler_ms, max_attempts, exponential, (gap, pause_p, pause), restarts),
            (shared_ids, stuck, forgeries, durable),
        )| {
            let mut scenario = Scenario {
                producers,
                shared_ids,
                producer: ProducerConfig {
                    window_size,
                    resend_timeout: ms(resend),
                    max_attempts: max_attempts.map_or(Limit::Unbounded, Limit::At),
                    backoff: if exponential {
                        Backoff::Exponential {
                            multiplier: 2.0,
                            max: ms(resend * 4),
                            jitter: 0.5,
                        }
                    } else {
                        Backoff::Fixed
                    },
                    ..ProducerConfig::default()
                },
                consumer: ConsumerConfig {
                    ordered,
                    max_out_of_order,
                    max_producers,
                    producer_idle_ttl: Limit::At(ms(ttl)),
                    ..ConsumerConfig::default()
                },
                forward: LinkFaults {
                    drop: drop_fwd,
                    duplicate: dup_fwd,
                    ..LinkFaults::reliable(Duration::ZERO, ms(latency))
                },
                backward: LinkFaults {
                    drop: drop_back,
                    duplicate: dup_back,
                    ..LinkFaults::reliable(Duration::ZERO, ms(latency))
                },
                handler: HandlerFaults {
                    failure,
                    max_duration: ms(handler_ms),
                    ..HandlerFaults::NONE
                },
                traffic: Traffic {
                    max_gap: ms(gap),
                    pause_probability: pause_p,
                    pause: ms(pause),
                },
                ..Scenario::baseline(seed, messages)
            };
            if let Some((timeout, stuck, slow)) = stuck {
                let timeout = ms(timeout);
                scenario.consumer.handler_timeout = Limit::At(timeout);
                scenario.handler.stuck = stuck;
                scenario.handler.slow = slow;
                scenario.handler.slow_range = timeout * 9 / 10..=timeout - ms(1);
            }
            // A forgery's victim can only settle its messages by giving them up.
            if !scenario.attempts_are_unbounded() {
                for (who, when, delay, jump, burst, copies) in forgeries {
                    let victim = who % producers;
                    let sent = scenario.messages_of(victim) as u64;
                    if sent > 0 {
                        scenario.forgeries.push(Forgery {
                            victim,
                            after_seq: when % sent + 1,
                            delay: ms(delay),
                            jump: Forgery::JUMPS[jump],
                            burst,
                            copies,
                        });
                    }
                }
            }
            // Durable storage retries forever: only with unbounded attempts. Lanes sharing an
            // id are lanes of different entities (an entity's lanes share its incarnation).
            let durable = durable.filter(|_| scenario.attempts_are_unbounded());
            if let Some((bits, latency)) = durable {
                let kinds = (0..producers)
                    .map(|producer| match bits >> producer & 1 {
                        0 => DurableKind::Producer,
                        _ if shared_ids.is_some() => DurableKind::Outbox { entity: producer },
                        _ => DurableKind::Outbox { entity: 0 },
                    })
                    .collect();
                scenario.durable = Some(Durability {
                    kinds,
                    commit_latency: Duration::ZERO..=ms(latency),
                    cap: CapRule::LowestNotDurablySettled,
                });
            }
            // Restart thresholds are progress counts, which only unbounded attempts
            // guarantee to reach.
            if scenario.attempts_are_unbounded() {
                for (consumer, who, when, delay) in restarts {
                    let disruption = if consumer {
                        Disruption::ConsumerRestart {
                            after_handled: when % messages + 1,
                            delay: ms(delay),
                        }
                    } else {
                        let producer = who % producers;
                        match scenario.messages_of(producer) {
                            0 => continue,
                            count if durable.is_some() => Disruption::DurableCrash {
                                producer,
                                after_offered: when / 3 % count + 1,
                                moment: CrashMoment::ALL[when % 3],
                                delay: ms(delay * 10),
                                down: ms(delay),
                            },
                            count => Disruption::ProducerRestart {
                                producer,
                                after_confirmed: when % count + 1,
                                delay: ms(delay),
                            },
                        }
                    };
                    scenario.disruptions.push(disruption);
                }
            }
            scenario
        },
    )
}
