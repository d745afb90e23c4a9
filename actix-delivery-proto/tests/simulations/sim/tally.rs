//! Counts of what runs injected and what it cost, summed over many runs, so that a test can
//! assert that its fault injection really injected faults and that its scenarios really
//! exercised restarts, evictions, sweeps, forgeries, shared ids, handler timeouts and durable
//! crashes (mid-store, mid-record, their resends recognised as duplicates).

use std::fmt;

use super::driver::Run;
use super::link::LinkCounts;
use super::scenario::{Scenario, PROGRESS_STEPS, PROGRESS_TIME};

/// What one or more runs injected and what the cores did about it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Runs counted.
    pub runs: u64,
    /// Messages offered.
    pub messages: u64,
    /// Simulation steps.
    pub steps: u64,
    /// The largest share of its step cap a run used.
    pub max_step_share: f64,
    /// The largest share of the progress limits (`PROGRESS_STEPS`, `PROGRESS_TIME`) a run's
    /// longest stretch without a settlement used.
    pub max_quiet_share: f64,
    /// The producer → consumer link.
    pub forward: LinkCounts,
    /// The consumer → producer link.
    pub backward: LinkCounts,
    /// Handler runs that failed or panicked.
    pub handler_failures: u64,
    /// Retransmissions by the producers.
    pub retransmissions: u64,
    /// Deliveries the consumer recognised as duplicates and re-ACKed (dedup at work).
    pub re_acks: u64,
    /// Deliveries the consumer held (handler in progress, out-of-order bound, ordered mode).
    pub holds: u64,
    /// Messages given up (`max_attempts`).
    pub given_up: u64,
    /// Dedup windows evicted (`max_producers`).
    pub evictions: u64,
    /// Dedup windows swept (`producer_idle_ttl`).
    pub swept: u64,
    /// Dedup windows replaced by another incarnation of the same producer.
    pub replaced: u64,
    /// Producer restarts.
    pub producer_restarts: u64,
    /// Messages settled as stopped by a restart (and re-sent).
    pub stopped: u64,
    /// Consumer restarts.
    pub consumer_restarts: u64,
    /// Handler runs cut short by a consumer restart or `handler_timeout`.
    pub abandoned_runs: u64,
    /// Successful handler runs beyond the first per message key.
    pub duplicate_successes: u64,
    /// Re-runs after a consumer restart of messages unconfirmed at the restart.
    pub reruns_unconfirmed: u64,
    /// Re-runs after a consumer restart of messages confirmed at the restart but with a
    /// copy in transit.
    pub reruns_in_transit: u64,
    /// Forgeries injected.
    pub forgeries: u64,
    /// Forged copies that reached the consumer.
    pub forged: u64,
    /// Handler runs of forged messages.
    pub forged_runs: u64,
    /// Deliveries and waiting messages the consumer counted stale (`stats.stale`).
    pub stale: u64,
    /// Arrivals at or below the floor the simulator predicted for their window.
    pub predicted_stale: u64,
    /// Messages of forgery victims given up.
    pub victims_given_up: u64,
    /// New messages admitted into an older incarnation's window of a shared id
    /// (`stats.shared_id_messages`).
    pub shared_id_messages: u64,
    /// Handler runs abandoned after `handler_timeout` (`stats.handler_timeouts`).
    pub handler_timeouts: u64,
    /// Slow handler runs (just under the timeout) that finished.
    pub slow_completed: u64,
    /// Durable crashes.
    pub durable_crashes: u64,
    /// Of those, crashes while a store was in flight.
    pub crashes_mid_store: u64,
    /// Of those, crashes while a settlement record was in flight.
    pub crashes_mid_record: u64,
    /// Messages whose store a crash lost (never stored: their senders got an error).
    pub never_stored: u64,
    /// Messages resumed by restarted durable producers.
    pub resumed: u64,
    /// Settlements a crash lost before their record (their messages were resumed).
    pub unrecorded: u64,
    /// Resends (by a later life than the one that stored them) that reached the consumer.
    pub resend_arrivals: u64,
    /// Of those, the ones the consumer recognised as duplicates and re-ACKed.
    pub resend_duplicates: u64,
    /// Confirmations that went to the sink (messages resumed after a restart).
    pub sink: u64,
    /// ACKs lost with a crashed producer.
    pub acks_while_down: u64,
    /// Settlement records started only by a durable producer's stale timer.
    pub records_by_stale_alarm: u64,
}

