//! `dead-letters`: the dead letters kept in the journal's database (by the application's
//! `SqliteDeadLetters` or `PostgresDeadLetters`): list, show, delete. Listing and showing read
//! through the inspector; deleting goes through the library's store (`--write`).

use std::time::{Duration, UNIX_EPOCH};

use actix_delivery::dead_letters::{DeadLetterFilter, StoredDeadLetter};
use actix_delivery::journal::{JournalInspector, ListedDeadLetter};
use actix_delivery::DeliveryInfo;
use serde_json::{json, Value};

use crate::commands::events::{manifest_json, manifest_text};
use crate::decode::{show, Shown};
use crate::failure::{Failure, Status};
use crate::output::{self, cut, hex, note, Output};
use crate::{Context, AFTER_HELP};

/// List, show or delete the dead letters kept in the journal's database.
///
/// The dead letters an application's dead-letter store (SqliteDeadLetters,
/// PostgresDeadLetters) keeps in the journal's database: messages given up or refused, each
/// with its body as stored bytes, where it came from and why. A journal whose database holds
/// no dead-letter table lists nothing and says so.
///
/// There is no replay here: a replay needs the application's routes
/// (DeadLetters::on_replay), which live in the application. Replay from the admin console or
/// the application.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    List(ListArgs),
    Show(ShowArgs),
    Delete(DeleteArgs),
}

/// List the kept dead letters, oldest first, a page at a time.
///
/// Each entry: id, cause, kind/source, key, attempts, failed replays, when it was first and
/// last kept, its body's length (and whether it was kept) and its last error on one line; its
/// body is not read (`show` prints it). Every filter given must match. When there may be more,
/// a note on stderr says where the next page starts (--after). A bad filter value is refused
/// naming its option (exit code 2).
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
struct ListArgs {
    /// Only this cause: given_up, undecodable, incompatible_version, poison, malformed.
    #[arg(long, value_name = "C")]
    cause: Option<String>,

    /// Only this kind of source: producer, consumer, work_pulling, entity_host, projection.
    #[arg(long, value_name = "K")]
    kind: Option<String>,

    /// Only this source (the part's name).
    #[arg(long, value_name = "S")]
    source: Option<String>,

    /// Only entries last kept at or after this time (milliseconds since the Unix epoch).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    since_ms: Option<String>,

    /// Only entries last kept before this time (milliseconds since the Unix epoch).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    until_ms: Option<String>,

    /// Start after this id (the last one of the previous page).
    #[arg(long, value_name = "ID", allow_negative_numbers = true)]
    after: Option<String>,

    /// At most this many entries (1 to 1000; default 100).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    limit: Option<String>,
}

/// Show one kept dead letter: every field, and its body.
///
/// Its cause, source, key, origin (producer, incarnation, seq), attempts, failed replays,
/// times, last error, manifest (codec, type name, version) and body: decoded to JSON when its
/// codec is MessagePack, else in hex (bincode, raw bytes). An unknown id is refused (exit
/// code 2).
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
struct ShowArgs {
    /// The dead letter's id (as `list` prints it).
    #[arg(value_name = "ID")]
    id: u64,
}

/// Delete one kept dead letter (needs --write).
///
/// Removes the entry and updates the store's totals in one transaction, through the
/// library's dead-letter store (opened on its own: no journal lock is taken, so it works
/// beside the running application). Without --write it is refused (exit code 2) and nothing
/// changes; an unknown id is refused (exit code 2) and nothing changes.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
struct DeleteArgs {
    /// The dead letter's id (as `list` prints it).
    #[arg(value_name = "ID")]
    id: u64,
}

impl Args {
    /// `delete` changes the journal's database.
    pub fn writes(&self) -> bool {
        matches!(self.action, Action::Delete(_))
    }

    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self.action {
            Action::List(_) => "dead-letters list",
            Action::Show(_) => "dead-letters show",
            Action::Delete(_) => "dead-letters delete",
        }
    }
}

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    match args.action {
        Action::List(args) => list(args, context, out).await,
        Action::Show(args) => show_one(args, context, out).await,
        Action::Delete(args) => delete(args, context, out).await,
    }
}

/// Each option of `list` and the filter field it sets.
const OPTIONS: [(&str, &str); 7] = [
    ("cause", "--cause"),
    ("kind", "--kind"),
    ("source", "--source"),
    ("since_ms", "--since-ms"),
    ("until_ms", "--until-ms"),
    ("after_id", "--after"),
    ("limit", "--limit"),
];

