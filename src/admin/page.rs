//! The console's one HTML page: rendered on the server from the same views as the JSON
//! endpoints, no build step and no external asset (inline CSS, a few lines of inline script
//! that refresh it every 2 s and send the Replay and Delete buttons' forms). Every text it
//! shows is escaped: a dead letter's error and body are whatever a peer sent.

use std::fmt::Write as _;

use serde_json::Value;

use crate::admin::confirm::{Action, ConfirmKey};
use crate::admin::views::{self, Section};
use crate::delivery::dead_letters::StoredDeadLetter;

/// What the page shows.
pub(crate) struct PageData<'a> {
    /// The `<base href>`: the scope's root as the request named it, with a trailing `/`.
    pub(crate) base: String,
    pub(crate) sections: &'a [(Section, Vec<Value>)],
    pub(crate) attention: &'a [Value],
    /// The dead letters' counts and handle stats, with a store.
    pub(crate) dead_letters: Option<DeadLetterData<'a>>,
    pub(crate) now_ms: u64,
}

/// The dead letters the page lists.
pub(crate) struct DeadLetterData<'a> {
    pub(crate) counts: Value,
    pub(crate) entries: &'a [StoredDeadLetter],
    pub(crate) more: bool,
    pub(crate) key: &'a ConfirmKey,
    /// Why they could not be read, if they could not.
    pub(crate) error: Option<String>,
}

/// How a column's value is written.
#[derive(Clone, Copy)]
enum Kind {
    Plain,
    /// Milliseconds, written in seconds.
    Ms,
    /// Seconds.
    Secs,
}

/// A column: its heading, the view's key (`a.b` for a nested one) and how it is written.
type Column = (&'static str, &'static str, Kind);

const P: Kind = Kind::Plain;

fn columns(section: Section) -> &'static [Column] {
    match section {
        Section::Producers => &[
            ("name", "name", P),
            ("producer id", "producer_id", P),
            ("durable", "durable", P),
            ("unconfirmed", "unconfirmed", P),
            ("oldest unconfirmed", "oldest_unconfirmed_ms", Kind::Ms),
            ("in doubt", "in_doubt", P),
            ("in flight", "in_flight", P),
            ("queued", "queued", P),
            ("retransmitted", "retransmitted", P),
            ("confirmed", "confirmed", P),
            ("given up", "given_up", P),
            ("stalled", "stalled_ms", Kind::Ms),
        ],
        Section::Consumers => &[
            ("name", "name", P),
            ("tracked producers", "tracked_producers", P),
            ("waiting", "waiting", P),
            ("deferred", "deferred", P),
            ("handled", "delivered", P),
            ("duplicates", "duplicates", P),
            ("handler failures", "handler_failures", P),
            ("stalled", "stalled_ms", Kind::Ms),
            ("dead letters by cause", "dead_letters.by_cause", P),
        ],
        Section::WorkPulling => &[
            ("name", "name", P),
            ("workers", "workers", P),
            ("queued", "queued", P),
            ("jobs held", "jobs", P),
            ("confirmed", "confirmed", P),
            ("rerouted", "rerouted", P),
            ("failed", "failed", P),
            ("given up", "given_up", P),
        ],
        Section::Projections => &[
            ("name", "name", P),
            ("state", "state", P),
            ("offset", "offset", P),
            ("lag (events)", "lag_events_shown", P),
            ("lag", "lag_seconds", Kind::Secs),
            ("last batch lag", "last_batch_lag_ms", Kind::Ms),
            ("events", "events", P),
            ("skipped", "skipped", P),
            ("last error", "last_error", P),
        ],
        Section::EntityHosts => &[
            ("name", "name", P),
            ("entity type", "entity_type", P),
            ("shards", "shards", P),
            ("active", "active", P),
            ("stopping", "stopping", P),
            ("held", "held", P),
            ("activations", "activations", P),
            ("refused (full)", "refused_full", P),
            ("refused (not hosted)", "refused_not_hosted", P),
        ],
        Section::Coordinators => &[
            ("name", "name", P),
            ("member", "member", P),
            ("shards owned", "shards_owned", P),
            ("members", "members", P),
            ("renew failures", "renew_failures", P),
            ("leases lost", "lost", P),
            ("handoffs", "handoffs", P),
        ],
        Section::ShardMaps => &[
            ("name", "name", P),
            ("entity type", "namespace", P),
            ("shards", "shards", P),
            ("members", "members", P),
            ("without a live lease", "without_live_lease", P),
        ],
        Section::Nodes => &[
            ("name", "name", P),
            ("node id", "node_id", P),
            ("listening", "listening", P),
            ("connections open", "connections_open", P),
            ("peers", "peers", P),
            ("refusals", "refusals", P),
        ],
        Section::Carriers => &[
            ("name", "name", P),
            ("connection", "connection", P),
            ("refusals", "refusals", P),
        ],
    }
}

