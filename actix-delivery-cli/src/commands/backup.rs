//! `backup`: an online backup of a SQLite journal.

use std::path::PathBuf;

use serde_json::json;

use crate::failure::{Failure, Status};
use crate::output::Output;
use crate::{Context, AFTER_HELP};

/// Back up a SQLite journal online to the new file DEST.
///
/// A consistent copy while the application goes on (SQLite's online backup from one read
/// transaction: the journal as of one commit; a copy of the journal's files is not a backup).
/// DEST must not exist. Restore by putting it where the journal was (without the old -wal and
/// -shm files) and opening it. PostgreSQL journals are backed up with the server's tools
/// (pg_basebackup, or pg_dump).
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// The new file.
    #[arg(value_name = "DEST")]
    dest: PathBuf,
}

/// Why `backup` refuses a PostgreSQL journal.
pub const ONLY_SQLITE: &str = "backup: only for a SQLite journal (--sqlite); back up PostgreSQL \
     with its own tools: pg_basebackup (a physical copy, which keeps the transaction ids the \
     tags' offsets are made of) or pg_dump (a logical dump: restored into another cluster, its \
     tag rows need PostgresJournal::RENUMBER_TAGS_SQL)";

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let Some(sqlite) = context.sqlite() else {
        return Err(Failure::usage(ONLY_SQLITE));
    };
    let dest = &args.dest;
    sqlite
        .backup(dest)
        .await
        .map_err(|err| Failure::journal(&format!("backup to {}", dest.display()), &err))?;
    if context.json {
        out.json(&json!({
            "journal": sqlite.path().display().to_string(),
            "backup": dest.display().to_string(),
        }))?;
    } else {
        out.line(&format!(
            "backed up {} to {}",
            sqlite.path().display(),
            dest.display()
        ))?;
    }
    Ok(Status::Clean)
}
