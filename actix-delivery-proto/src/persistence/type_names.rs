//! Whose data a stream holds: the type names a stream's entries and snapshots are written
//! under (in their [`Manifest`]s), and which stored names a reader takes as its own. A stream
//! whose entries name another type belongs to another application and is refused, never
//! adopted: decoding it as this reader's type could succeed (a self-describing codec reads any
//! map with the right fields) and hand another application's data to this one.

use std::sync::Arc;

use crate::codec::Manifest;
use crate::persistence::behavior::EventSourced;

/// The names a reader writes its entries and snapshots under, and the stored names it reads as
/// its own: those, the empty name (entries written before names were recorded: whose they are
/// is unknown, so they are read), and the former names it declares (its types moved or renamed).
#[derive(Clone, Debug)]
pub struct TypeNames {
    events: Arc<str>,
    state: Arc<str>,
    former: Arc<[Arc<str>]>,
}

/// A stored name that is not the reader's: the name found, and the one the reader expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignName {
    /// The name found in the journal.
    pub stored: String,
    /// The name this reader expected.
    pub expected: String,
}

impl TypeNames {
    /// Events written as `events`, snapshots as `state`, and `former` read as well.
    pub fn new(
        events: impl Into<Arc<str>>,
        state: impl Into<Arc<str>>,
        former: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            events: events.into(),
            state: state.into(),
            former: former.into_iter().map(Arc::from).collect(),
        }
    }

    /// The names of entity `E`: its event type's and its own
    /// ([`std::any::type_name`]), and its [`EventSourced::FORMER_TYPE_NAMES`].
    pub fn of<E: EventSourced>() -> Self {
        let former = E::FORMER_TYPE_NAMES.iter().map(|name| (*name).to_owned());
        Self::new(
            std::any::type_name::<E::Event>(),
            std::any::type_name::<E>(),
            former,
        )
    }

    /// The name events are written under.
    pub fn events(&self) -> &str {
        &self.events
    }

    /// The name snapshots are written under.
    pub fn state(&self) -> &str {
        &self.state
    }

    /// Whether a stored entry (`snapshot`: a snapshot) of `manifest` is this reader's.
    ///
    /// # Errors
    /// The stored and the expected name, if it is another type's.
    pub fn check(&self, manifest: &Manifest, snapshot: bool) -> Result<(), ForeignName> {
        let own = if snapshot { &self.state } else { &self.events };
        let former = self.former.iter().map(|name| &**name);
        check_name(manifest.name(), own, former)
    }
}

/// Whether a value stored under `stored` is one of `own` (or of one of its `former` names, or
/// of a name that was not recorded).
///
/// # Errors
/// The stored and the expected name, if not.
pub(crate) fn check_name<'a>(
    stored: &str,
    own: &str,
    mut former: impl Iterator<Item = &'a str>,
) -> Result<(), ForeignName> {
    if stored.is_empty() || stored == own || former.any(|name| name == stored) {
        return Ok(());
    }
    Err(ForeignName {
        stored: stored.to_owned(),
        expected: own.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;

    fn stored(name: &str) -> Manifest {
        Manifest::new(Codec::MessagePack, name, 1)
    }

    #[test]
    fn a_stored_name_is_read_if_it_is_the_readers_a_former_one_or_unrecorded() {
        let names = TypeNames::new("app::Event", "app::State", ["old::Event".to_owned()]);
        assert_eq!(names.check(&stored("app::Event"), false), Ok(()));
        assert_eq!(names.check(&stored("app::State"), true), Ok(()));
        assert_eq!(names.check(&stored("old::Event"), false), Ok(()));
        assert_eq!(names.check(&Manifest::legacy(), false), Ok(()));
        assert_eq!(
            names.check(&stored("other::Event"), false),
            Err(ForeignName {
                stored: "other::Event".into(),
                expected: "app::Event".into()
            })
        );
        assert_eq!(
            names
                .check(&stored("app::Event"), true)
                .unwrap_err()
                .expected,
            "app::State",
            "a snapshot is its state's"
        );
    }
}
