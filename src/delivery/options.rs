//! Validated options for both controllers, as builders or from plain config structs.
//!
//! Precedence: a value set on the builder wins over one loaded with `.config(…)`, which wins
//! over the default, whatever order the calls come in.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use actix::{ArbiterHandle, Recipient};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::schema::BodySchema;
use crate::codec::{Codec, MAX_ENCODED_BYTES};
use crate::config::{Backoff, ConsumerConfig, Limit, Overrides, ProducerConfig};
use crate::delivery::dead_letter::DeadLetter;
use crate::delivery::dead_letter_handle::{DeadLetters, GiveUpKeeper};
use crate::delivery::dead_letters::SourceKind;
use crate::delivery::handler::DeliveryHandler;
use crate::delivery::message::ConsumerRef;
use crate::delivery::producer_core::Chunking;
use crate::error::OptionsError;
use crate::protocol::trace_context::TraceContext;
use crate::runtime::placement::Placement;

/// The smallest `chunk_size`: below, a chunk's bookkeeping would cost more than its bytes.
pub const MIN_CHUNK_SIZE: usize = 1024;

/// The largest `chunk_size`: the most the crate carries in one piece (a frame's
/// `max_frame_length`, NATS's `max_payload`, a journal entry), 16 MiB.
pub const MAX_CHUNK_SIZE: usize = MAX_ENCODED_BYTES as usize;

/// A producer's [`trace_context`](ProducerOptionsBuilder::trace_context) hook.
#[derive(Clone)]
pub(crate) struct TraceHook(Arc<dyn Fn() -> Option<TraceContext> + Send + Sync>);

impl TraceHook {
    /// The context of a message sent now.
    pub(crate) fn current(&self) -> Option<TraceContext> {
        (self.0)()
    }
}

impl fmt::Debug for TraceHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TraceHook")
    }
}

/// Everything a [`ProducerController`](crate::ProducerController) needs, validated.
#[derive(Debug)]
pub struct ProducerOptions<T: Send + 'static> {
    consumer: ConsumerRef<T>,
    config: ProducerConfig,
    #[cfg(feature = "metrics")]
    metrics_label: Option<String>,
    trace_context: Option<TraceHook>,
    chunking: Option<Chunking<T>>,
    placement: Placement,
    kept: Option<GiveUpKeeper<T>>,
}

impl<T: Send + 'static> ProducerOptions<T> {
    /// Starts a builder; `consumer` is where deliveries go: `&ConsumerHandle` (batches
    /// deliveries), a `ConsumerController`'s `Addr`, or any `Recipient<Delivery<T>>`.
    pub fn builder(consumer: impl Into<ConsumerRef<T>>) -> ProducerOptionsBuilder<T> {
        ProducerOptionsBuilder {
            consumer: consumer.into(),
            loaded: ProducerConfig::default(),
            explicit: Overrides::default(),
            #[cfg(feature = "metrics")]
            metrics_label: None,
            trace_context: None,
            chunking: None,
            placement: Placement::default(),
            kept: None,
        }
    }

    /// Options from a config alone, validated: how the parts built on producers (work
    /// pulling, sharding) make their streams' options.
    pub(crate) fn from_config(
        consumer: impl Into<ConsumerRef<T>>,
        config: ProducerConfig,
    ) -> Result<Self, OptionsError> {
        config.validate()?;
        Ok(Self {
            consumer: consumer.into(),
            config,
            #[cfg(feature = "metrics")]
            metrics_label: None,
            trace_context: None,
            chunking: None,
            placement: Placement::default(),
            kept: None,
        })
    }

    /// Where the producer runs.
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The same options, writing chunks in process as `schema` says (see
    /// [`Chunking::stored_as`]).
    pub(crate) fn with_chunks_stored_as(mut self, schema: BodySchema<T>) -> Self {
        self.chunking = self.chunking.map(|chunking| chunking.stored_as(schema));
        self
    }

    /// The same options with the producer id fixed to `id` (a durable producer's is its
    /// stream's), validated again.
    pub(crate) fn with_producer_id(mut self, id: &str) -> Result<Self, OptionsError> {
        self.config.producer_id = Some(id.to_owned());
        self.config.validate()?;
        Ok(self)
    }

    /// The validated settings.
    pub fn config(&self) -> &ProducerConfig {
        &self.config
    }

    /// The label of this producer's metrics, if the application chose one.
    #[cfg(feature = "metrics")]
    pub(crate) fn metrics_label(&self) -> Option<&str> {
        self.metrics_label.as_deref()
    }

    /// The size of the chunks messages are sent in, if they are.
    pub fn chunk_size(&self) -> Option<usize> {
        self.chunking.as_ref().map(|chunking| chunking.chunk_size)
    }

    pub(crate) fn into_parts(self) -> ProducerParts<T> {
        ProducerParts {
            consumer: self.consumer,
            config: self.config,
            trace_context: self.trace_context,
            chunking: self.chunking,
            kept: self.kept,
        }
    }
}

