//! The console's routes: [`Console::scope`] and its handlers.

use actix_web::body::BoxBody;
use actix_web::dev::{Service, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, ContentType};
use actix_web::http::StatusCode;
use actix_web::{
    web, HttpMessage, HttpRequest, HttpResponse, Resource, ResponseError, Route, Scope,
};
use futures_util::future::{ready, Either};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::admin::confirm::Action;
use crate::admin::console::Console;
use crate::admin::error::AdminError;
use crate::admin::page::{self, DeadLetterData, PageData};
use crate::admin::views::{self, Section};
use crate::delivery::dead_letter_handle::{now_ms, DeadLetters, Replayed};
use crate::delivery::dead_letters::DeadLetterFilter;

/// How many dead letters the page lists.
const PAGE_ENTRIES: u32 = 50;
/// The longest body a write takes, in bytes (it carries a 64-character token).
const MAX_WRITE_BODY: usize = 16 * 1024;

type Reply = Result<HttpResponse, AdminError>;

impl Console {
    /// The console as an `actix-web` [`Scope`] at `path` (`"/admin"`), for the application
    /// to mount in its own `App` (with [`App::service`](actix_web::App::service)): every
    /// route answers JSON but the page at its root.
    ///
    /// | method and path | what |
    /// |---|---|
    /// | `GET /` | the page: every section, the dead letters with Replay and Delete buttons; refreshes itself |
    /// | `GET /overview` | what needs attention (stuck streams, stalled parts, failed or lagging projections, shards without a live lease, dead letters), and how many parts each section has |
    /// | `GET /producers`, `/consumers`, `/work-pulling`, `/projections`, `/entity-hosts`, `/coordinators`, `/shard-maps`, `/nodes`, `/carriers` | each part of the section: a JSON object with its `name` |
    /// | `GET /dead-letters?cause=&kind=&source=&since_ms=&until_ms=&after_id=&limit=` | a page of entries, oldest first, with the store's counts (`next`: the `after_id` of the next page) |
    /// | `GET /dead-letters/{id}` | one entry with its body (JSON when its codec is MessagePack, else hex) and its `confirm` tokens |
    /// | `POST /dead-letters/{id}/replay`, `/delete` | replays or deletes the entry: the body carries `{"confirm": "<token>"}` (or the form field `confirm`), the token the show endpoint gave for that action |
    ///
    /// **Confirmation tokens.** A write does something only with the token of its action on
    /// the entry as it is now: an HMAC-SHA256, under a key drawn when the console was made
    /// (or derived from the secret given to [`confirm_key`](Self::confirm_key), for replicas
    /// behind a load balancer to accept each other's tokens),
    /// of the action, the entry's id, its last time and its failed replays. A stray POST (no
    /// token, a token of another entry or action, a forged one) or one repeated after the
    /// entry changed or went (replayed, deleted, a later letter or a failed replay updated
    /// it) does nothing.
    ///
    /// **Errors** are JSON: `{"error": …, "field": … (when a field is at fault), "happened":
    /// "certainly_not" | "in_doubt" | "failed_after"}`; `400` for a malformed filter, id or
    /// body, `401` without the [bearer token](Self::require_bearer), `404` for an unknown
    /// entry, route or a console without a dead-letter store, `405` for a method a route does
    /// not take, `413` for a write's body over 16 KiB, `409` for a token that does not
    /// confirm the write, `422` for an entry that cannot be replayed (its body was not kept,
    /// no longer decodes as the type its route reads, or its source has no route), `502` when
    /// the replay's route failed (the entry is kept; `in_doubt`: the destination may have
    /// applied it, or `certainly_not` when the route said it did not), `503`/`500` when the
    /// store failed. Nothing changes on a `4xx`.
    pub fn scope(
        &self,
        path: &str,
    ) -> Scope<
        impl ServiceFactory<
                ServiceRequest,
                Config = (),
                Response = ServiceResponse<BoxBody>,
                Error = actix_web::Error,
                InitError = (),
            > + use<>,
    > {
        let console = self.clone();
        web::scope(path)
            .app_data(web::Data::new(self.clone()))
            .service(only("", "GET", web::get().to(page)))
            .service(only("/", "GET", web::get().to(page)))
            .service(only("/overview", "GET", web::get().to(overview)))
            .service(only(
                "/dead-letters",
                "GET",
                web::get().to(list_dead_letters),
            ))
            .service(only(
                "/dead-letters/{id}",
                "GET",
                web::get().to(show_dead_letter),
            ))
            .service(only(
                "/dead-letters/{id}/replay",
                "POST",
                web::post().to(replay),
            ))
            .service(only(
                "/dead-letters/{id}/delete",
                "POST",
                web::post().to(delete),
            ))
            .service(only("/{section}", "GET", web::get().to(section)))
            .default_service(web::to(not_found))
            .wrap_fn(move |request: ServiceRequest, service| {
                let refused = console
                    .bearer()
                    .and_then(|bearer| bearer.refusal(request.headers()));
                match refused {
                    Some(response) => Either::Left(ready(Ok(request.into_response(response)))),
                    None => Either::Right(service.call(request)),
                }
            })
    }
}