fn title(section: Section) -> &'static str {
    match section {
        Section::Producers => "Producers",
        Section::Consumers => "Consumers",
        Section::WorkPulling => "Work pulling",
        Section::Projections => "Projections",
        Section::EntityHosts => "Entity hosts",
        Section::Coordinators => "Shard coordinators",
        Section::ShardMaps => "Shard maps",
        Section::Nodes => "TCP nodes",
        Section::Carriers => "NATS carriers",
    }
}

const STYLE: &str = "\
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}\
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:baseline}\
h1{font-size:18px;margin:0}h2{font-size:15px;margin:18px 0 6px}\
main,#notice{padding:0 20px}#notice:empty{display:none}\
#notice{margin:10px 20px 0;padding:8px;background:#e7f0ff;border:1px solid #9bb8e8}\
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:6px}\
th,td{border:1px solid #d8dbe1;padding:3px 6px;text-align:left;vertical-align:top}\
th{background:#eceef2;font-weight:600}td{word-break:break-word;max-width:420px}\
.muted{color:#8a93a3}.ok{color:#1e7b34}\
.attention li{color:#8a1c1c;margin:2px 0}.bad td{background:#fff1f1}\
code{font:12px ui-monospace,monospace;white-space:pre-wrap}\
form{display:inline}button{cursor:pointer;margin:1px}";

/// Refreshes the page every 2 s (replacing its `<main>` with the server's), and sends the
/// Replay and Delete forms as JSON, showing the answer in `#notice`.
const SCRIPT: &str = "\
const main=()=>document.getElementById('console');\
async function refresh(){try{const r=await fetch(location.href,{headers:{accept:'text/html'}});\
if(r.ok){const d=new DOMParser().parseFromString(await r.text(),'text/html');\
main().replaceWith(d.getElementById('console'));}}catch(e){}}\
setInterval(refresh,2000);\
document.addEventListener('submit',async e=>{e.preventDefault();const f=e.target;\
const r=await fetch(f.action,{method:'POST',headers:{'content-type':'application/json',\
accept:'application/json'},body:JSON.stringify({confirm:f.elements.confirm.value})});\
const j=await r.json().catch(()=>({}));\
document.getElementById('notice').textContent=(r.ok?'':'refused: ')+(j.error||JSON.stringify(j));\
await refresh();});";

/// The page.
pub(crate) fn render(data: &PageData<'_>) -> String {
    let mut html = String::with_capacity(16 * 1024);
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>actix-delivery console</title><base href=\"{}\"><style>{STYLE}</style></head>\
         <body><header><h1>actix-delivery console</h1>\
         <span>refreshes every 2 s</span></header><p id=\"notice\" role=\"status\"></p>\
         <main id=\"console\" data-at=\"{}\">",
        esc(&data.base),
        data.now_ms
    );
    attention(&mut html, data.attention);
    if let Some(dead_letters) = &data.dead_letters {
        dead_letter_section(&mut html, dead_letters, data.now_ms);
    }
    for (section, views) in data.sections {
        if views.is_empty() {
            continue;
        }
        let _ = write!(
            html,
            "<section id=\"{}\"><h2>{}</h2>",
            section.key(),
            title(*section)
        );
        table(&mut html, columns(*section), views);
        if *section == Section::ShardMaps {
            for view in views {
                leases(&mut html, view);
            }
        }
        html.push_str("</section>");
    }
    if data.sections.iter().all(|(_, views)| views.is_empty()) && data.dead_letters.is_none() {
        html.push_str("<p class=\"muted\">No part was given to the console.</p>");
    }
    let _ = write!(html, "</main><script>{SCRIPT}</script></body></html>");
    html
}

