//! The application's admin console (the library's `admin::Console`, feature `admin`), reached
//! over plain HTTP with `awc`: for what needs the running application's own parts (a replay
//! needs its routes, `DeadLetters::on_replay`). Requests carry the console's bearer token
//! (`Console::require_bearer`) read from an environment variable, never from the command
//! line; answers are the console's JSON, its errors `{"error", "field"?, "happened"}`.
//!
//! `awc` runs on an actix System (`main` starts one for these commands).

use std::time::Duration;

use awc::http::header::{self, HeaderValue};
use awc::http::StatusCode;
use serde_json::Value;

use crate::failure::{chain, Failure};

/// The environment variable the bearer token is read from when `--token-env` is not given.
const DEFAULT_TOKEN_ENV: &str = "ACTIX_DELIVERY_ADMIN_TOKEN";

/// How long a request may wait for its answer (a replay waits for the destination to apply
/// it).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer read.
const ANSWER_LIMIT: usize = 16 << 20;

/// Where the bearer token comes from, and whether it was there.
struct Token {
    /// The variable's name.
    var: String,
    /// The `Authorization` header it makes, when the variable is set.
    header: Option<HeaderValue>,
}

/// The console at a URL, and how to reach it.
pub struct Console {
    client: awc::Client,
    /// The scope's URL, without a trailing `/` (`http://127.0.0.1:8080/admin`).
    base: String,
    token: Token,
}

/// What the console answered: its status, and its body as JSON (`None`: not JSON).
pub struct Answer {
    pub status: StatusCode,
    pub json: Option<Value>,
}

impl Answer {
    /// The console's error text (its JSON `error`), or the status with a word on what
    /// answered when the body is not the console's JSON.
    pub fn error(&self) -> String {
        match self
            .json
            .as_ref()
            .and_then(|body| body.get("error"))
            .and_then(Value::as_str)
        {
            // Peer-controlled text (a route's error): control characters escaped.
            Some(error) => crate::output::printable(error),
            None => format!(
                "{} (an answer without the console's JSON error: is --console the URL of the \
                 console's scope?)",
                self.status
            ),
        }
    }

    /// The field the console says is at fault, if it named one.
    pub fn field(&self) -> Option<&str> {
        self.json.as_ref()?.get("field")?.as_str()
    }

    /// The console's `happened` (`certainly_not`, `in_doubt`, `failed_after`), if it gave one.
    pub fn happened(&self) -> Option<&str> {
        self.json.as_ref()?.get("happened")?.as_str()
    }
}

impl Console {
    /// The console at `url` (`--console`), its bearer token read from the environment variable
    /// `token_env` (`--token-env`; [`DEFAULT_TOKEN_ENV`] when not given, and then optional).
    pub fn new(url: &str, token_env: Option<&str>) -> Result<Self, Failure> {
        let base = base_url(url)?;
        let token = token(token_env)?;
        let client = awc::Client::builder()
            // A redirect would carry the token elsewhere, and a POST would not follow it.
            .disable_redirects()
            .timeout(ANSWER_TIMEOUT)
            .finish();
        Ok(Self {
            client,
            base,
            token,
        })
    }

    /// The URL of `path` in the console (`dead-letters/7`).
    pub fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    /// `GET {console}/{path}`.
    pub async fn get(&self, path: &str) -> Result<Answer, Failure> {
        let url = self.url(path);
        let request = self.authorized(self.client.get(&url));
        let response = request
            .send()
            .await
            .map_err(|err| no_answer(&format!("GET {url}"), &err, false))?;
        self.answer(&format!("GET {url}"), response).await
    }

    /// `POST {console}/{path}` with the JSON `body`. A failure once the request may have
    /// reached the console says that what it asked may have happened.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Answer, Failure> {
        let url = self.url(path);
        let request = self.authorized(self.client.post(&url));
        let response = request
            .send_json(body)
            .await
            .map_err(|err| no_answer(&format!("POST {url}"), &err, true))?;
        self.answer(&format!("POST {url}"), response).await
    }

    fn authorized(&self, request: awc::ClientRequest) -> awc::ClientRequest {
        match &self.token.header {
            Some(value) => request.insert_header((header::AUTHORIZATION, value.clone())),
            None => request,
        }
    }

    async fn answer(
        &self,
        what: &str,
        mut response: awc::ClientResponse,
    ) -> Result<Answer, Failure> {
        let status = response.status();
        let body =
            response.body().limit(ANSWER_LIMIT).await.map_err(|err| {
                Failure::storage(format!("{what}: cannot read the answer: {err}"))
            })?;
        let answer = Answer {
            status,
            json: serde_json::from_slice(&body).ok(),
        };
        if status == StatusCode::UNAUTHORIZED {
            return Err(self.unauthorized(&answer));
        }
        Ok(answer)
    }

    /// The `401` of a request: a usage error naming the token's variable.
    fn unauthorized(&self, answer: &Answer) -> Failure {
        let var = &self.token.var;
        let why = if self.token.header.is_some() {
            format!("the environment variable {var} holds a token the console does not accept")
        } else {
            format!(
                "the console needs a bearer token, read from the environment variable {var} \
                 (--token-env), which is not set"
            )
        };
        Failure::usage(format!(
            "--token-env: {}: {why} (401: {}); nothing changed",
            self.base,
            answer.error()
        ))
    }

    /// A failure for an answer the command does not expect: the console's error, with what it
    /// says happened (a `400` is bad input, 2; anything else a storage or connection error, 3).
    pub fn unexpected(&self, what: &str, answer: &Answer) -> Failure {
        let happened = match answer.happened() {
            Some("certainly_not") | None => "nothing changed".to_owned(),
            Some("in_doubt") => "it may or may not have happened (in doubt)".to_owned(),
            Some("failed_after") => "it happened, and failed after".to_owned(),
            Some(other) => format!("happened: {other}"),
        };
        let message = format!(
            "{what}: the console answered {}: {}; {happened}",
            answer.status,
            answer.error()
        );
        if answer.status == StatusCode::BAD_REQUEST {
            Failure::usage(message)
        } else {
            Failure::storage(message)
        }
    }
}