/// What a producer is made of, taken out of its options.
pub(crate) struct ProducerParts<T: Send + 'static> {
    pub(crate) consumer: ConsumerRef<T>,
    pub(crate) config: ProducerConfig,
    pub(crate) trace_context: Option<TraceHook>,
    pub(crate) chunking: Option<Chunking<T>>,
    pub(crate) kept: Option<GiveUpKeeper<T>>,
}

/// Builds [`ProducerOptions`]; see [`ProducerConfig`] for each setting's default and rule.
pub struct ProducerOptionsBuilder<T: Send + 'static> {
    consumer: ConsumerRef<T>,
    loaded: ProducerConfig,
    explicit: Overrides<ProducerConfig>,
    #[cfg(feature = "metrics")]
    metrics_label: Option<String>,
    trace_context: Option<TraceHook>,
    chunking: Option<Chunking<T>>,
    placement: Placement,
    kept: Option<GiveUpKeeper<T>>,
}

impl<T: Send + 'static> ProducerOptionsBuilder<T> {
    /// Keeps the messages it gives up after `max_attempts` in `dead_letters`, under the name
    /// `source` (kind [`Producer`](crate::dead_letters::SourceKind::Producer)): each body in
    /// MessagePack, its delivery id (`producer/incarnation/seq`) as key and origin, its
    /// transmissions. The sender still gets [`DeliveryError::GaveUp`](crate::DeliveryError).
    /// Not with [`chunk_size`](Self::chunk_size) (its chunks are given up, not messages):
    /// `build` refuses the two together.
    pub fn keep_dead_letters(mut self, dead_letters: DeadLetters, source: impl Into<String>) -> Self
    where
        T: Serialize,
    {
        self.kept = Some(GiveUpKeeper::new(
            dead_letters,
            SourceKind::Producer,
            source.into(),
        ));
        self
    }

    /// Loaded settings (e.g. from the application's config file); values set on the builder
    /// still win.
    pub fn config(mut self, config: ProducerConfig) -> Self {
        self.loaded = config;
        self
    }

    /// Runs the producer on `arbiter` (another thread) instead of the arbiter that starts it;
    /// its handle works from anywhere.
    pub fn arbiter(mut self, arbiter: &ArbiterHandle) -> Self {
        self.placement.arbiter = Some(arbiter.clone());
        self
    }

    /// At most this many un-ACKed messages in flight (default 16).
    pub fn window_size(self, window_size: usize) -> Self {
        self.set(move |c| c.window_size = window_size)
    }

    /// Retransmit an un-ACKed message after this long (default 500 ms).
    pub fn resend_timeout(self, resend_timeout: Duration) -> Self {
        self.set(move |c| c.resend_timeout = resend_timeout)
    }

    /// The producer's id (default `producer-` + 16 random hex digits).
    pub fn producer_id(self, producer_id: impl Into<String>) -> Self {
        let producer_id = producer_id.into();
        self.set(move |c| c.producer_id = Some(producer_id))
    }

    /// At most this many messages wait for the window (default 100 000).
    pub fn max_pending(self, max_pending: usize) -> Self {
        self.set(move |c| c.max_pending = max_pending)
    }

    /// Give a message up after this many transmissions (default unbounded).
    pub fn max_attempts(self, max_attempts: impl Into<Limit<u32>>) -> Self {
        let max_attempts = max_attempts.into();
        self.set(move |c| c.max_attempts = max_attempts)
    }

    /// How the wait between retransmissions grows (default fixed).
    pub fn backoff(self, backoff: Backoff) -> Self {
        self.set(move |c| c.backoff = backoff)
    }

    /// Carries a trace context with each message (default: none): `hook` is called when a
    /// [`ProducerHandle`](crate::ProducerHandle)'s `tell`, `send` or `store` is called, in the
    /// caller's context (where an application reads its tracing system's current span, e.g.
    /// OpenTelemetry's), and what it returns travels with the message, in process, over TCP
    /// and over NATS, to [`DeliveryInfo::trace_context`](crate::DeliveryInfo) at the handler.
    /// Not stored: a message a durable producer resends after a restart has no context. Keep
    /// it cheap; it runs on the sending path.
    pub fn trace_context(
        mut self,
        hook: impl Fn() -> Option<TraceContext> + Send + Sync + 'static,
    ) -> Self {
        self.trace_context = Some(TraceHook(Arc::new(hook)));
        self
    }

    /// Sends each message in chunks of `chunk_size` bytes (default: whole): large messages, beyond
    /// what a transport's frame (`max_frame_length`, NATS's `max_payload`) or a journal entry
    /// holds, with bounded memory at the consumer. The message is encoded once (serde, in bincode
    /// in process, or as its [`DurableOptions`](crate::durable::DurableOptions) say for a durable
    /// producer; across processes in the transport's [`BodySchema`](crate::tcp::BodySchema) for
    /// `T`), which is what `T` needs `Serialize + DeserializeOwned` for; the consumer decodes it
    /// once whole. Each chunk is a delivery of its own: a seq, a window slot, retransmission; the
    /// last chunk's ACK, sent after the handler ran on the whole message, confirms it. Every
    /// message is then sent as chunks (a small one as one chunk), so `tell` and `send` encode each.
    /// See [`protocol::chunk`](crate::protocol::chunk) for the rules, and
    /// [Large messages](crate::guide::large_messages) for what it needs and costs.
    ///
    /// # Errors
    /// [`build`](Self::build) refuses a `chunk_size` below [`MIN_CHUNK_SIZE`] or above
    /// [`MAX_CHUNK_SIZE`], one beyond what the consumer reference's transport carries in a
    /// frame, and a consumer reference that takes no chunks (a plain
    /// `Recipient<Delivery<T>>`, a [`ConsumerRef::from_fn`] without
    /// [`ConsumerRef::with_chunks`]).
    pub fn chunk_size(mut self, chunk_size: usize) -> Self
    where
        T: Serialize + DeserializeOwned,
    {
        let in_process = BodySchema::<T>::new().codec(Codec::Bincode);
        self.chunking = Some(Chunking::new(chunk_size, in_process));
        self
    }

    /// Validates and returns the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid field.
    pub fn build(self) -> Result<ProducerOptions<T>, OptionsError> {
        let chunking = checked_chunking(self.chunking, &self.consumer)?;
        if chunking.is_some() && self.kept.is_some() {
            return Err(OptionsError::new(
                "keep_dead_letters",
                "a producer with chunk_size gives up chunks, not messages: none can be kept",
            ));
        }
        let mut options =
            ProducerOptions::from_config(self.consumer, self.explicit.apply(self.loaded))?;
        options.chunking = chunking;
        options.placement = self.placement;
        options.kept = self.kept;
        #[cfg(feature = "metrics")]
        {
            if let Some(label) = &self.metrics_label {
                crate::config::check_label(label)?;
            }
            options.metrics_label = self.metrics_label;
        }
        options.trace_context = self.trace_context;
        Ok(options)
    }

    /// The value of the `producer` label on this producer's metrics (feature `metrics`;
    /// default: its fixed `producer_id`, else `"default"`). Producers sharing a label add up.
    ///
    /// # Errors
    /// [`build`](Self::build) refuses an empty label.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_label(mut self, label: impl Into<String>) -> Self {
        self.metrics_label = Some(label.into());
        self
    }

    fn set(mut self, setter: impl FnOnce(&mut ProducerConfig) + Send + 'static) -> Self {
        self.explicit.set(setter);
        self
    }
}

