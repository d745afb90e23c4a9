//! Stopping a whole application gracefully, in order, within one deadline: a coordinated
//! shutdown after Akka's `CoordinatedShutdown`.
//!
//! The application registers each part with the [`Shutdown`] in the [`Phase`] it belongs to;
//! [`Shutdown::run`] (or a signal, after [`Shutdown::on_signals`]) runs the phases in their
//! order, the tasks of a phase at once, and the next phase when every task of the one before
//! has ended. The whole run has one deadline: a phase cut short by it reports its unfinished
//! tasks [`TaskOutcome::TimedOut`], and the phases after it are not run
//! ([`PhaseReport::skipped`]): what they would have stopped ends with the process (a durable
//! producer's unconfirmed messages stay in its journal, an entity's state is its journal). Each
//! phase is logged as it starts and ends, and [`Shutdown::run`] returns what happened to each
//! task.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, FutureExt, Shared};

use crate::error::OptionsError;

/// A task's future: it resolves when the task ended, with why it failed if it did.
pub type StopFuture = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// The phases of a shutdown, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Readiness turns off ([`Shutdown::is_shutting_down`] is true from the start of the run,
    /// before this phase): load balancers stop sending work. Tasks: deregistering from
    /// service discovery, waiting for the balancer to notice.
    Unready,
    /// New work is refused: an HTTP server stops accepting connections and finishes the
    /// requests it has (`actix_web::dev::ServerHandle::stop(true)`).
    StopIntake,
    /// Work in flight drains: a producer's messages get confirmed (`ProducerHandle::idle`).
    Drain,
    /// Producers stop: their stored, unconfirmed messages stay in their journals.
    Producers,
    /// Consumers and persistent entities stop: the writes in flight finish.
    Entities,
    /// Projections stop: the offset of what they handled is stored.
    Projections,
    /// Shard coordinators hand their shards to the other nodes and leave; nodes and carriers
    /// stop.
    Cluster,
    /// Journals close.
    Journals,
}

impl Phase {
    /// Every phase, in the order they run.
    pub const ALL: [Phase; 8] = [
        Phase::Unready,
        Phase::StopIntake,
        Phase::Drain,
        Phase::Producers,
        Phase::Entities,
        Phase::Projections,
        Phase::Cluster,
        Phase::Journals,
    ];
}

/// What became of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskOutcome {
    /// It ended well.
    Done,
    /// It ended with this error (its whole cause chain).
    Failed(String),
    /// The deadline passed first.
    TimedOut,
}

/// One task of a [`PhaseReport`].
#[derive(Clone, Debug)]
pub struct TaskReport {
    /// The name it was registered under.
    pub name: String,
    /// What became of it.
    pub outcome: TaskOutcome,
    /// How long it ran.
    pub took: Duration,
}

/// One phase of a [`ShutdownReport`].
#[derive(Clone, Debug)]
pub struct PhaseReport {
    /// Which phase.
    pub phase: Phase,
    /// Its tasks, in the order they were registered (none for a phase nothing registered
    /// for).
    pub tasks: Vec<TaskReport>,
    /// True if the deadline had passed before the phase began: its tasks did not run.
    pub skipped: bool,
}

/// What a shutdown did: every phase, in order.
#[derive(Clone, Debug)]
pub struct ShutdownReport {
    /// Why it ran: the signal, or what the caller of [`Shutdown::run`] said.
    pub reason: String,
    /// The phases, in the order they ran.
    pub phases: Vec<PhaseReport>,
    /// How long the whole shutdown took.
    pub took: Duration,
}

impl ShutdownReport {
    /// True if every task ended well and no phase was skipped.
    pub fn is_clean(&self) -> bool {
        self.phases.iter().all(|phase| {
            !phase.skipped
                && phase
                    .tasks
                    .iter()
                    .all(|task| task.outcome == TaskOutcome::Done)
        })
    }
}

