//! The error chain the shells write (see `error::chain`), which also gives a PostgreSQL
//! server's error its whole meaning: a PostgreSQL server error (feature `postgres`) is written
//! `ERROR: <message> (SQLSTATE <code>); DETAIL: …; HINT: …`, in place of tokio-postgres's bare
//! "db error"; any other error of tokio-postgres through its sources, e.g. `error connecting
//! to server: Connection refused (os error 111)`. Neither tokio-postgres's errors of a
//! connection or a statement nor the server's messages hold the connection's password, so
//! none is written. Apart from the core's chain, which names no database crate.

use std::error::Error;
use std::fmt;

use crate::error::chain::write_chain;

/// An error and its sources, on one line (see the module docs).
pub(crate) struct ErrorChain<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_chain(f, self.0, own_text)
    }
}

/// What one link of a chain says; `None` for one that says nothing its source does not.
fn own_text(error: &(dyn Error + 'static)) -> Option<String> {
    #[cfg(feature = "postgres")]
    {
        if let Some(server) = error.downcast_ref::<tokio_postgres::error::DbError>() {
            return Some(server_error(server));
        }
        let client = error.downcast_ref::<tokio_postgres::Error>();
        if client.is_some_and(|client| client.as_db_error().is_some()) {
            return None; // "db error": its source is the server's error
        }
    }
    Some(error.to_string())
}

/// A PostgreSQL server error: severity, message, SQLSTATE, then its detail and hint if any.
#[cfg(feature = "postgres")]
fn server_error(error: &tokio_postgres::error::DbError) -> String {
    let mut text = format!(
        "{}: {} (SQLSTATE {})",
        error.severity(),
        error.message(),
        error.code().code()
    );
    if let Some(detail) = error.detail() {
        text.push_str("; DETAIL: ");
        text.push_str(detail);
    }
    if let Some(hint) = error.hint() {
        text.push_str("; HINT: ");
        text.push_str(hint);
    }
    text
}