/// The filter the options ask for, each value checked by the library's own parser.
fn filter(args: &ListArgs) -> Result<DeadLetterFilter, Failure> {
    let values = [
        &args.cause,
        &args.kind,
        &args.source,
        &args.since_ms,
        &args.until_ms,
        &args.after,
        &args.limit,
    ];
    let pairs = OPTIONS
        .iter()
        .zip(values)
        .filter_map(|((field, _), value)| value.as_deref().map(|value| (*field, value)));
    DeadLetterFilter::parse(pairs).map_err(|err| {
        let option = OPTIONS
            .iter()
            .find(|(field, _)| *field == err.field)
            .map_or(err.field, |(_, option)| option);
        Failure::usage(format!("{option}: {}", err.reason))
    })
}

/// The error text of a failed read of dead letters.
fn read_failed(err: &actix_delivery::journal::JournalError) -> Failure {
    Failure::journal("dead letters", err)
}

/// The note for a journal whose database holds no dead-letter table.
fn no_table(inspector: &dyn JournalInspector) -> String {
    format!(
        "{} holds no dead letters: no dead-letter store was ever opened on it",
        inspector.schema().location
    )
}

/// An error cut to one line for the table.
const TABLE_ERROR: usize = 80;
/// A key cut for the table.
const TABLE_KEY: usize = 48;

async fn list(args: ListArgs, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let filter = filter(&args)?;
    let inspector = context.inspector();
    let Some(listing) = inspector
        .dead_letters(&filter)
        .await
        .map_err(|err| read_failed(&err))?
    else {
        note(&format!("({})", no_table(inspector)));
        return Ok(Status::Clean);
    };
    if context.json {
        for listed in &listing.entries {
            out.json(&listed_json(listed))?;
        }
    } else {
        let rows: Vec<Vec<String>> = listing.entries.iter().map(row).collect();
        out.table(
            &[
                "ID",
                "CAUSE",
                "SOURCE",
                "KEY",
                "ATTEMPTS",
                "REPLAYS FAILED",
                "FIRST KEPT",
                "LAST KEPT",
                "BODY",
                "ERROR",
            ],
            &rows,
        )?;
    }
    out.flush()?;
    if let Some(next) = listing.next {
        note(&format!("(more dead letters may follow: --after {next})"));
    } else if listing.entries.is_empty() {
        let filtered = filter != DeadLetterFilter::default();
        note(if filtered {
            "(no dead letter matches)"
        } else {
            "(no dead letters kept)"
        });
    }
    Ok(Status::Clean)
}

async fn show_one(args: ShowArgs, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let entry = find(args.id, context).await?;
    if context.json {
        out.json(&shown_json(&entry))?;
        return Ok(Status::Clean);
    }
    let letter = &entry.letter;
    let mut lines = vec![
        ("id", entry.id.to_string()),
        ("cause", letter.cause.to_string()),
        ("kind", letter.kind.to_string()),
        ("source", letter.source.clone()),
        ("key", letter.key.clone()),
        ("origin", origin_text(letter.origin.as_ref())),
        ("attempts", letter.attempts.to_string()),
        ("replays failed", entry.replay_failures.to_string()),
        ("first kept", time_text(entry.first_at_ms)),
        ("last kept", time_text(entry.last_at_ms)),
        ("manifest", manifest_text(&letter.manifest)),
        ("body length", format!("{} bytes", letter.body_len)),
    ];
    lines.push((
        "body",
        match &letter.body {
            None => "not kept".to_owned(),
            Some(body) => match show(body, &letter.manifest) {
                Shown::Events(events) => pretty(&Value::Array(events)),
                Shown::Value(value) => pretty(&value),
                Shown::Bytes => format!("(hex) {}", hex(body)),
            },
        },
    ));
    lines.push((
        "error",
        if letter.error.is_empty() {
            "-".to_owned()
        } else {
            letter.error.clone()
        },
    ));
    let width = lines.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in lines {
        let indent = " ".repeat(width + 2);
        let value = value.replace('\n', &format!("\n{indent}"));
        out.line(format!("{name:<width$}  {value}").trim_end())?;
    }
    Ok(Status::Clean)
}

async fn delete(args: DeleteArgs, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    let entry = find(args.id, context).await?;
    let store = context
        .dead_letter_store()
        .await
        .map_err(|err| Failure::dead_letters("dead letters: cannot open the store", &err))?;
    let what = format!("dead-letters delete {}", entry.id);
    let removed = store
        .remove(entry.id)
        .await
        .map_err(|err| Failure::dead_letters(&what, &err))?;
    if !removed {
        return Err(Failure::usage(format!(
            "ID: no dead letter {} (removed meanwhile): nothing changed",
            entry.id
        )));
    }
    if context.json {
        out.json(&json!({ "deleted": entry.id }))?;
    } else {
        out.line(&format!(
            "deleted dead letter {} ({}, {} `{}`)",
            entry.id, entry.letter.cause, entry.letter.kind, entry.letter.source
        ))?;
    }
    Ok(Status::Clean)
}

