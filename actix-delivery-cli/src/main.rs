//! `actix-delivery`: the command-line inspector of actix-delivery's journals (a SQLite file or
//! a PostgreSQL schema). It parses its arguments, calls the library's read-only inspection
//! (`actix_delivery::journal::JournalInspector`, `actix_delivery::durable::read_durable_stream`)
//! and prints what they return; see `README.md` and `--help`. The commands that write need
//! `--write`: `dead-letters delete` removes an entry through the library's dead-letter store
//! (`Context::dead_letter_store`); `dead-letters replay` goes through the application's admin
//! console over HTTP (`console`), without the journal.

mod commands;
mod console;
mod decode;
mod failure;
mod output;

use std::process::ExitCode;

use actix_delivery::dead_letters::{DeadLetterError, DeadLetterLimits, DeadLetterStore};
use actix_delivery::journal::{
    JournalInspector, PostgresDeadLetters, PostgresInspector, PostgresOptions, SqliteDeadLetters,
    SqliteInspector,
};
use clap::{CommandFactory, Parser};

use crate::commands::Command;
use crate::failure::{Failure, Status};
use crate::output::Output;

/// What every command's help ends with: the exit codes and the write rule.
pub const AFTER_HELP: &str = "\
Read-only by default: the journal is opened read-only (SQLite: a read-only connection that \
takes no lock, so it works beside the application that has the journal open; PostgreSQL: a \
read-only session). A command that changes data needs --write: `dead-letters delete`, and \
`dead-letters replay`, which goes through the application's admin console (--console), not \
the journal (`backup` writes only its new file DEST).

Exit codes:
  0  done (check: no problem found)
  1  problems found: check found broken invariants, or the journal holds data that cannot be \
read (corrupt, or a durable stream its producer could not open); a replay failed in the \
application (the entry kept, the replay in doubt)
  2  usage or bad input: an unknown command or option, a malformed number or filter, an \
unknown stream or dead letter, a change without --write, a file or schema that is not a \
journal, a journal of a newer schema version, a dead letter the application cannot replay, a \
bearer token the console refuses
  3  storage or connection error: the file cannot be read, the server or the console cannot \
be reached or refuses the login";

/// actix-delivery's journal inspector.
///
/// Lists a journal's streams, prints their events, shows durable producers' unconfirmed
/// messages, checks the journal's invariants, backs up a SQLite journal, and lists, shows and
/// deletes the dead letters kept in its database: a SQLite file (--sqlite) or a PostgreSQL
/// schema (--postgres, --schema). Replays a dead letter through the application's admin
/// console (dead-letters replay --console URL).
#[derive(Parser, Debug)]
#[command(name = "actix-delivery", version, after_help = AFTER_HELP)]
struct Cli {
    /// The SQLite journal file.
    #[arg(
        long,
        value_name = "PATH",
        global = true,
        conflicts_with = "postgres",
        help_heading = "Journal"
    )]
    sqlite: Option<std::path::PathBuf>,

    /// The PostgreSQL database: a libpq-style "host=… user=… dbname=…" string or a
    /// postgresql:// URL (never echoed: it may hold a password).
    #[arg(
        long,
        value_name = "CONNECTION",
        global = true,
        help_heading = "Journal"
    )]
    postgres: Option<String>,

    /// The PostgreSQL schema holding the journal's tables (default: public).
    #[arg(long, value_name = "NAME", global = true, help_heading = "Journal")]
    schema: Option<String>,

    /// Print JSON, one object a line, instead of a table.
    #[arg(long, global = true)]
    json: bool,

    /// Allow commands that change data (`dead-letters delete` and `dead-letters replay`).
    #[arg(long, global = true)]
    write: bool,

    #[command(subcommand)]
    command: Command,
}

/// The journal a command reads, and how it was asked to print.
pub struct Context {
    journal: Journal,
    /// JSON lines instead of tables.
    pub json: bool,
}

/// The journal, by its kind.
enum Journal {
    Sqlite(SqliteInspector),
    Postgres {
        inspector: PostgresInspector,
        /// The connection string and options it was reached with (for a command that writes).
        connection: String,
        options: Box<PostgresOptions>,
    },
}

impl Context {
    /// The journal's read-only view.
    pub fn inspector(&self) -> &dyn JournalInspector {
        match &self.journal {
            Journal::Sqlite(inspector) => inspector,
            Journal::Postgres { inspector, .. } => inspector,
        }
    }

