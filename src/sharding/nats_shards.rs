//! Shards over NATS (feature `nats`): a subject per shard, `<prefix>.<shard>`, subscribed by
//! the shard's owner only, so every delivery reaches the one node that owns its entity.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::delivery::consumer::ConsumerHandle;
use crate::delivery::message::ConsumerRef;
use crate::nats::{NatsCarrierHandle, NatsError};
use crate::sharding::entity_id::ShardId;
use crate::sharding::envelope::EntityEnvelope;
use crate::sharding::transport::{LocalFuture, ShardTransport};

/// The [`ShardTransport`] over NATS: the owner of shard `s` exposes its host's consumer on
/// the subject `<prefix>.<s>` (and unsubscribes when it gives the shard up); senders publish
/// each entity's stream to its shard's subject ([`destination`](Self::destination)). While a
/// shard moves, nobody subscribes: deliveries are lost there and retransmitted, and reach the
/// new owner once it has the subject.
pub struct NatsShards<M: Send + 'static> {
    carrier: NatsCarrierHandle,
    prefix: String,
    consumer: ConsumerHandle<EntityEnvelope<M>>,
}

impl<M: DeserializeOwned + Send + 'static> NatsShards<M> {
    /// Exposes `consumer` (an [`EntityHostHandle`](crate::sharding::EntityHostHandle)'s) on
    /// `carrier`, on the subjects `<prefix>.<shard>` of the shards its node owns.
    ///
    /// # Errors
    /// [`NatsError::InvalidSubject`] if `<prefix>.0` is no valid subject.
    pub fn new(
        carrier: &NatsCarrierHandle,
        prefix: &str,
        consumer: ConsumerHandle<EntityEnvelope<M>>,
    ) -> Result<Self, NatsError> {
        check_prefix(prefix)?;
        Ok(Self {
            carrier: carrier.clone(),
            prefix: prefix.to_owned(),
            consumer,
        })
    }
}

impl<M: Serialize + Send + 'static> NatsShards<M> {
    /// Where a sharded producer reaches shard `s`'s entities: the subject `<prefix>.<s>` on
    /// `carrier` (for
    /// [`ShardedProducerOptions::per_shard`](crate::sharding::ShardedProducerOptions::per_shard)).
    ///
    /// # Errors
    /// [`NatsError::InvalidSubject`] if `<prefix>.0` is no valid subject.
    pub fn destination(
        carrier: &NatsCarrierHandle,
        prefix: &str,
    ) -> Result<
        impl Fn(ShardId) -> ConsumerRef<EntityEnvelope<M>> + Send + Sync + 'static + use<M>,
        NatsError,
    > {
        check_prefix(prefix)?;
        let (carrier, prefix) = (carrier.clone(), prefix.to_owned());
        Ok(move |shard| {
            carrier
                .consumer_ref(&subject(&prefix, shard))
                .expect("the prefix was checked")
        })
    }
}

/// Subjects `<prefix>.<shard>` are valid.
fn check_prefix(prefix: &str) -> Result<(), NatsError> {
    let example = subject(prefix, ShardId(0));
    crate::nats::check_subject(&example).map_err(|why| NatsError::InvalidSubject {
        subject: example,
        why,
    })
}

/// The subject of `shard`.
fn subject(prefix: &str, shard: ShardId) -> String {
    format!("{prefix}.{shard}")
}

impl<M: DeserializeOwned + Send + 'static> ShardTransport for NatsShards<M> {
    fn expose(&self, shard: ShardId) -> LocalFuture<Result<(), String>> {
        let (carrier, consumer) = (self.carrier.clone(), self.consumer.clone());
        let subject = subject(&self.prefix, shard);
        Box::pin(async move {
            carrier
                .expose(&subject, &consumer)
                .await
                .map_err(|error| error.to_string())
        })
    }

    fn unexpose(&self, shard: ShardId) {
        self.carrier.unexpose(&subject(&self.prefix, shard));
    }
}
