//! Switchyard driver agent: discovers a node's NVIDIA GPUs (through NVML, or simulated), publishes
//! them as DRA ResourceSlices, and turns GPU health events into device taints.
//!
//! Walk: [`discovery`] (what the node has) -> [`health`] (what is wrong with it) -> [`slices`]
//! (pure: what to publish) -> [`publish`] (writing it) -> [`agent`] (the loop) -> [`cli`] (flags
//! and wiring). The loop also follows its own Node ([`node_watch`]): the device-plugin interlock
//! ([`coexistence`]) and the per-node shares per device. Beside the loop, [`plugin`] is the DRA
//! kubelet plugin: it prepares allocated claims for containers by writing [`cdi`] specs.

pub mod agent;
pub mod cdi;
pub mod cli;
pub mod coexistence;
pub mod discovery;
pub mod error;
pub mod health;
pub mod metrics;
pub mod node_events;
pub mod node_watch;
pub mod plugin;
pub mod publish;
pub mod slices;

pub use error::Error;