/// The entry `id`, or a usage failure naming it (and saying whether the journal keeps dead
/// letters at all).
async fn find(id: u64, context: &Context) -> Result<StoredDeadLetter, Failure> {
    let inspector = context.inspector();
    if let Some(entry) = inspector
        .dead_letter(id)
        .await
        .map_err(|err| read_failed(&err))?
    {
        return Ok(entry);
    }
    let probe = DeadLetterFilter {
        limit: Some(1),
        ..DeadLetterFilter::default()
    };
    let tables = inspector
        .dead_letters(&probe)
        .await
        .map_err(|err| read_failed(&err))?
        .is_some();
    let why = if tables {
        format!("no dead letter {id} in {}", inspector.schema().location)
    } else {
        format!("no dead letter {id}: {}", no_table(inspector))
    };
    Err(Failure::usage(format!("ID: {why}; nothing changed")))
}

/// A time kept as milliseconds since the Unix epoch, for people.
fn time_text(millis: u64) -> String {
    output::time(UNIX_EPOCH + Duration::from_millis(millis))
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// `producer p-1, incarnation 00…2a, seq 7` (`seqs 5..7` for a chunked message), or `-`.
fn origin_text(origin: Option<&DeliveryInfo>) -> String {
    let Some(origin) = origin else {
        return "-".to_owned();
    };
    let seqs = origin.seqs();
    let seq = if seqs.start() == seqs.end() {
        format!("seq {}", origin.seq)
    } else {
        format!("seqs {}..{}", seqs.start(), seqs.end())
    };
    format!(
        "producer {}, incarnation {}, {seq}",
        origin.producer_id, origin.incarnation
    )
}

fn origin_json(origin: Option<&DeliveryInfo>) -> Value {
    origin.map_or(Value::Null, |origin| {
        json!({
            "producer_id": origin.producer_id.as_str(),
            "incarnation": origin.incarnation.to_string(),
            "seq": origin.seq,
            "first_seq": origin.first_seq,
        })
    })
}

/// The error on one line, cut.
fn one_line(text: &str, max: usize) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        "-".to_owned()
    } else {
        cut(&line, max)
    }
}

fn row(listed: &ListedDeadLetter) -> Vec<String> {
    let entry = &listed.entry;
    let letter = &entry.letter;
    let body = if listed.body_kept {
        format!("{} B", letter.body_len)
    } else {
        format!("{} B, not kept", letter.body_len)
    };
    vec![
        entry.id.to_string(),
        letter.cause.to_string(),
        format!("{}/{}", letter.kind, letter.source),
        if letter.key.is_empty() {
            "-".to_owned()
        } else {
            cut(&letter.key, TABLE_KEY)
        },
        letter.attempts.to_string(),
        entry.replay_failures.to_string(),
        time_text(entry.first_at_ms),
        time_text(entry.last_at_ms),
        body,
        one_line(&letter.error, TABLE_ERROR),
    ]
}

/// The fields every JSON line of an entry has.
fn entry_json(entry: &StoredDeadLetter, body_kept: bool) -> Value {
    let letter = &entry.letter;
    json!({
        "id": entry.id,
        "cause": letter.cause.as_str(),
        "kind": letter.kind.as_str(),
        "source": letter.source,
        "key": letter.key,
        "origin": origin_json(letter.origin.as_ref()),
        "manifest": manifest_json(&letter.manifest),
        "attempts": letter.attempts,
        "replay_failures": entry.replay_failures,
        "first_at": time_text(entry.first_at_ms),
        "first_at_ms": entry.first_at_ms,
        "last_at": time_text(entry.last_at_ms),
        "last_at_ms": entry.last_at_ms,
        "body_len": letter.body_len,
        "body_kept": body_kept,
        "error": letter.error,
    })
}

fn listed_json(listed: &ListedDeadLetter) -> Value {
    entry_json(&listed.entry, listed.body_kept)
}

fn shown_json(entry: &StoredDeadLetter) -> Value {
    let letter = &entry.letter;
    let mut line = entry_json(entry, letter.body.is_some());
    if let Some(body) = &letter.body {
        let (key, value) = match show(body, &letter.manifest) {
            Shown::Events(events) => ("events", Value::Array(events)),
            Shown::Value(value) => ("value", value),
            Shown::Bytes => ("hex", Value::String(hex(body))),
        };
        line[key] = value;
    }
    line
}