/// The chunking of a producer whose options are being built, checked against its consumer
/// reference (and taking its transport's encoding).
fn checked_chunking<T: Send + 'static>(
    chunking: Option<Chunking<T>>,
    consumer: &ConsumerRef<T>,
) -> Result<Option<Chunking<T>>, OptionsError> {
    let Some(mut chunking) = chunking else {
        return Ok(None);
    };
    let size = chunking.chunk_size;
    if size < MIN_CHUNK_SIZE {
        return Err(OptionsError::new(
            "chunk_size",
            format!("must be at least {MIN_CHUNK_SIZE} bytes (got {size})"),
        ));
    }
    if size > MAX_CHUNK_SIZE {
        return Err(OptionsError::new(
            "chunk_size",
            format!("must be at most {MAX_CHUNK_SIZE} bytes (got {size})"),
        ));
    }
    if !consumer.takes_chunks() {
        return Err(OptionsError::new(
            "chunk_size",
            "the consumer reference takes no chunks: use a ConsumerHandle, a \
             ConsumerController's Addr, NodeHandle::consumer_ref, NatsCarrierHandle::consumer_ref, or \
             ConsumerRef::with_chunks",
        ));
    }
    if let Some((max, schema)) = consumer.transport() {
        if size > *max {
            return Err(OptionsError::new(
                "chunk_size",
                format!(
                    "{size} bytes do not fit the transport's frames: at most {max} bytes per \
                     chunk (its max_frame_length, or the NATS server's max_payload, less the \
                     frame's headers)"
                ),
            ));
        }
        chunking = chunking.carried_in(schema.clone());
    }
    Ok(Some(chunking))
}