impl Tally {
    /// The counts of one run.
    pub fn of(scenario: &Scenario, run: &Run) -> Self {
        let obs = &run.observations;
        let consumer = &run.consumer_stats;
        let mut tally = Self {
            runs: 1,
            messages: scenario.messages as u64,
            steps: run.steps,
            max_step_share: run.steps as f64 / scenario.step_cap() as f64,
            max_quiet_share: (run.longest_quiet.0 as f64 / PROGRESS_STEPS as f64)
                .max(run.longest_quiet.1.as_secs_f64() / PROGRESS_TIME.as_secs_f64()),
            forward: run.forward,
            backward: run.backward,
            handler_failures: obs.handler_failures,
            retransmissions: run.producer_stats.iter().map(|s| s.retransmitted).sum(),
            re_acks: obs.re_acks,
            holds: obs.holds,
            given_up: run.producer_stats.iter().map(|s| s.given_up).sum(),
            evictions: consumer.evictions,
            swept: consumer.swept,
            replaced: consumer.replaced_incarnations,
            producer_restarts: obs.producer_restarts as u64,
            stopped: obs.bodies.values().map(|b| u64::from(b.stopped)).sum(),
            consumer_restarts: obs.consumer_restarts.len() as u64,
            abandoned_runs: obs.abandoned_runs,
            forgeries: obs.forgeries as u64,
            forged: obs.forged_arrivals,
            forged_runs: obs.forged.values().map(|r| u64::from(r.runs)).sum(),
            stale: consumer.stale,
            predicted_stale: obs.predicted_stale,
            victims_given_up: obs
                .bodies
                .values()
                .filter(|b| scenario.forgeries.iter().any(|f| f.victim == b.producer))
                .map(|b| u64::from(b.gave_up))
                .sum(),
            shared_id_messages: consumer.shared_id_messages,
            handler_timeouts: consumer.handler_timeouts,
            slow_completed: obs.slow_completed,
            durable_crashes: obs.durable_crashes as u64,
            crashes_mid_store: obs.crashes_mid_store,
            crashes_mid_record: obs.crashes_mid_record,
            never_stored: obs.bodies.values().map(|b| u64::from(b.never_stored)).sum(),
            resumed: obs.resumed,
            unrecorded: obs.unrecorded_at_crash,
            resend_arrivals: obs.resend_arrivals,
            resend_duplicates: obs.resend_duplicates,
            sink: obs.bodies.values().map(|b| u64::from(b.sink)).sum(),
            acks_while_down: obs.acks_while_down,
            records_by_stale_alarm: obs.records_by_stale_alarm,
            ..Self::default()
        };
        for record in obs.keys.values() {
            tally.duplicate_successes += record.successes.len().saturating_sub(1) as u64;
            let Some(first_life) = record.successes.first().map(|s| s.life) else {
                continue;
            };
            // The first success of each later life is a re-run caused by the restart that
            // began that life.
            let mut counted_life = first_life;
            for success in &record.successes {
                if success.life == counted_life {
                    continue;
                }
                counted_life = success.life;
                let restart = &obs.consumer_restarts[success.life as usize - 1];
                if record.confirmed_at.is_some_and(|c| c < restart.step) {
                    tally.reruns_in_transit += 1;
                } else {
                    tally.reruns_unconfirmed += 1;
                }
            }
        }
        tally
    }

    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &Tally) {
        self.runs += other.runs;
        self.messages += other.messages;
        self.steps += other.steps;
        self.max_step_share = self.max_step_share.max(other.max_step_share);
        self.max_quiet_share = self.max_quiet_share.max(other.max_quiet_share);
        self.forward.add(&other.forward);
        self.backward.add(&other.backward);
        self.handler_failures += other.handler_failures;
        self.retransmissions += other.retransmissions;
        self.re_acks += other.re_acks;
        self.holds += other.holds;
        self.given_up += other.given_up;
        self.evictions += other.evictions;
        self.swept += other.swept;
        self.replaced += other.replaced;
        self.producer_restarts += other.producer_restarts;
        self.stopped += other.stopped;
        self.consumer_restarts += other.consumer_restarts;
        self.abandoned_runs += other.abandoned_runs;
        self.duplicate_successes += other.duplicate_successes;
        self.reruns_unconfirmed += other.reruns_unconfirmed;
        self.reruns_in_transit += other.reruns_in_transit;
        self.forgeries += other.forgeries;
        self.forged += other.forged;
        self.forged_runs += other.forged_runs;
        self.stale += other.stale;
        self.predicted_stale += other.predicted_stale;
        self.victims_given_up += other.victims_given_up;
        self.shared_id_messages += other.shared_id_messages;
        self.handler_timeouts += other.handler_timeouts;
        self.slow_completed += other.slow_completed;
        self.durable_crashes += other.durable_crashes;
        self.crashes_mid_store += other.crashes_mid_store;
        self.crashes_mid_record += other.crashes_mid_record;
        self.never_stored += other.never_stored;
        self.resumed += other.resumed;
        self.unrecorded += other.unrecorded;
        self.resend_arrivals += other.resend_arrivals;
        self.resend_duplicates += other.resend_duplicates;
        self.sink += other.sink;
        self.acks_while_down += other.acks_while_down;
        self.records_by_stale_alarm += other.records_by_stale_alarm;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} runs, {} msgs, {} steps (max {:.0}% of step cap, {:.0}% of progress limit); \
             fwd dropped {}/dup {} of {}; back dropped {}/dup {} of {}; handler failures {}; \
             retransmits {}; re-ACKs {}; holds {}; given up {}",
            self.runs,
            self.messages,
            self.steps,
            self.max_step_share * 100.0,
            self.max_quiet_share * 100.0,
            self.forward.dropped,
            self.forward.duplicated,
            self.forward.messages,
            self.backward.dropped,
            self.backward.duplicated,
            self.backward.messages,
            self.handler_failures,
            self.retransmissions,
            self.re_acks,
            self.holds,
            self.given_up,
        )?;
        write!(
            f,
            "; evictions {}; swept {}; replaced {}; producer restarts {} (stopped {}); \
             consumer restarts {} (abandoned runs {}); duplicate successes {}; re-runs after \
             consumer restart: {} unconfirmed + {} in transit",
            self.evictions,
            self.swept,
            self.replaced,
            self.producer_restarts,
            self.stopped,
            self.consumer_restarts,
            self.abandoned_runs,
            self.duplicate_successes,
            self.reruns_unconfirmed,
            self.reruns_in_transit,
        )?;
        write!(
            f,
            "; forgeries {} (forged copies {}, forged runs {}); stale {} (predicted {}); \
             victims given up {}; shared-id messages {}; handler timeouts {} (slow runs \
             finished {})",
            self.forgeries,
            self.forged,
            self.forged_runs,
            self.stale,
            self.predicted_stale,
            self.victims_given_up,
            self.shared_id_messages,
            self.handler_timeouts,
            self.slow_completed,
        )?;
        if self.durable_crashes == 0 && self.resumed == 0 {
            return Ok(());
        }
        write!(
            f,
            "; durable crashes {} ({} mid-store, {} mid-record); never stored {}; resumed {} \
             ({} settled but unrecorded); resends arrived {} ({} re-ACKed as duplicates); sink \
             confirmations {}; ACKs lost while down {}; records started by a stale timer {}",
            self.durable_crashes,
            self.crashes_mid_store,
            self.crashes_mid_record,
            self.never_stored,
            self.resumed,
            self.unrecorded,
            self.resend_arrivals,
            self.resend_duplicates,
            self.sink,
            self.acks_while_down,
            self.records_by_stale_alarm,
        )
    }
}
