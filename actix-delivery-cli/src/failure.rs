//! How a command ends: its status, or a failure with its exit code (see `AFTER_HELP`).

use std::error::Error;

use actix_delivery::dead_letters::DeadLetterError;
use actix_delivery::journal::JournalError;

/// How a command that ran ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done; exit code 0.
    Clean,
    /// Done, and it found problems; exit code 1.
    ProblemsFound,
}

/// Why a command did not run to its end: what to print (empty: nothing), and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Usage or bad input (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    /// A storage or connection error (exit code 3).
    pub fn storage(message: impl Into<String>) -> Self {
        Self {
            code: 3,
            message: message.into(),
        }
    }

    /// The journal's `error`, in the context of `what` (the argument or the operation), with
    /// its chain of causes; the exit code by its kind.
    pub fn journal(what: &str, error: &JournalError) -> Self {
        let code = match error {
            JournalError::InvalidArgument { .. }
            | JournalError::InvalidPersistenceId(_)
            | JournalError::Schema { .. } => 2,
            JournalError::Corrupt { .. }
            | JournalError::Incompatible { .. }
            | JournalError::ForeignType { .. } => 1,
            _ => 3,
        };
        Self {
            code,
            message: format!("{what}: {}", chain(error)),
        }
    }

    /// The dead-letter store's `error`, in the context of `what`, with its chain of causes: an
    /// unknown entry or an invalid field is bad input (2), anything else a storage error (3).
    pub fn dead_letters(what: &str, error: &DeadLetterError) -> Self {
        let code = match error {
            DeadLetterError::NotFound(_) | DeadLetterError::Invalid(_) => 2,
            _ => 3,
        };
        Self {
            code,
            message: format!("{what}: {}", chain(error)),
        }
    }
}

impl From<std::io::Error> for Failure {
    /// Writing the output failed: a closed pipe ends the command quietly (`… | head`), any
    /// other error is a storage error.
    fn from(error: std::io::Error) -> Self {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            return Self {
                code: 0,
                message: String::new(),
            };
        }
        Self::storage(format!("cannot write the output: {}", chain(&error)))
    }
}

/// An error and its sources, on one line: each source that adds to what the one before said.
pub fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