fn attention(html: &mut String, attention: &[Value]) {
    html.push_str("<section id=\"attention\"><h2>Attention</h2>");
    if attention.is_empty() {
        html.push_str("<p class=\"ok\">Nothing is stuck.</p></section>");
        return;
    }
    html.push_str("<ul class=\"attention\">");
    for item in attention {
        let _ = write!(
            html,
            "<li><b>{} · {}</b>: {}</li>",
            esc(item["section"].as_str().unwrap_or("")),
            esc(&text(&item["name"])),
            esc(&text(&item["what"]))
        );
    }
    html.push_str("</ul></section>");
}

fn table(html: &mut String, columns: &[Column], views: &[Value]) {
    html.push_str("<table><tr>");
    for (heading, _, _) in columns {
        let _ = write!(html, "<th>{}</th>", esc(heading));
    }
    html.push_str("</tr>");
    for view in views {
        let bad =
            view.get("error").is_some() || view.get("last_error").is_some_and(|e| !e.is_null());
        let _ = write!(
            html,
            "<tr{} data-name=\"{}\">",
            if bad { " class=\"bad\"" } else { "" },
            esc(&text(&view["name"]))
        );
        if let Some(error) = view.get("error") {
            let _ = write!(
                html,
                "<td>{}</td><td colspan=\"{}\">{}</td>",
                esc(&text(&view["name"])),
                columns.len().saturating_sub(1).max(1),
                esc(&text(error))
            );
        } else {
            for (_, key, kind) in columns {
                let value = key.split('.').fold(view, |value, key| &value[key]);
                let _ = write!(html, "<td>{}</td>", esc(&cell(value, *kind)));
            }
        }
        html.push_str("</tr>");
    }
    html.push_str("</table>");
}

fn leases(html: &mut String, view: &Value) {
    let Some(leases) = view["leases"].as_array() else {
        return;
    };
    let _ = write!(
        html,
        "<table class=\"leases\" data-map=\"{}\"><tr><th>shard</th><th>owner</th><th>token</th>\
         <th>lease left</th><th>live</th><th>address</th></tr>",
        esc(&text(&view["name"]))
    );
    for lease in leases {
        let _ = write!(
            html,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if lease["live"] == true {
                ""
            } else {
                " class=\"bad\""
            },
            esc(&text(&lease["shard"])),
            esc(&text(&lease["owner"])),
            esc(&text(&lease["token"])),
            esc(&cell(&lease["expires_in_ms"], Kind::Ms)),
            esc(&cell(&lease["live"], P)),
            esc(&text(&lease["address"])),
        );
    }
    html.push_str("</table>");
}

