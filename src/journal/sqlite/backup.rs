//! A consistent copy of a live journal, through SQLite's online backup API.
//!
//! Copying the files of a live journal is not a backup: the newest commits live in the
//! `-wal` file until a checkpoint moves them into the database file, so a copy of the `.db`
//! alone lacks acknowledged events, and a copy of both taken while the writer appends can pair
//! a `.db` with a `-wal` cut short, which SQLite reads as "the transactions after the cut never
//! happened", silently. The backup API instead copies the database as one read transaction
//! sees it: the file and its log as of one commit.
//!
//! The copy runs on a connection and thread of its own. It opens a read transaction first and
//! keeps it across all the steps, so every page comes from the same snapshot (SQLite would
//! otherwise restart a backup whenever another connection commits, and under steady appends
//! never finish), and copies [`STEP_PAGES`] pages per step. In WAL mode a reader never blocks
//! the writer: appends go on while the copy runs (the log just cannot be checkpointed past the
//! snapshot meanwhile). The copy is written to `<path>.partial`, synced, and renamed to `path`,
//! so `path` never names half a backup.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::backup::{Backup, StepResult};
use rusqlite::Connection;

use crate::journal::sqlite::{schema, storage_error};
use crate::journal::JournalError;
use crate::runtime::error_chain::ErrorChain;

/// Pages copied per step (1 MiB at SQLite's default page size of 4 KiB).
const STEP_PAGES: i32 = 256;

/// Copies the journal file at `source` to the new file `dest`.
pub(super) fn run(source: &Path, dest: &Path, busy_timeout: Duration) -> Result<(), JournalError> {
    let cannot = |what: &str, err: &std::io::Error| {
        let err = ErrorChain(err);
        JournalError::storage(None, format!("backup to {}: {what}: {err}", dest.display()))
    };
    if dest.exists() {
        return Err(JournalError::InvalidArgument {
            persistence_id: None,
            reason: format!(
                "backup to {}: the file exists; a backup goes to a new file",
                dest.display()
            ),
        });
    }
    let mut partial = dest.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    // Created here, so that two backups to one name cannot write one file.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&partial)
        .map_err(|err| cannot(&format!("cannot create {}", partial.display()), &err))?;
    let copied = copy(source, &partial, busy_timeout)
        .and_then(|()| sync(&partial).map_err(|err| cannot("cannot sync the copy", &err)))
        .and_then(|()| {
            std::fs::rename(&partial, dest).map_err(|err| cannot("cannot rename the copy", &err))
        });
    if copied.is_err() {
        let _ = std::fs::remove_file(&partial);
        return copied;
    }
    // The rename is durable once the directory is.
    if let Some(dir) = dest.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        sync(dir).map_err(|err| cannot("cannot sync its directory", &err))?;
    }
    Ok(())
}

/// Copies the database step by step, every step from one read transaction's snapshot.
fn copy(source: &Path, dest: &Path, busy_timeout: Duration) -> Result<(), JournalError> {
    let error = storage_error(None);
    let from = schema::open_reader(source, busy_timeout)?;
    // The snapshot: a read transaction, begun by its first read, held until the copy is done.
    from.execute_batch("BEGIN")
        .and_then(|()| from.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(())))
        .map_err(&error)?;
    let mut to = Connection::open(dest).map_err(&error)?;
    {
        let backup = Backup::new(&from, &mut to).map_err(&error)?;
        let deadline = Instant::now() + busy_timeout;
        loop {
            match backup.step(STEP_PAGES).map_err(&error)? {
                StepResult::Done => break,
                StepResult::More => {}
                // A lock on the new file, held by someone else: wait, up to busy_timeout.
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                _ => {
                    return Err(JournalError::storage(
                        None,
                        format!("backup to {}: the new file is locked", dest.display()),
                    ))
                }
            }
        }
    }
    to.close().map_err(|(_, err)| error(err))?;
    let _ = from.execute_batch("COMMIT");
    Ok(())
}

/// Flushes a file (or a directory) to disk.
fn sync(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}