    /// The journal's dead-letter store, opened for writing without opening the journal (no
    /// lock taken: the application may have the journal open).
    pub async fn dead_letter_store(&self) -> Result<Box<dyn DeadLetterStore>, DeadLetterError> {
        let limits = DeadLetterLimits::default();
        Ok(match &self.journal {
            Journal::Sqlite(inspector) => {
                Box::new(SqliteDeadLetters::open_file(inspector.path(), limits).await?)
            }
            Journal::Postgres {
                connection,
                options,
                ..
            } => Box::new(PostgresDeadLetters::connect(connection, options, limits).await?),
        })
    }

    /// The SQLite journal, if that is the one.
    pub fn sqlite(&self) -> Option<&SqliteInspector> {
        match &self.journal {
            Journal::Sqlite(inspector) => Some(inspector),
            Journal::Postgres { .. } => None,
        }
    }
}

fn main() -> ExitCode {
    // Usage errors exit 2 and --help 0, as clap does.
    let cli = Cli::parse();
    let result = if cli.command.uses_console() {
        // The HTTP client (awc) runs on an actix System.
        actix_rt::System::new().block_on(run_console(cli))
    } else {
        match tokio::runtime::Builder::new_current_thread().build() {
            Ok(runtime) => runtime.block_on(run(cli)),
            Err(err) => Err(Failure::storage(format!("cannot start a runtime: {err}"))),
        }
    };
    match result {
        Ok(Status::Clean) => ExitCode::SUCCESS,
        Ok(Status::ProblemsFound) => ExitCode::from(1),
        Err(failure) => report(&failure),
    }
}

fn report(failure: &Failure) -> ExitCode {
    if !failure.message.is_empty() {
        eprintln!("actix-delivery: error: {}", failure.message);
    }
    ExitCode::from(failure.code)
}

/// A command that changes data without `--write`: refused.
fn refuse_without_write(cli: &Cli) -> Result<(), Failure> {
    if cli.command.writes() && !cli.write {
        let what = if cli.command.uses_console() {
            "the application's data (through its admin console)"
        } else {
            "the journal"
        };
        return Err(Failure::usage(format!(
            "`{}` changes {what}: give --write to allow it (nothing was changed)",
            cli.command.name()
        )));
    }
    Ok(())
}

/// A command that goes through the application's admin console: no journal.
async fn run_console(cli: Cli) -> Result<Status, Failure> {
    refuse_without_write(&cli)?;
    let journal_options = [
        (cli.sqlite.is_some(), "--sqlite"),
        (cli.postgres.is_some(), "--postgres"),
        (cli.schema.is_some(), "--schema"),
    ];
    if let Some((_, option)) = journal_options.iter().find(|(given, _)| *given) {
        return Err(Failure::usage(format!(
            "{option}: `{}` goes through the application's admin console (--console), which \
             works on the application's own dead-letter store: it takes no journal option \
             (nothing was changed)",
            cli.command.name()
        )));
    }
    let mut out = Output::stdout();
    let status = cli.command.run_console(cli.json, &mut out).await;
    out.flush()?;
    status
}

async fn run(cli: Cli) -> Result<Status, Failure> {
    refuse_without_write(&cli)?;
    if cli.schema.is_some() && cli.postgres.is_none() {
        return Err(Failure::usage(
            "--schema: only for a PostgreSQL journal (--postgres)",
        ));
    }
    if let (Some(refusal), Some(_)) = (cli.command.sqlite_only(), &cli.postgres) {
        return Err(Failure::usage(refusal));
    }
    let journal = match (&cli.sqlite, &cli.postgres) {
        (Some(path), _) => Journal::Sqlite(
            SqliteInspector::open(path)
                .await
                .map_err(|err| Failure::journal(&format!("--sqlite {}", path.display()), &err))?,
        ),
        (None, Some(connection)) => {
            let mut options = PostgresOptions::builder();
            if let Some(schema) = &cli.schema {
                options = options.schema(schema.clone());
            }
            let options = options
                .build()
                .map_err(|err| Failure::usage(format!("--schema: {}", err.reason)))?;
            Journal::Postgres {
                inspector: PostgresInspector::connect(connection, &options)
                    .await
                    .map_err(|err| Failure::journal("--postgres", &err))?,
                connection: connection.clone(),
                options: Box::new(options),
            }
        }
        (None, None) => {
            let mut command = Cli::command();
            command
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "which journal: give --sqlite PATH or --postgres CONNECTION",
                )
                .exit();
        }
    };
    let context = Context {
        journal,
        json: cli.json,
    };
    let mut out = Output::stdout();
    let status = cli.command.run(&context, &mut out).await;
    out.flush()?;
    status
}
