//! `dead-letters`: the dead letters kept in the journal's database (by the application's
//! `SqliteDeadLetters` or `PostgresDeadLetters`): list, show, delete, replay. Listing and
//! showing read through the inspector; deleting goes through the library's store (`--write`);
//! replaying goes through the application's admin console (`--write`, `--console`), since it
//! needs the application's routes.

use std::time::{Duration, UNIX_EPOCH};

use actix_delivery::dead_letters::{DeadLetterFilter, StoredDeadLetter};
use actix_delivery::journal::{JournalInspector, ListedDeadLetter};
use actix_delivery::DeliveryInfo;
use serde_json::{json, Value};

use crate::commands::events::{manifest_json, manifest_text};
use crate::console::Console;
use crate::decode::{show, Shown};
use crate::failure::{Failure, Status};
use crate::output::{self, cut, hex, note, Output};
use crate::{Context, AFTER_HELP};

/// List, show, delete or replay the dead letters kept in the journal's database.
///
/// The dead letters an application's dead-letter store (SqliteDeadLetters,
/// PostgresDeadLetters) keeps in the journal's database: messages given up or refused, each
/// with its body as stored bytes, where it came from and why. A journal whose database holds
/// no dead-letter table lists nothing and says so.
///
/// `replay` goes through the running application's admin console (--console URL), not the
/// journal: a replay needs the application's routes (DeadLetters::on_replay), which live in the
/// application.
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
    Replay(ReplayArgs),
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

/// Replay one dead letter through the application's admin console (needs --write).
///
/// A replay needs the application's routes (DeadLetters::on_replay), so it goes through the
/// admin console the application mounts on its own server (actix-delivery's admin::Console,
/// feature `admin`): it reads the entry there (GET <URL>/dead-letters/ID, with its confirmation
/// token), then asks for its replay with that token (POST <URL>/dead-letters/ID/replay). The
/// console replays it from the application's own dead-letter store, through its source's
/// route, effectively once, and removes it; this prints whether it was applied or had been
/// applied already. It takes no journal option (--sqlite, --postgres, --schema are refused):
/// the console's store is the one replayed from.
///
/// Plain http:// only: the console is served by the application's server; where a TLS proxy
/// is in front of it, give the server's own address. The console's bearer token
/// (Console::require_bearer) is read from the environment variable --token-env names, never
/// from the command line (it would show in the process list).
///
/// Without --write it is refused (exit code 2) and nothing changes. Exit code 2, nothing
/// changed: an unknown id; an entry the application cannot replay (its body was not kept, no
/// longer decodes as the type its route reads, or its source has no route); an entry that
/// changed between its reading and its replay (run it again); a token the console refuses.
/// Exit code 1: the replay's route failed: the entry is kept, and the replay is in doubt (the
/// destination may have applied it; an effectively-once destination applies a replay again
/// once at most) unless the route said the destination did not apply it. Exit code 3: the
/// console cannot be reached, does not answer within 60 s, or failed.
#[derive(clap::Args, Debug)]
#[command(after_help = AFTER_HELP)]
struct ReplayArgs {
    /// The dead letter's id (as `list` prints it).
    #[arg(value_name = "ID")]
    id: u64,

    /// The admin console: the http:// URL of the scope the application mounts
    /// (Console::scope), e.g. http://127.0.0.1:8080/admin.
    #[arg(long, value_name = "URL")]
    console: String,

    /// The environment variable holding the console's bearer token, if it requires one
    /// [default: ACTIX_DELIVERY_ADMIN_TOKEN; when given, it must be set].
    #[arg(long, value_name = "VAR")]
    token_env: Option<String>,
}

impl Args {
    /// `delete` changes the journal's database; `replay`, the application's data (through
    /// its console).
    pub fn writes(&self) -> bool {
        matches!(self.action, Action::Delete(_) | Action::Replay(_))
    }

    /// Whether it goes through the application's admin console instead of the journal.
    pub fn uses_console(&self) -> bool {
        matches!(self.action, Action::Replay(_))
    }

    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self.action {
            Action::List(_) => "dead-letters list",
            Action::Show(_) => "dead-letters show",
            Action::Delete(_) => "dead-letters delete",
            Action::Replay(_) => "dead-letters replay",
        }
    }
}

pub async fn run(args: Args, context: &Context, out: &mut Output) -> Result<Status, Failure> {
    match args.action {
        Action::List(args) => list(args, context, out).await,
        Action::Show(args) => show_one(args, context, out).await,
        Action::Delete(args) => delete(args, context, out).await,
        Action::Replay(_) => unreachable!("`replay` goes through the console (run_console)"),
    }
}