/// The resource at `path` with its one `route`: another method gets a JSON `405` naming
/// the `allowed` one.
fn only(path: &str, allowed: &'static str, route: Route) -> Resource {
    web::resource(path).route(route).default_service(web::to(
        move |request: HttpRequest| async move {
            let refused = AdminError::refused(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "{} is not allowed on {}: only {allowed}",
                    request.method(),
                    request.path()
                ),
            );
            let mut response = refused.error_response();
            response
                .headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static(allowed));
            response
        },
    ))
}

async fn not_found(request: HttpRequest) -> Reply {
    Err(AdminError::refused(
        StatusCode::NOT_FOUND,
        format!(
            "no route {} {} in the console",
            request.method(),
            request.path()
        ),
    ))
}

async fn section(console: web::Data<Console>, name: web::Path<String>) -> Reply {
    let Some(section) = Section::ALL
        .into_iter()
        .find(|section| section.key().replace('_', "-") == *name)
    else {
        return Err(AdminError::field(
            StatusCode::NOT_FOUND,
            "section",
            format!("no section `{name}` in the console"),
        ));
    };
    Ok(HttpResponse::Ok().json(console.collect(section).await))
}

async fn overview(console: web::Data<Console>) -> Reply {
    let sections = console.collect_all().await;
    let counts = match console.dead_letter_store() {
        Some(dead_letters) => Some(match dead_letters.counts().await {
            Ok(counts) => views::counts(&counts),
            Err(error) => json!({ "error": error.to_string() }),
        }),
        None => None,
    };
    let attention = views::attention(&sections, counts.as_ref(), console.stuck_after_ms());
    let parts: serde_json::Map<String, Value> = sections
        .iter()
        .map(|(section, views)| (section.key().to_owned(), json!(views.len())))
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "attention": attention,
        "parts": parts,
        "dead_letters": counts,
        "stuck_after_ms": console.stuck_after_ms(),
        "at_ms": now_ms(),
    })))
}

async fn page(console: web::Data<Console>, request: HttpRequest) -> HttpResponse {
    let sections = console.collect_all().await;
    let store = console.dead_letter_store();
    let mut entries = Vec::new();
    let mut dead = None;
    if let Some(dead_letters) = &store {
        // The page shows no body (each entry links to its show endpoint): none is read.
        let filter = DeadLetterFilter {
            limit: Some(PAGE_ENTRIES),
            without_bodies: true,
            ..DeadLetterFilter::default()
        };
        let (counts, page) = (dead_letters.counts().await, dead_letters.list(filter).await);
        dead = Some(match (counts, page) {
            (Ok(counts), Ok(page)) => {
                entries = page.entries;
                (views::counts(&counts), page.next.is_some(), None)
            }
            (Err(error), _) | (_, Err(error)) => (Value::Null, false, Some(error.to_string())),
        });
    }
    let counts = dead.as_ref().map(|(counts, _, _)| counts);
    let attention = views::attention(&sections, counts, console.stuck_after_ms());
    let path = request.path();
    let base = if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    };
    let key = console.key();
    let html = page::render(&PageData {
        base,
        sections: &sections,
        attention: &attention,
        dead_letters: dead.map(|(counts, more, error)| DeadLetterData {
            counts,
            entries: &entries,
            more,
            key: &key,
            error,
        }),
        now_ms: now_ms(),
    });
    HttpResponse::Ok()
        .content_type(ContentType::html())
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             connect-src 'self'; form-action 'self'; base-uri 'self'; frame-ancestors 'none'",
        ))
        // No other site may frame the page (its buttons would be clickjacked).
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .body(html)
}

async fn list_dead_letters(console: web::Data<Console>, request: HttpRequest) -> Reply {
    let dead_letters = store(&console)?;
    let pairs = web::Query::<Vec<(String, String)>>::from_query(request.query_string()).map_err(
        |error| {
            AdminError::field(
                StatusCode::BAD_REQUEST,
                "filter",
                format!("the query does not parse: {error}"),
            )
        },
    )?;
    let filter = DeadLetterFilter::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    let page = dead_letters.list(filter).await?;
    let counts = dead_letters.counts().await?;
    let entries: Vec<Value> = page
        .entries
        .iter()
        .map(views::dead_letter_summary)
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "entries": entries,
        "next": page.next,
        "counts": views::counts(&counts),
        "stats": views::handle_stats(&dead_letters.stats()),
    })))
}

