//! Real child processes for crash tests: the test binary runs one of its own tests as the
//! child (selected by an environment variable), talks to it over stdin/stdout, and kills it
//! with SIGKILL (`std::process::Child::kill` sends SIGKILL on Unix).
#![allow(dead_code)] // each test binary uses a different subset

pub mod hook;

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// A running child process and its output, line by line.
pub struct Child {
    process: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

/// The name libtest gives the test at `path` (`concat!(module_path!(), "::name")`): the path
/// without the test binary's name, as `--exact` matches it. The tests of several areas share
/// one binary, so a child's entry is named by its module too.
///
/// # Panics
/// If `path` names no module (a bare test name would select nothing, or the wrong test).
pub fn test_name(path: &str) -> &str {
    path.split_once("::")
        .map(|(_binary, name)| name)
        .unwrap_or_else(|| panic!("{path:?}: a test's full path expected (module_path!())"))
}

/// Runs the test at `entry` (its full path: `concat!(module_path!(), "::name")`) of this
/// test binary as a child, with `env` set (the entry checks it to know it is the child).
pub fn spawn(entry: &str, env: &[(&str, String)]) -> Child {
    let entry = test_name(entry);
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([entry, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut process = command.spawn().expect("spawn the child");
    let stdout = process.stdout.take().expect("piped");
    let (sender, lines) = mpsc::channel();
    // libtest announces the test without a newline: the child's first line follows it.
    let announcement = format!("test {entry} ... ");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let line = line
                .strip_prefix(&announcement)
                .map_or(line.clone(), str::to_owned);
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    Child {
        stdin: process.stdin.take(),
        process,
        lines,
    }
}

impl Drop for Child {
    /// A child outlives no test: one whose test failed before it was stopped is SIGKILLed.
    fn drop(&mut self) {
        if matches!(self.process.try_wait(), Ok(None)) {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

impl Child {
    /// Writes one line to the child's stdin; false if the child is gone.
    pub fn send(&mut self, line: &str) -> bool {
        let Some(stdin) = &mut self.stdin else {
            return false;
        };
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .is_ok()
    }

    /// The next output line, waiting at most until `deadline`; `None` at the deadline or when
    /// the child's output ended.
    pub fn next_line(&self, deadline: Instant) -> Option<String> {
        let wait = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(wait).ok()
    }

    /// The next output line if one is ready: `Ok(None)` if none is yet, `Err(())` once the
    /// output ended (for callers that must not block, such as async tests).
    pub fn try_line(&self) -> Result<Option<String>, ()> {
        match self.lines.try_recv() {
            Ok(line) => Ok(Some(line)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(()),
        }
    }

    /// Waits for a line starting with `prefix` (skipping others), at most `timeout`; `None`
    /// if none comes in time.
    pub fn wait_for(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while let Some(line) = self.next_line(deadline) {
            if line.starts_with(prefix) {
                return Some(line);
            }
        }
        None
    }

    /// Waits for a line starting with `prefix` (skipping others), at most `timeout`.
    ///
    /// # Panics
    /// If none comes in time.
    pub fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        self.wait_for(prefix, timeout).unwrap_or_else(|| {
            panic!("the child printed no line starting with {prefix:?} within {timeout:?}")
        })
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// SIGKILLs the child, reaps it, and returns the lines it printed that were not read yet.
    pub fn kill_collect(mut self) -> Vec<String> {
        let _ = self.process.kill();
        let _ = self.process.wait();
        // The pipe ends with the process: the reader thread sends what is left, then hangs up.
        self.lines.iter().collect()
    }

    /// Sends SIGTERM (a polite stop: the child may drain) and waits at most `timeout` for it
    /// to exit; `None` if it is still running then (it is SIGKILLed and reaped).
    pub fn terminate(mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        const SIGTERM: i32 = 15;
        let pid = i32::try_from(self.process.id()).expect("a pid fits in pid_t");
        // SAFETY: `kill(2)` takes plain integers and touches no memory of this process.
        unsafe {
            kill(pid, SIGTERM);
        }
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.process.try_wait().expect("poll the child") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }

    /// Closes the child's stdin and waits for it to exit on its own.
    pub fn finish(mut self) -> std::process::ExitStatus {
        self.stdin = None;
        self.process.wait().expect("wait for the child")
    }
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// SIGKILLs this process at once (for a child that dies at a moment only it can see, such as
/// right after a journal reported a commit): no handler, no cleanup, no flush.
pub fn sigkill_self() -> ! {
    const SIGKILL: i32 = 9;
    let pid = i32::try_from(std::process::id()).expect("a pid fits in pid_t");
    // SAFETY: `kill(2)` takes plain integers and touches no memory of this process.
    unsafe {
        kill(pid, SIGKILL);
    }
    unreachable!("SIGKILL cannot be caught")
}

/// Opens a SQLite journal as `SqliteJournal::open` does, and checks that it commits durably
/// (`synchronous` FULL, WAL): a crash test proves nothing about a journal that does not fsync.
///
/// # Panics
/// If the opened journal reports other settings.
pub async fn open_journal(
    path: impl AsRef<std::path::Path>,
) -> Result<actix_delivery::journal::SqliteJournal, actix_delivery::journal::JournalError> {
    let journal = actix_delivery::journal::SqliteJournal::open(path).await?;
    let durability = journal.durability();
    assert_eq!(
        (durability.synchronous, durability.journal_mode.as_str()),
        (2, "wal"),
        "the journal must commit with synchronous=FULL in WAL mode"
    );
    Ok(journal)
}
