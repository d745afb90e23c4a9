//! Running a scenario and judging it: on failure, a message with the seed, every broken
//! invariant, the full scenario and the tail of the event trace.

use std::cell::{Cell, RefCell};
use std::fmt::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use super::check::check;
use super::driver::{simulate, Run};
use super::scenario::Scenario;
use super::tally::Tally;

/// Runs `scenario` and checks every invariant. `Ok` carries the run's counts, `Err` the
/// failure message (a panic inside a core is a failure too).
pub fn run_checked(scenario: &Scenario) -> Result<(Run, Tally), String> {
    let run =
        catch_quietly(|| simulate(scenario)).map_err(|panic| failure(scenario, &[panic], None))?;
    let broken = check(scenario, &run);
    let tally = Tally::of(scenario, &run);
    if broken.is_empty() {
        Ok((run, tally))
    } else {
        Err(failure(scenario, &broken, Some((&run, &tally))))
    }
}

/// Whether `seed` is to be run: all seeds, unless the environment variable `SIM_SEED` names
/// one (to replay a failure, e.g. with `SIM_TRACE_TAIL=100000` for its whole trace).
pub fn selected(seed: u64) -> bool {
    seed_filter().is_none_or(|only| only == seed)
}

/// Whether `SIM_SEED` restricts the runs (aggregate assertions are then skipped).
pub fn is_replay() -> bool {
    seed_filter().is_some()
}

fn seed_filter() -> Option<u64> {
    std::env::var("SIM_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
}

/// Runs every scenario, adding up the counts of the correct runs. `Err` names every failing
/// seed and gives the full message of the first failure.
pub fn run_all(scenarios: impl IntoIterator<Item = Scenario>) -> Result<Tally, String> {
    let mut total = Tally::default();
    let mut first_failure = None;
    let mut failing_seeds = Vec::new();
    for scenario in scenarios.into_iter().filter(|s| selected(s.seed)) {
        match run_checked(&scenario) {
            Ok((_, tally)) => total.add(&tally),
            Err(message) => {
                failing_seeds.push(scenario.seed);
                first_failure.get_or_insert(message);
            }
        }
    }
    match first_failure {
        None => Ok(total),
        Some(message) => Err(format!(
            "{} scenario(s) failed, seeds {failing_seeds:?}; the first:\n{message}",
            failing_seeds.len()
        )),
    }
}

fn failure(scenario: &Scenario, broken: &[String], run: Option<(&Run, &Tally)>) -> String {
    let mut out = format!(
        "simulation of seed {} broke {} invariant(s):\n",
        scenario.seed,
        broken.len()
    );
    for rule in broken.iter().take(25) {
        let _ = writeln!(out, "  - {rule}");
    }
    if broken.len() > 25 {
        let _ = writeln!(out, "  - ... {} more", broken.len() - 25);
    }
    let _ = writeln!(
        out,
        "replay: SIM_SEED={} SIM_TRACE_TAIL=100000 cargo test -p actix-delivery-proto \
         --test simulations simulator::<test> -- --nocapture\nscenario: {scenario:#?}",
        scenario.seed
    );
    if let Some((run, tally)) = run {
        let _ = writeln!(out, "counts: {tally}");
        let _ = writeln!(out, "consumer stats: {:?}", run.consumer_stats);
        let _ = writeln!(
            out,
            "trace tail (of {} events, t = simulated time):",
            run.trace.events()
        );
        for (at, event) in run.trace.tail() {
            let _ = writeln!(out, "  t={:>12.6}s  {event}", at.as_secs_f64());
        }
    }
    out
}

thread_local! {
    /// Whether a panic on this thread is caught by [`catch_quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// Where the last quietly caught panic happened.
    static LOCATION: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Runs `f`, turning a panic into its message and location. The default panic hook (which
/// would print a backtrace for each of possibly hundreds of failing seeds) stays silent for
/// these panics; the failure message reports them instead.
fn catch_quietly<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.get() {
                let location = info.location().map(ToString::to_string).unwrap_or_default();
                LOCATION.set(location);
            } else {
                default(info);
            }
        }));
    });
    QUIET.set(true);
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.set(false);
    result.map_err(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic".to_owned());
        format!("the simulation panicked at {}: {text}", LOCATION.take())
    })
}