/// Everything a [`ConsumerController`](crate::ConsumerController) needs, validated.
#[derive(Debug)]
pub struct ConsumerOptions<T> {
    handler: DeliveryHandler<T>,
    config: ConsumerConfig,
    dead_letters: Option<Recipient<DeadLetter>>,
    kept: Option<(DeadLetters, SourceKind, String)>,
    name: Option<String>,
}

impl<T: 'static> ConsumerOptions<T> {
    /// Starts a builder around the handler that processes each new message.
    pub fn builder(handler: DeliveryHandler<T>) -> ConsumerOptionsBuilder<T> {
        ConsumerOptionsBuilder {
            handler,
            loaded: ConsumerConfig::default(),
            explicit: Overrides::default(),
            dead_letters: None,
            kept: None,
            name: None,
        }
    }

    /// Options from a config alone, validated: how the parts built on consumers (sharding)
    /// make their consumers' options.
    pub(crate) fn from_config(
        handler: DeliveryHandler<T>,
        config: ConsumerConfig,
    ) -> Result<Self, OptionsError> {
        config.validate()?;
        Ok(Self {
            handler,
            config,
            dead_letters: None,
            kept: None,
            name: None,
        })
    }

    /// Keeps its refusals in `dead_letters` as those of the part `kind` named `source` (an
    /// entity host's consumer).
    pub(crate) fn keep_dead_letters_as(
        &mut self,
        dead_letters: DeadLetters,
        kind: SourceKind,
        source: String,
    ) {
        self.kept = Some((dead_letters, kind, source));
    }

    /// The validated settings.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// The consumer's name, if the application chose one.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    pub(crate) fn into_parts(self) -> ConsumerParts<T> {
        ConsumerParts {
            handler: self.handler,
            config: self.config,
            dead_letters: self.dead_letters,
            kept: self.kept,
        }
    }
}

/// What a consumer is made of: its handler, settings, and where its dead letters go.
pub(crate) struct ConsumerParts<T> {
    pub(crate) handler: DeliveryHandler<T>,
    pub(crate) config: ConsumerConfig,
    pub(crate) dead_letters: Option<Recipient<DeadLetter>>,
    /// The store its dead letters are kept in, with their source's kind and name.
    pub(crate) kept: Option<(DeadLetters, SourceKind, String)>,
}

/// Builds [`ConsumerOptions`]; see [`ConsumerConfig`] for each setting's default and rule.
pub struct ConsumerOptionsBuilder<T> {
    handler: DeliveryHandler<T>,
    loaded: ConsumerConfig,
    explicit: Overrides<ConsumerConfig>,
    dead_letters: Option<Recipient<DeadLetter>>,
    kept: Option<(DeadLetters, SourceKind, String)>,
    name: Option<String>,
}