fn dead_letter_section(html: &mut String, data: &DeadLetterData<'_>, now_ms: u64) {
    html.push_str("<section id=\"dead-letters\"><h2>Dead letters</h2>");
    if let Some(error) = &data.error {
        let _ = write!(html, "<p class=\"bad\">{}</p></section>", esc(error));
        return;
    }
    let _ = write!(
        html,
        "<p>{} entries, {} bytes; by cause: {}</p>",
        esc(&text(&data.counts["entries"])),
        esc(&text(&data.counts["bytes"])),
        esc(&cell(&data.counts["by_cause"], P))
    );
    if data.entries.is_empty() {
        html.push_str("<p class=\"ok\">None kept.</p></section>");
        return;
    }
    html.push_str(
        "<table><tr><th>id</th><th>source</th><th>cause</th><th>key</th><th>type</th>\
         <th>attempts</th><th>last error</th><th>body</th><th>last kept</th><th></th></tr>",
    );
    for entry in data.entries {
        let summary = views::dead_letter_summary(entry);
        let _ = write!(
            html,
            "<tr id=\"dead-letter-{id}\" class=\"dead-letter\"><td>{id}</td><td>{} {}</td><td>{}</td>\
             <td>{}</td><td>{} v{}</td><td>{}</td><td><code>{}</code></td>\
             <td><a href=\"dead-letters/{id}\">{} bytes</a></td><td>{}</td><td>",
            esc(&text(&summary["kind"])),
            esc(&text(&summary["source"])),
            esc(&text(&summary["cause"])),
            esc(&text(&summary["key"])),
            esc(&text(&summary["manifest"]["type"])),
            esc(&text(&summary["manifest"]["version"])),
            esc(&text(&summary["attempts"])),
            esc(&text(&summary["error"])),
            entry.letter.body_len,
            esc(&ago(now_ms, entry.last_at_ms)),
            id = entry.id,
        );
        for action in [Action::Replay, Action::Delete] {
            let _ = write!(
                html,
                "<form method=\"post\" action=\"dead-letters/{}/{}\">\
                 <input type=\"hidden\" name=\"confirm\" value=\"{}\">\
                 <button type=\"submit\" class=\"{}\">{}</button></form>",
                entry.id,
                action.as_str(),
                esc(&data.key.token(action, entry)),
                action.as_str(),
                match action {
                    Action::Replay => "Replay",
                    Action::Delete => "Delete",
                }
            );
        }
        html.push_str("</td></tr>");
    }
    html.push_str("</table>");
    if data.more {
        html.push_str(
            "<p class=\"muted\">More entries: list them with dead-letters?after_id=…</p>",
        );
    }
    html.push_str("</section>");
}

/// How long before `now_ms` `at_ms` was, in words.
fn ago(now_ms: u64, at_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(at_ms) / 1000;
    match seconds {
        0..60 => format!("{seconds} s ago"),
        60..3600 => format!("{} min ago", seconds / 60),
        3600..86400 => format!("{} h ago", seconds / 3600),
        _ => format!("{} days ago", seconds / 86400),
    }
}

/// A value as a cell's text.
fn cell(value: &Value, kind: Kind) -> String {
    match (value, kind) {
        (Value::Number(ms), Kind::Ms) => match ms.as_f64() {
            Some(ms) => format!("{:.1} s", ms / 1000.0),
            None => ms.to_string(),
        },
        (Value::Number(secs), Kind::Secs) => match secs.as_f64() {
            Some(secs) => format!("{secs:.1} s"),
            None => secs.to_string(),
        },
        (Value::Bool(true), _) => "yes".into(),
        (Value::Bool(false), _) => "no".into(),
        (Value::Array(items), _) if items.is_empty() => "–".into(),
        (Value::Object(map), _) if map.is_empty() => "–".into(),
        (Value::Array(items), _) => items
            .iter()
            .map(|item| match item {
                Value::Object(_) => compact(item),
                other => text(other),
            })
            .collect::<Vec<_>>()
            .join(", "),
        // Counts by name (refusals, causes): those that are not 0.
        (Value::Object(map), _) => {
            let counted: Vec<String> = map
                .iter()
                .filter(|(_, value)| **value != 0)
                .map(|(key, value)| format!("{key}: {}", text(value)))
                .collect();
            match counted.is_empty() {
                true => "none".into(),
                false => counted.join(", "),
            }
        }
        (other, _) => text(other),
    }
}

/// An object in a line: a member's id (and address), a peer's address (and whether it is
/// connected), or its values by key.
fn compact(value: &Value) -> String {
    if let Some(id) = value["id"].as_str() {
        return match value["address"].as_str() {
            Some(address) => format!("{id} ({address})"),
            None => id.to_owned(),
        };
    }
    if let Some(addr) = value["addr"].as_str() {
        let connected = if value["connected"] == true {
            "connected"
        } else {
            "not connected"
        };
        return format!("{addr} ({connected})");
    }
    match value {
        Value::Object(map) => map
            .iter()
            .filter(|(_, value)| !value.is_null())
            .map(|(key, value)| format!("{key} {}", text(value)))
            .collect::<Vec<_>>()
            .join(" "),
        other => text(other),
    }
}

/// A value as text: a string as it is, `–` for null, anything else as JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "–".into(),
        other => other.to_string(),
    }
}

/// `text` escaped for HTML text and double-quoted attributes.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }
}
