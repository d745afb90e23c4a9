//! Stopping a whole application gracefully, in order, within one deadline: a coordinated
//! shutdown after Akka's `CoordinatedShutdown`.
//!
//! The application registers each part with the [`Shutdown`] in the [`Phase`] it belongs to;
//! [`Shutdown::run`] (or a signal, after [`Shutdown::on_signals`]) runs the phases in their
//! order, the tasks of a phase at once, and the next phase when every task of the one before
//! has ended. The whole run has one deadline, counted from the call: a phase cut short by it
//! reports its unfinished tasks [`TaskOutcome::TimedOut`], and the tasks of the phases after
//! it are begun without waiting ([`TaskOutcome::NotAwaited`]): each part is asked to stop,
//! and what it had not finished ends with the process (a durable producer's unconfirmed
//! messages stay in its journal, an entity's state is its journal). A task that panics is
//! reported [`TaskOutcome::Failed`] and the run goes on. Each phase is logged as it begins and
//! ends, and the run's [`ShutdownReport`] says what became of each task.
//!
//! The deadline cuts waiting, not work that never yields: a task whose closure or future
//! blocks the thread holds the whole run. A task must not await the run itself (it would wait
//! for its own end until the deadline). [`Shutdown::add`] keeps a clone of the handle it is
//! given, so a part that stops when its last handle is dropped lives until the shutdown runs.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, FutureExt, Shared};
use tokio::time::Instant;

use crate::error::OptionsError;
use crate::runtime::error_chain::ErrorChain;

/// A task's future: it resolves when the task ended, with why it failed if it did.
pub type StopFuture = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// The phases of a shutdown, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Readiness turns off ([`Shutdown::is_shutting_down`] is true from the start of the run,
    /// before this phase): load balancers stop sending work. Tasks: deregistering from
    /// service discovery, waiting for the balancer to notice.
    Unready,
    /// New work is refused: an HTTP server stops accepting connections and finishes the
    /// requests it has (`actix_web::dev::ServerHandle::stop(true)`).
    StopIntake,
    /// Work in flight drains: a producer's messages get confirmed (`ProducerHandle::idle`,
    /// bounded by the task's own timeout).
    Drain,
    /// Producers stop: their stored, unconfirmed messages stay in their journals.
    Producers,
    /// Consumers and persistent entities stop: the writes in flight finish.
    Entities,
    /// Projections stop: the offset of what they handled is stored.
    Projections,
    /// Shard coordinators hand their shards to the other nodes and leave (a coordinator stops
    /// its entity host: register the coordinator, not its host).
    Cluster,
    /// Nodes and carriers stop: connections close, once the coordinators no longer need them.
    Transports,
    /// Journals close: tasks of the application that owns them.
    Journals,
}

impl Phase {
    /// Every phase, in the order they run.
    pub const ALL: &'static [Phase] = &[
        Phase::Unready,
        Phase::StopIntake,
        Phase::Drain,
        Phase::Producers,
        Phase::Entities,
        Phase::Projections,
        Phase::Cluster,
        Phase::Transports,
        Phase::Journals,
    ];
}

/// What became of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskOutcome {
    /// It ended well.
    Done,
    /// It ended with this error (its whole cause chain), or panicked (`panicked: …`).
    Failed(String),
    /// The deadline passed while it ran.
    TimedOut,
    /// Its phase began after the deadline: the task was begun (its part asked to stop) and
    /// not waited for.
    NotAwaited,
}

/// One task of a [`PhaseReport`].
#[derive(Clone, Debug)]
#[non_exhaustive]
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
#[non_exhaustive]
pub struct PhaseReport {
    /// Which phase.
    pub phase: Phase,
    /// Its tasks, in the order they were registered (none for a phase nothing registered
    /// for).
    pub tasks: Vec<TaskReport>,
    /// True if the phase had tasks and the deadline had passed before it began: they were
    /// begun and not waited for.
    pub past_deadline: bool,
}

/// What a shutdown did: every phase, in order.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Why it ran: the signal, or what the caller of [`Shutdown::run`] said.
    pub reason: String,
    /// Every phase, in order (those past the deadline too).
    pub phases: Vec<PhaseReport>,
    /// How long the whole shutdown took.
    pub took: Duration,
}

impl ShutdownReport {
    /// True if every task ended well within the deadline.
    pub fn is_clean(&self) -> bool {
        self.tasks()
            .all(|(_, task)| task.outcome == TaskOutcome::Done)
    }

