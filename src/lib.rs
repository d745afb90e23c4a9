#![doc = "actix-delivery (docs to come)"]
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod config;
pub mod error;
pub mod protocol;

pub use config::{Backoff, ConsumerConfig, Limit, ProducerConfig};
pub use error::{DeliveryError, OptionsError, TellError};
