//! An error with its whole cause chain, on one line: how the crate writes every error it logs,
//! and every error of another library (or of an application's handler) it wraps into its own.
//!
//! The `Display` of most errors says only what failed at their own level ("db error",
//! "error connecting to server", a SQLite message without its extended result code) and
//! leaves the why to [`Error::source`]. [`ErrorChain`] writes the error and each of its
//! sources, joined by `: ` (a source whose text the one before already holds is not
//! repeated, so an error whose `Display` includes its source is written once). A PostgreSQL
//! server error (feature `postgres`) is written with its whole meaning, `ERROR: <message>
//! (SQLSTATE <code>); DETAIL: …; HINT: …`, in place of tokio-postgres's bare "db error"; any
//! other error of tokio-postgres through its sources, e.g. `error connecting to server:
//! Connection refused (os error 111)`. Neither tokio-postgres's errors of a connection or a
//! statement nor the server's messages hold the connection's password, so none is written.
//!
//! The crate's own errors keep what they wrap written this way, so their `Display` carries
//! the whole chain too: what an application prints of them, or the crate logs, is complete.

use std::error::Error;
use std::fmt;

/// An error and its sources, on one line (see the module docs).
pub(crate) struct ErrorChain<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut written = String::new();
        let mut link = Some(self.0);
        while let Some(error) = link {
            link = error.source();
            let Some(text) = own_text(error) else {
                continue;
            };
            if written.contains(&text) {
                continue;
            }
            if !written.is_empty() {
                f.write_str(": ")?;
            }
            f.write_str(&text)?;
            written = text;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Link(&'static str, Option<Box<Link>>);

    impl fmt::Display for Link {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Link {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|link| link as _)
        }
    }

    fn chain(texts: &[&'static str]) -> Link {
        let mut links = texts.iter().rev();
        let last = Link(links.next().expect("one link at least"), None);
        links.fold(last, |source, text| Link(text, Some(Box::new(source))))
    }

    #[test]
    fn each_source_follows_its_error_and_one_it_already_says_is_not_repeated() {
        let error = chain(&["cannot connect", "error connecting to server", "refused"]);
        assert_eq!(
            ErrorChain(&error).to_string(),
            "cannot connect: error connecting to server: refused"
        );
        let repeated = chain(&["a failed: refused", "refused"]);
        assert_eq!(ErrorChain(&repeated).to_string(), "a failed: refused");
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(ErrorChain(&io).to_string(), "connection refused");
    }
}
