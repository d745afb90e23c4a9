//! An error with its whole cause chain, on one line: how the crate writes every error it logs,
//! and every error of another library (or of an application's handler) it wraps into its own.
//!
//! The `Display` of most errors says only what failed at their own level ("db error",
//! "error connecting to server", a SQLite message without its extended result code) and
//! leaves the why to [`Error::source`]. `PlainChain` writes the error and each of its
//! sources, joined by `: ` (a source whose text the one before already holds is not
//! repeated, so an error whose `Display` includes its source is written once). The shells'
//! chain (`runtime::error_chain`) also writes a PostgreSQL server error in full; this core
//! file names no database crate.
//!
//! The crate's own errors keep what they wrap written this way, so their `Display` carries
//! the whole chain too: what an application prints of them, or the crate logs, is complete.

use std::error::Error;
use std::fmt;

/// An error and its sources, on one line (see the module docs), each link as its `Display`
/// says it: what the core writes (its errors are the codecs'). The shells write theirs with
/// `runtime::error_chain::ErrorChain`, which also spells out a PostgreSQL server's error.
pub(crate) struct PlainChain<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for PlainChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_chain(f, self.0, plain_text)
    }
}

/// Writes `error` and its sources joined by `: `, each link as `own_text` says it (`None`: a
/// link that says nothing its source does not), a link whose text the one before already
/// holds not repeated.
pub fn write_chain(
    f: &mut fmt::Formatter<'_>,
    error: &(dyn Error + 'static),
    own_text: fn(&(dyn Error + 'static)) -> Option<String>,
) -> fmt::Result {
    let mut written = String::new();
    let mut link = Some(error);
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

/// What one link of a chain says, plainly: its `Display`.
fn plain_text(error: &(dyn Error + 'static)) -> Option<String> {
    Some(error.to_string())
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
            PlainChain(&error).to_string(),
            "cannot connect: error connecting to server: refused"
        );
        let repeated = chain(&["a failed: refused", "refused"]);
        assert_eq!(PlainChain(&repeated).to_string(), "a failed: refused");
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(PlainChain(&io).to_string(), "connection refused");
    }
}