    /// Every task with its phase, in the order they ran.
    pub fn tasks(&self) -> impl Iterator<Item = (Phase, &TaskReport)> {
        self.phases
            .iter()
            .flat_map(|phase| phase.tasks.iter().map(move |task| (phase.phase, task)))
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
            for task in &phase.tasks {
                let took = task.took.as_secs_f64();
                match &task.outcome {
                    TaskOutcome::Done => write!(f, " {} done in {took:.2} s", task.name)?,
                    TaskOutcome::Failed(why) => write!(f, " {} failed: {why}", task.name)?,
                    TaskOutcome::TimedOut => write!(f, " {} timed out", task.name)?,
                    TaskOutcome::NotAwaited => {
                        write!(f, " {} begun after the deadline", task.name)?
                    }
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

/// The stop future of a part whose `stopped()` resolves when it stopped.
pub(crate) fn once_stopped(stopped: impl Future<Output = ()> + 'static) -> StopFuture {
    Box::pin(async move {
        stopped.await;
        Ok(())
    })
}

/// The stop future of a part whose `stopped()` says why it ended, if not as asked.
pub(crate) fn once_stopped_or<E: std::error::Error + 'static>(
    stopped: impl Future<Output = Result<(), E>> + 'static,
) -> StopFuture {
    Box::pin(async move { stopped.await.map_err(|e| ErrorChain(&e).to_string()) })
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

    /// Begins the shutdown now (once: a second call, or a signal during the run, gets the same
    /// run) and resolves with its report. The run goes on if the future is dropped: it is
    /// spawned on the current arbiter (call this inside the Actix system).
    pub fn run(&self, reason: impl Into<String>) -> impl Future<Output = ShutdownReport> + 'static {
        let mut state = self.state.borrow_mut();
        if state.run.is_none() {
            state.begun.store(true, Ordering::Relaxed);
            let tasks = std::mem::take(&mut state.tasks);
            let until = Instant::now() + state.deadline;
            let run: Pin<Box<dyn Future<Output = ShutdownReport>>> =
                Box::pin(run_phases(reason.into(), state.deadline, until, tasks));
            let run = run.shared();
            actix_rt::spawn(run.clone());
            state.run = Some(run);
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

async fn run_phases(
    reason: String,
    deadline: Duration,
    until: Instant,
    mut tasks: Vec<Task>,
) -> ShutdownReport {
    let started = Instant::now();
    log::info!(
        "shutdown ({reason}): {} tasks, deadline {deadline:?}",
        tasks.len()
    );
    let mut phases = Vec::new();
    for &phase in Phase::ALL {
        let (these, rest): (Vec<Task>, Vec<Task>) =
            tasks.into_iter().partition(|t| t.phase == phase);
        tasks = rest;
        if these.is_empty() {
            phases.push(PhaseReport {
                phase,
                tasks: Vec::new(),
                past_deadline: false,
            });
            continue;
        }
        let past_deadline = Instant::now() >= until;
        if past_deadline {
            log::warn!("shutdown: phase {phase:?} begins after the deadline: not waited for");
        } else {
            log::info!("shutdown: phase {phase:?} begins ({} tasks)", these.len());
        }
        let began = Instant::now();
        let runs = these
            .into_iter()
            .map(|Task { name, start, .. }| async move {
                let at = Instant::now();
                // Begun in any case: a part past the deadline is still asked to stop.
                let outcome = match std::panic::catch_unwind(AssertUnwindSafe(start)) {
                    Err(panic) => TaskOutcome::Failed(panicked(&*panic)),
                    Ok(_) if past_deadline => TaskOutcome::NotAwaited,
                    Ok(stopping) => {
                        match tokio::time::timeout_at(
                            until,
                            AssertUnwindSafe(stopping).catch_unwind(),
                        )
                        .await
                        {
                            Ok(Ok(Ok(()))) => TaskOutcome::Done,
                            Ok(Ok(Err(why))) => TaskOutcome::Failed(why),
                            Ok(Err(panic)) => TaskOutcome::Failed(panicked(&*panic)),
                            Err(_) => TaskOutcome::TimedOut,
                        }
                    }
                };
                match &outcome {
                    TaskOutcome::Done => log::info!("shutdown: {phase:?}: {name} stopped"),
                    TaskOutcome::Failed(why) => {
                        log::warn!("shutdown: {phase:?}: {name} failed: {why}")
                    }
                    TaskOutcome::TimedOut => {
                        log::warn!("shutdown: {phase:?}: {name} did not stop by the deadline")
                    }
                    TaskOutcome::NotAwaited => {}
                }
                TaskReport {
                    name,
                    outcome,
                    took: at.elapsed(),
                }
            });
        let tasks = join_all(runs).await;
        log::info!("shutdown: phase {phase:?} ended in {:?}", began.elapsed());
        phases.push(PhaseReport {
            phase,
            tasks,
            past_deadline,
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

/// What a panic said.
fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("panicked: {what}")
}