impl<T: 'static> ConsumerOptionsBuilder<T> {
    /// Loaded settings (e.g. from the application's config file); values set on the builder
    /// still win.
    pub fn config(mut self, config: ConsumerConfig) -> Self {
        self.loaded = config;
        self
    }

    /// Producer ids kept in the dedup table at once, least recently used evicted beyond
    /// (default 1024).
    pub fn max_producers(self, max_producers: impl Into<Limit<usize>>) -> Self {
        let max_producers = max_producers.into();
        self.set(move |c| c.max_producers = max_producers)
    }

    /// The longest chunked message accepted, in bytes as encoded (default 64 MiB): a message
    /// announced longer is a dead letter
    /// ([`DeadLetterReason::MessageTooLarge`](crate::DeadLetterReason::MessageTooLarge)).
    pub fn max_message_bytes(self, bytes: u64) -> Self {
        self.set(move |c| c.max_message_bytes = bytes)
    }

    /// The most bytes of chunked messages held at once (default 256 MiB; at least
    /// `max_message_bytes`): reserved for messages being reassembled (each its whole length),
    /// and held by reassembled messages waiting for the handler. Beyond, chunks are refused
    /// (and retransmitted by their producers), their messages waiting in line; see
    /// [`reassembly`](crate::protocol::chunk::reassembly).
    pub fn max_reassembly_bytes(self, bytes: u64) -> Self {
        self.set(move |c| c.max_reassembly_bytes = bytes)
    }

    /// What every message being reassembled gets of its lifetime, whatever its length
    /// (default 5 s): it is dropped this long, plus its length at `min_reassembly_rate`, after
    /// its first chunk was buffered. See [`ConsumerConfig::reassembly_grace`].
    pub fn reassembly_grace(self, grace: Duration) -> Self {
        self.set(move |c| c.reassembly_grace = grace)
    }

    /// The slowest rate, in bytes per second, at which a chunked message is expected to
    /// arrive (default 1 MiB/s): see [`ConsumerConfig::min_reassembly_rate`].
    pub fn min_reassembly_rate(self, bytes_per_second: u64) -> Self {
        self.set(move |c| c.min_reassembly_rate = bytes_per_second)
    }

    /// Sweep a producer's windows after this long without a delivery (default 300 s;
    /// `Limit::Unbounded` never sweeps and arms no timer). Keep it well above the longest gap
    /// between a producer's retransmissions: `resend_timeout`, or with exponential backoff up
    /// to `backoff.max`.
    pub fn producer_idle_ttl(self, ttl: impl Into<Limit<Duration>>) -> Self {
        let ttl = ttl.into();
        self.set(move |c| c.producer_idle_ttl = ttl)
    }

    /// Seqs retained above a producer's contiguous mark (default 1024).
    pub fn max_out_of_order(self, max_out_of_order: impl Into<Limit<usize>>) -> Self {
        let max_out_of_order = max_out_of_order.into();
        self.set(move |c| c.max_out_of_order = max_out_of_order)
    }

    /// Abandon a handler run after this long (default 30 s; `Limit::Unbounded` never does): it
    /// counts as a failure, the next message runs, and the abandoned one runs again when its
    /// producer retransmits it. See [`ConsumerConfig::handler_timeout`].
    pub fn handler_timeout(self, timeout: impl Into<Limit<Duration>>) -> Self {
        let timeout = timeout.into();
        self.set(move |c| c.handler_timeout = timeout)
    }

    /// Run each producer's messages strictly in seq order (default false). Deliveries that
    /// arrive ahead of their turn are refused and retransmitted by the producer.
    pub fn ordered(self, ordered: bool) -> Self {
        self.set(move |c| c.ordered = ordered)
    }

    /// Where malformed deliveries are reported (they are counted and logged either way).
    pub fn dead_letters(mut self, sink: Recipient<DeadLetter>) -> Self {
        self.dead_letters = Some(sink);
        self
    }

    /// Keeps the deliveries it refuses in `dead_letters`, under the name `source` (kind
    /// [`Consumer`](crate::dead_letters::SourceKind::Consumer)): undecodable and
    /// incompatible bodies with their bytes as received, malformed deliveries with their ids
    /// (the key is `producer/incarnation/seq`). What a peer floods is sampled (see
    /// [`DeadLetterLimits`](crate::dead_letters::DeadLetterLimits)). Beside
    /// [`dead_letters`](Self::dead_letters), which still gets every one.
    pub fn keep_dead_letters(
        mut self,
        dead_letters: DeadLetters,
        source: impl Into<String>,
    ) -> Self {
        self.kept = Some((dead_letters, SourceKind::Consumer, source.into()));
        self
    }

    /// The consumer's name (default `"default"`; not empty): the `consumer` label of its
    /// metrics (feature `metrics`; consumers sharing a name add up) and the `consumer` field
    /// of its handler spans (feature `tracing`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Validates and returns the options.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first invalid field.
    pub fn build(self) -> Result<ConsumerOptions<T>, OptionsError> {
        if self.name.as_deref() == Some("") {
            return Err(OptionsError::new("name", "must not be empty (got \"\")"));
        }
        #[allow(unused_mut)] // without `tracing`
        let mut handler = self.handler;
        #[cfg(feature = "tracing")]
        if let Some(name) = &self.name {
            handler.set_name(name);
        }
        let mut options = ConsumerOptions::from_config(handler, self.explicit.apply(self.loaded))?;
        options.dead_letters = self.dead_letters;
        options.kept = self.kept;
        options.name = self.name;
        Ok(options)
    }

    fn set(mut self, setter: impl FnOnce(&mut ConsumerConfig) + Send + 'static) -> Self {
        self.explicit.set(setter);
        self
    }
}