/// The console's URL without its trailing `/`: `http://` only, with a host, and no user,
/// password, query or fragment.
fn base_url(url: &str) -> Result<String, Failure> {
    let bad = |why: &str| Failure::usage(format!("--console: {why}"));
    let scheme_end = url.find("://").unwrap_or(0);
    let scheme = url[..scheme_end].to_ascii_lowercase();
    if scheme == "https" {
        return Err(bad(
            "only http:// is supported: give the plain-HTTP address of the application's server \
             (TLS in front of it is the operator's proxy; reach the server behind it)",
        ));
    }
    if scheme != "http" {
        return Err(bad(&format!(
            "`{url}` is not an http:// URL (the console's scope, e.g. \
             http://127.0.0.1:8080/admin)"
        )));
    }
    let rest = &url[scheme_end + 3..];
    let authority = rest.split('/').next().unwrap_or("");
    if authority.contains('@') {
        // Not echoed: it may hold a password.
        return Err(bad(
            "no user or password in the URL (it would show in the process list): the \
             console's bearer token is read from the environment variable --token-env names",
        ));
    }
    if url.contains(['?', '#']) {
        return Err(bad(&format!(
            "`{url}`: no query or fragment: the URL of the console's scope (e.g. \
             http://127.0.0.1:8080/admin)"
        )));
    }
    let base = url.trim_end_matches('/');
    match awc::http::Uri::try_from(base) {
        Ok(uri) if uri.host().is_some_and(|host| !host.is_empty()) => Ok(base.to_owned()),
        Ok(_) => Err(bad(&format!("`{url}` names no host"))),
        Err(err) => Err(bad(&format!("`{url}` is not a URL: {err}"))),
    }
}

/// The bearer token from the environment variable `token_env` (or the default one, which may
/// be unset). Never echoed.
fn token(token_env: Option<&str>) -> Result<Token, Failure> {
    let var = token_env.unwrap_or(DEFAULT_TOKEN_ENV);
    let bad = |why: String| Failure::usage(format!("--token-env {var}: {why}"));
    if var.is_empty() || var.contains(['=', '\0']) {
        return Err(Failure::usage(format!(
            "--token-env: `{var}` is not the name of an environment variable"
        )));
    }
    let value = match std::env::var(var) {
        Ok(value) if !value.is_empty() => value,
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            if token_env.is_some() {
                return Err(bad(format!(
                    "the environment variable {var} is not set (or empty): it holds the \
                     console's bearer token"
                )));
            }
            return Ok(Token {
                var: var.to_owned(),
                header: None,
            });
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(bad(format!("the environment variable {var} is not UTF-8")));
        }
    };
    let mut header = HeaderValue::from_str(&format!("Bearer {value}")).map_err(|_| {
        bad(format!(
            "the token in the environment variable {var} holds characters a header cannot carry"
        ))
    })?;
    header.set_sensitive(true);
    Ok(Token {
        var: var.to_owned(),
        header: Some(header),
    })
}

/// A request that got no answer: a connection error (3). `sent`: the request may have
/// reached the console before the failure (a POST), so what it asked may have happened.
fn no_answer(what: &str, error: &awc::error::SendRequestError, sent: bool) -> Failure {
    use awc::error::SendRequestError;
    let connect = matches!(
        error,
        SendRequestError::Connect(_) | SendRequestError::Url(_)
    );
    let doubt = if sent && !connect {
        "; it may or may not have happened: show the entry again to see"
    } else {
        "; nothing changed"
    };
    Failure::storage(format!(
        "{what}: cannot reach the console: {}{doubt}",
        chain(error)
    ))
}