impl fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shutdown ({}) in {:.2} s",
            self.reason,
            self.took.as_secs_f64()
        )?;
        for phase in self.phases.iter().filter(|p| !p.tasks.is_empty()) {
            write!(f, "; {:?}:", phase.phase)?;
            if phase.skipped {
                write!(f, " skipped (deadline)")?;
                continue;
            }
            for task in &phase.tasks {
                let took = task.took.as_secs_f64();
                match &task.outcome {
                    TaskOutcome::Done => write!(f, " {} done in {took:.2} s", task.name)?,
                    TaskOutcome::Failed(why) => write!(f, " {} failed: {why}", task.name)?,
                    TaskOutcome::TimedOut => write!(f, " {} timed out", task.name)?,
                }
            }
        }
        Ok(())
    }
}

/// Whether a [`Shutdown`] began, for any thread: cheap to clone, `Send` and `Sync`.
#[derive(Clone, Debug)]
pub struct ShutdownWatch(Arc<AtomicBool>);

impl ShutdownWatch {
    /// True once the run began: refuse new work, answer readiness "not ready".
    pub fn is_shutting_down(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A part that stops gracefully: stopping it begins its stop, and the future resolves once it
/// stopped. The handles of this crate's parts implement it; [`Shutdown::add`] takes any.
pub trait GracefulStop {
    /// Begins the stop; the future resolves when the part stopped, with why it failed if it
    /// did (its whole cause chain).
    fn stop_gracefully(&self) -> StopFuture;
}

struct Task {
    phase: Phase,
    name: String,
    start: Box<dyn FnOnce() -> StopFuture>,
}

struct State {
    deadline: Duration,
    /// Set when the run begins.
    begun: Arc<AtomicBool>,
    tasks: Vec<Task>,
    /// The run, once started: every caller of `run` awaits the same one.
    run: Option<Shared<Pin<Box<dyn Future<Output = ShutdownReport>>>>>,
}

/// Runs the registered stop tasks of an application, phase by phase, within one deadline
/// (see the module docs). Cheap to clone; lives on one thread (an Actix system's arbiter).
#[derive(Clone)]
pub struct Shutdown {
    state: Rc<RefCell<State>>,
}

impl fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.borrow();
        f.debug_struct("Shutdown")
            .field("deadline", &state.deadline)
            .field("tasks", &state.tasks.len())
            .field("running", &state.run.is_some())
            .finish()
    }
}

impl Shutdown {
    /// A shutdown whose run ends within `deadline`.
    ///
    /// # Errors
    /// [`OptionsError`] naming `deadline` if it is zero.
    pub fn new(deadline: Duration) -> Result<Self, OptionsError> {
        if deadline.is_zero() {
            return Err(OptionsError::new("deadline", "must be more than zero"));
        }
        Ok(Self {
            state: Rc::new(RefCell::new(State {
                deadline,
                begun: Arc::default(),
                tasks: Vec::new(),
                run: None,
            })),
        })
    }