async fn show_dead_letter(console: web::Data<Console>, id: web::Path<String>) -> Reply {
    let dead_letters = store(&console)?;
    let entry = dead_letters.get(entry_id(&id)?).await?;
    Ok(HttpResponse::Ok().json(views::dead_letter(&entry, &console.key())))
}

/// The body of a write: the confirmation token.
#[derive(Deserialize)]
struct Confirm {
    confirm: Option<String>,
}

async fn replay(
    console: web::Data<Console>,
    id: web::Path<String>,
    request: HttpRequest,
    payload: web::Payload,
) -> Reply {
    write(&console, &id, &request, payload, Action::Replay).await
}

async fn delete(
    console: web::Data<Console>,
    id: web::Path<String>,
    request: HttpRequest,
    payload: web::Payload,
) -> Reply {
    write(&console, &id, &request, payload, Action::Delete).await
}

/// Carries out `action` on the entry `id` once the request's token confirms it.
async fn write(
    console: &Console,
    id: &str,
    request: &HttpRequest,
    payload: web::Payload,
    action: Action,
) -> Reply {
    let body = read_body(payload).await?;
    let (dead_letters, id, form) = confirmed(console, id, request, &body, action).await?;
    let done = match action {
        Action::Replay => match dead_letters.replay(id).await? {
            Replayed::Applied => json!({ "id": id, "replayed": "applied" }),
            Replayed::AlreadyApplied => json!({ "id": id, "replayed": "already_applied" }),
        },
        Action::Delete => {
            dead_letters.delete(id).await?;
            json!({ "id": id, "deleted": true })
        }
    };
    Ok(answer(form, done))
}

/// A write's body, at most [`MAX_WRITE_BODY`] bytes: a longer one is a JSON `413`.
async fn read_body(payload: web::Payload) -> Result<web::Bytes, AdminError> {
    match payload.to_bytes_limited(MAX_WRITE_BODY).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(error)) => Err(AdminError::refused(
            StatusCode::BAD_REQUEST,
            format!("the body could not be read: {error}"),
        )),
        Err(_) => Err(AdminError::field(
            StatusCode::PAYLOAD_TOO_LARGE,
            "confirm",
            format!("the body is larger than {MAX_WRITE_BODY} bytes"),
        )),
    }
}

/// The store, the entry's id and whether the request was a form, once the request's token
/// confirms `action` on the entry as it is now.
async fn confirmed(
    console: &Console,
    id: &str,
    request: &HttpRequest,
    body: &[u8],
    action: Action,
) -> Result<(DeadLetters, u64, bool), AdminError> {
    let dead_letters = store(console)?;
    let id = entry_id(id)?;
    let form = request.content_type() == "application/x-www-form-urlencoded";
    let bad_body = |why: String| AdminError::field(StatusCode::BAD_REQUEST, "confirm", why);
    let confirm = if form {
        let text =
            std::str::from_utf8(body).map_err(|_| bad_body("the form is not UTF-8".into()))?;
        web::Query::<Confirm>::from_query(text)
            .map_err(|error| bad_body(format!("the form does not parse: {error}")))?
            .into_inner()
    } else if body.is_empty() {
        Confirm { confirm: None }
    } else {
        serde_json::from_slice::<Confirm>(body).map_err(|error| {
            bad_body(format!(
                "the body is not {{\"confirm\": \"<token>\"}}: {error}"
            ))
        })?
    };
    let Some(token) = confirm.confirm else {
        return Err(bad_body(format!(
            "a {} needs the confirmation token the entry's show endpoint gives \
             (GET dead-letters/{id}: confirm.{})",
            action.as_str(),
            action.as_str()
        )));
    };
    let entry = dead_letters.get(id).await?;
    if !console.key().verify(action, &entry, &token) {
        return Err(AdminError::field(
            StatusCode::CONFLICT,
            "confirm",
            format!(
                "the token does not confirm a {} of dead letter {id} as it is now (another \
                 entry's or action's, or the entry changed since it was shown): show it again",
                action.as_str()
            ),
        ));
    }
    Ok((dead_letters, id, form))
}

/// A write's answer: JSON, or for a form (the page without script) a redirect to the page.
fn answer(form: bool, body: Value) -> HttpResponse {
    if form {
        return HttpResponse::SeeOther()
            .insert_header((header::LOCATION, "../../"))
            .finish();
    }
    HttpResponse::Ok().json(body)
}

fn store(console: &Console) -> Result<DeadLetters, AdminError> {
    console.dead_letter_store().ok_or_else(AdminError::no_store)
}

fn entry_id(id: &str) -> Result<u64, AdminError> {
    id.parse().map_err(|_| {
        AdminError::field(
            StatusCode::BAD_REQUEST,
            "id",
            format!("`{id}` is not an entry id (a whole number)"),
        )
    })
}
