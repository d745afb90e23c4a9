//! Room per entity in a sharded producer: at most `max_pending_per_entity` unconfirmed
//! messages for one entity, so that an entity without demand holds only its share of the
//! producer's window. The handle reserves room when a message is handed over; the router gives
//! it back when the entity confirmed the message (the handle, when the message was refused or
//! failed).

use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashMap;
use tokio::sync::Notify;

use crate::sharding::entity_id::EntityId;

/// Unconfirmed messages per entity, bounded.
#[derive(Debug)]
pub(crate) struct Rooms {
    per_entity: usize,
    used: Mutex<HashMap<EntityId, usize>>,
    freed: Notify,
}

impl Rooms {
    pub(crate) fn new(per_entity: usize) -> Self {
        Self {
            per_entity,
            used: Mutex::new(HashMap::new()),
            freed: Notify::new(),
        }
    }

    fn used(&self) -> MutexGuard<'_, HashMap<EntityId, usize>> {
        self.used.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one message's room for `entity`, if it has any left.
    pub(crate) fn try_reserve(&self, entity: &EntityId) -> bool {
        let mut used = self.used();
        match used.get_mut(entity) {
            Some(count) if *count >= self.per_entity => false,
            Some(count) => {
                *count += 1;
                true
            }
            None => {
                used.insert(entity.clone(), 1);
                true
            }
        }
    }

    /// Takes one message's room for `entity`, waiting until it has some.
    pub(crate) async fn reserve(&self, entity: &EntityId) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable(); // from now on, a release wakes it
            if self.try_reserve(entity) {
                return;
            }
            freed.await;
        }
    }

    /// Gives one message's room for `entity` back (nothing if it holds none: a message a
    /// durable producer recovered took no room in this life).
    pub(crate) fn release(&self, entity: &EntityId) {
        let mut used = self.used();
        let Some(count) = used.get_mut(entity) else {
            return;
        };
        // Only an entity that was full can have waiters.
        let was_full = *count >= self.per_entity;
        *count -= 1;
        if *count == 0 {
            used.remove(entity);
        }
        drop(used);
        if was_full {
            self.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entity_has_its_own_room_and_a_release_of_nothing_is_ignored() {
        let rooms = Rooms::new(2);
        let (a, b) = (EntityId::new("a").unwrap(), EntityId::new("b").unwrap());
        assert!(rooms.try_reserve(&a) && rooms.try_reserve(&a));
        assert!(!rooms.try_reserve(&a), "a is full");
        assert!(rooms.try_reserve(&b), "b is not");
        rooms.release(&a);
        assert!(rooms.try_reserve(&a));
        rooms.release(&b);
        rooms.release(&b);
        assert!(rooms.try_reserve(&b) && rooms.try_reserve(&b) && !rooms.try_reserve(&b));
    }
}