    /// Registers `part` (a producer, consumer, entity, projection, coordinator, node, …) to
    /// be stopped in `phase`, under `name` (for the log and the report).
    pub fn add<P: GracefulStop + Clone + 'static>(
        &self,
        phase: Phase,
        name: impl Into<String>,
        part: &P,
    ) {
        let part = part.clone();
        self.add_task(phase, name, move || part.stop_gracefully());
    }

    /// Registers a task of the application's own in `phase`: `task` is called when the phase
    /// begins, and the phase waits for the future it returns. A task registered after the run
    /// began is not run.
    pub fn add_task<F, Fut>(&self, phase: Phase, name: impl Into<String>, task: F)
    where
        F: FnOnce() -> Fut + 'static,
        Fut: Future<Output = Result<(), String>> + 'static,
    {
        let mut state = self.state.borrow_mut();
        if state.run.is_some() {
            log::warn!(
                "shutdown: task {} registered after the run began: not run",
                name.into()
            );
            return;
        }
        state.tasks.push(Task {
            phase,
            name: name.into(),
            start: Box::new(move || Box::pin(task())),
        });
    }

    /// True once the run began: what a readiness endpoint answers "not ready" on.
    pub fn is_shutting_down(&self) -> bool {
        self.state.borrow().begun.load(Ordering::Relaxed)
    }

    /// Whether the run began, readable from any thread (an HTTP server's workers): the
    /// [`Shutdown`] itself lives on one.
    pub fn watch(&self) -> ShutdownWatch {
        ShutdownWatch(self.state.borrow().begun.clone())
    }

    /// Runs the shutdown (once: a second call, or a signal during the run, awaits the same
    /// run) and resolves with its report.
    pub fn run(&self, reason: impl Into<String>) -> impl Future<Output = ShutdownReport> + 'static {
        let mut state = self.state.borrow_mut();
        if state.run.is_none() {
            state.begun.store(true, Ordering::Relaxed);
            let tasks = std::mem::take(&mut state.tasks);
            let run: Pin<Box<dyn Future<Output = ShutdownReport>>> =
                Box::pin(run_phases(reason.into(), state.deadline, tasks));
            state.run = Some(run.shared());
        }
        state.run.clone().expect("set above")
    }

    /// Runs the shutdown at the first SIGTERM or SIGINT (Ctrl-C), taken over from now on; the
    /// future resolves with its report. Await it in `main` once the application started (or
    /// spawn it).
    ///
    /// # Errors
    /// The OS refused to install the signal handlers.
    #[cfg(unix)]
    pub fn on_signals(&self) -> std::io::Result<impl Future<Output = ShutdownReport> + 'static> {
        use actix_rt::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let shutdown = self.clone();
        Ok(async move {
            let reason = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            shutdown.run(reason).await
        })
    }
}

async fn run_phases(reason: String, deadline: Duration, mut tasks: Vec<Task>) -> ShutdownReport {
    let started = Instant::now();
    let until = tokio::time::Instant::now() + deadline;
    log::info!(
        "shutdown ({reason}): {} tasks, deadline {deadline:?}",
        tasks.len()
    );
    let mut phases = Vec::new();
    for phase in Phase::ALL {
        let (these, rest): (Vec<Task>, Vec<Task>) =
            tasks.into_iter().partition(|t| t.phase == phase);
        tasks = rest;
        if tokio::time::Instant::now() >= until {
            if !these.is_empty() {
                log::warn!("shutdown: phase {phase:?} skipped, the deadline passed");
            }
            let tasks = these
                .into_iter()
                .map(|task| TaskReport {
                    name: task.name,
                    outcome: TaskOutcome::TimedOut,
                    took: Duration::ZERO,
                })
                .collect();
            phases.push(PhaseReport {
                phase,
                tasks,
                skipped: true,
            });
            continue;
        }
        let began = Instant::now();
        let runs = these.into_iter().map(|task| {
            let Task { name, start, .. } = task;
            async move {
                let at = Instant::now();
                let outcome = match tokio::time::timeout_at(until, start()).await {
                    Ok(Ok(())) => TaskOutcome::Done,
                    Ok(Err(why)) => TaskOutcome::Failed(why),
                    Err(_) => TaskOutcome::TimedOut,
                };
                match &outcome {
                    TaskOutcome::Done => log::info!("shutdown: {phase:?}: {name} stopped"),
                    TaskOutcome::Failed(why) => {
                        log::warn!("shutdown: {phase:?}: {name} failed: {why}")
                    }
                    TaskOutcome::TimedOut => {
                        log::warn!("shutdown: {phase:?}: {name} did not stop by the deadline")
                    }
                }
                TaskReport {
                    name,
                    outcome,
                    took: at.elapsed(),
                }
            }
        });
        let tasks = join_all(runs).await;
        if !tasks.is_empty() {
            log::info!("shutdown: phase {phase:?} ended in {:?}", began.elapsed());
        }
        phases.push(PhaseReport {
            phase,
            tasks,
            skipped: false,
        });
    }
    let report = ShutdownReport {
        reason,
        phases,
        took: started.elapsed(),
    };
    if report.is_clean() {
        log::info!("{report}");
    } else {
        log::warn!("{report}");
    }
    report
}
