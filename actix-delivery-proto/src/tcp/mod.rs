//! The TCP transport's wire: frames, handshake, authentication, bodies, the output queue,
//! pending deliveries, peers and routes.

pub mod auth;
pub mod body;
pub mod frame;
pub mod handshake;
pub mod output;
pub mod peer;
pub mod pending;
pub mod routes;