/// Runs an action of the admin console (`uses_console`); `json`: print JSON lines.
pub async fn run_console(args: Args, json: bool, out: &mut Output) -> Result<Status, Failure> {
    match args.action {
        Action::Replay(args) => replay(args, json, out).await,
        Action::List(_) | Action::Show(_) | Action::Delete(_) => {
            unreachable!("only `replay` goes through the console")
        }
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
        // Every value but the id may hold a peer's text: its control characters are escaped,
        // its lines (a pretty body's, an error's) indented.
        let value = value
            .split('\n')
            .map(output::printable)
            .collect::<Vec<_>>()
            .join(&format!("\n{indent}"));
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
            entry.id,
            entry.letter.cause,
            entry.letter.kind,
            output::printable(&entry.letter.source)
        ))?;
    }
    Ok(Status::Clean)
}

async fn replay(args: ReplayArgs, json: bool, out: &mut Output) -> Result<Status, Failure> {
    let console = Console::new(&args.console, args.token_env.as_deref())?;
    let id = args.id;
    let path = format!("dead-letters/{id}");

    // The entry as it is now, with the token that confirms its replay.
    let shown = console.get(&path).await?;
    let entry = match shown.status.as_u16() {
        200 => shown.json,
        404 if shown.json.is_some() => {
            return Err(Failure::usage(format!(
                "ID: {}: {}; nothing changed",
                console.url(&path),
                shown.error()
            )));
        }
        404 => {
            return Err(Failure::usage(format!(
                "--console: GET {} answered 404 without the console's JSON: is --console the URL \
                 of the scope the application mounts the console at (Console::scope, e.g. \
                 http://127.0.0.1:8080/admin)? Nothing changed",
                console.url(&path)
            )));
        }
        _ => {
            return Err(console.unexpected(&format!("GET {}", console.url(&path)), &shown));
        }
    };
    let confirmed = entry.and_then(|entry| {
        let token = entry.pointer("/confirm/replay")?.as_str()?.to_owned();
        Some((entry, token))
    });
    let Some((entry, token)) = confirmed else {
        return Err(Failure::storage(format!(
            "GET {}: the answer is not an entry with its confirmation token (confirm.replay): \
             is --console an actix-delivery admin console? Nothing changed",
            console.url(&path)
        )));
    };
    let what = format!(
        "dead letter {id} ({}, {} `{}`)",
        entry["cause"].as_str().unwrap_or("?"),
        entry["kind"].as_str().unwrap_or("?"),
        output::printable(entry["source"].as_str().unwrap_or("?")),
    );

    let replay_path = format!("{path}/replay");
    let answer = console
        .post(&replay_path, &json!({ "confirm": token }))
        .await?;
    let error = answer.error();
    match answer.status.as_u16() {
        200 => {}
        404 => {
            return Err(Failure::usage(format!(
                "ID: no dead letter {id} any more (replayed or deleted meanwhile): {error}; \
                 nothing changed"
            )));
        }
        // Its route is running a replay of it (another operator, the page).
        409 if answer.field() == Some("id") => {
            return Err(Failure::usage(format!(
                "{what}: {error}: nothing changed; once it ends, the entry is gone (applied) \
                 or kept (failed: run the replay again)"
            )));
        }
        409 => {
            return Err(Failure::usage(format!(
                "{what} changed between its reading and its replay (a later letter or a failed \
                 replay updated it): nothing changed; run the replay again ({error})"
            )));
        }
        422 => {
            return Err(Failure::usage(format!(
                "{what} cannot be replayed: {error}; nothing changed (the entry is kept)"
            )));
        }
        502 => {
            let outcome = match answer.happened() {
                Some("certainly_not") => "nothing was applied (its route says so)",
                _ => {
                    "the replay is in doubt: the destination may have applied it (an \
                     effectively-once destination applies a replay again once at most)"
                }
            };
            return Err(Failure {
                code: 1,
                message: format!(
                    "{what}: its replay failed in the application: {error}; the entry is kept, \
                     and {outcome}"
                ),
            });
        }
        _ => {
            return Err(console.unexpected(&format!("POST {}", console.url(&replay_path)), &answer));
        }
    }
    let replayed = answer
        .json
        .as_ref()
        .and_then(|body| body.get("replayed"))
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    if json {
        out.json(&json!({ "id": id, "replayed": replayed }))?;
    } else {
        let how = match replayed.as_str() {
            "applied" => "applied".to_owned(),
            "already_applied" => {
                "already applied (the destination had applied it before: nothing was applied \
                 twice; the entry is removed)"
                    .to_owned()
            }
            other => other.to_owned(),
        };
        out.line(&format!("replayed {what}: {how}"))?;
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
    // The producer id is a peer's text.
    output::printable(&format!(
        "producer {}, incarnation {}, {seq}",
        origin.producer_id, origin.incarnation
    ))
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

/// A peer's text on one line (its white space folded first, then its control characters
/// escaped), cut.
fn one_line(text: &str, max: usize) -> String {
    let line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        "-".to_owned()
    } else {
        cut(&output::printable(&line), max)
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
    // Source, key and error are a peer's text: their control characters are escaped before
    // they are cut.
    vec![
        entry.id.to_string(),
        letter.cause.to_string(),
        output::printable(&format!("{}/{}", letter.kind, letter.source)),
        if letter.key.is_empty() {
            "-".to_owned()
        } else {
            cut(&output::printable(&letter.key), TABLE_KEY)
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
