//! The commands, one file each: its arguments (`Args`, with `writes()`: whether it changes the
//! journal) and its `run`. A new command is a file here and its line in each `match` below.
//! A command that goes through the application's admin console instead of the journal
//! (`dead-letters replay`) says so (`uses_console`) and runs with `run_console`.

mod backup;
mod check;
mod dead_letters;
mod durable;
mod events;
mod streams;

use actix_delivery::journal::PersistenceId;
use clap::Subcommand;

use crate::failure::{Failure, Status};
use crate::output::Output;
use crate::Context;

#[derive(Subcommand, Debug)]
pub enum Command {
    Streams(streams::Args),
    Events(events::Args),
    Durable(durable::Args),
    Check(check::Args),
    Backup(backup::Args),
    DeadLetters(dead_letters::Args),
}

impl Command {
    /// Its name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Streams(_) => "streams",
            Self::Events(_) => "events",
            Self::Durable(_) => "durable",
            Self::Check(_) => "check",
            Self::Backup(_) => "backup",
            Self::DeadLetters(args) => args.name(),
        }
    }

    /// Whether it changes the journal (and so needs `--write`).
    pub fn writes(&self) -> bool {
        // Only dead letters' delete and replay write (a backup writes only DEST, a new file).
        matches!(self, Self::DeadLetters(args) if args.writes())
    }

    /// Whether it goes through the application's admin console instead of the journal (then
    /// it takes no journal option, and runs with [`run_console`](Self::run_console)).
    pub fn uses_console(&self) -> bool {
        match self {
            Self::DeadLetters(args) => args.uses_console(),
            _ => false,
        }
    }

    /// Why it needs a SQLite journal, if it does.
    pub fn sqlite_only(&self) -> Option<&'static str> {
        match self {
            Self::Backup(_) => Some(backup::ONLY_SQLITE),
            _ => None,
        }
    }

    pub async fn run(self, context: &Context, out: &mut Output) -> Result<Status, Failure> {
        match self {
            Self::Streams(args) => streams::run(args, context, out).await,
            Self::Events(args) => events::run(args, context, out).await,
            Self::Durable(args) => durable::run(args, context, out).await,
            Self::Check(args) => check::run(args, context, out).await,
            Self::Backup(args) => backup::run(args, context, out).await,
            Self::DeadLetters(args) => dead_letters::run(args, context, out).await,
        }
    }

    /// Runs a command that [`uses_console`](Self::uses_console) (on an actix System: the
    /// HTTP client needs one); `json`: print JSON lines.
    pub async fn run_console(self, json: bool, out: &mut Output) -> Result<Status, Failure> {
        match self {
            Self::DeadLetters(args) => dead_letters::run_console(args, json, out).await,
            _ => unreachable!("`{}` reads the journal", self.name()),
        }
    }
}

/// A persistence id given as an argument.
pub fn stream_id(text: &str) -> Result<PersistenceId, String> {
    PersistenceId::new(text).map_err(|err| err.to_string())
}

/// The largest page a command reads at once.
pub const MAX_LIMIT: u64 = 100_000;
