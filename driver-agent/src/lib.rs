//! Switchyard driver agent: discovers a node's NVIDIA GPUs (through NVML, or simulated), publishes
//! them as DRA ResourceSlices, and turns GPU health events into device taints.
//!
//! Walk: [`inventory`] (what the node has) -> [`health`] (what is wrong with it) -> [`slices`]
//! (pure: what to publish) -> [`publish`] (writing it) -> [`agent`] (the loop) -> [`cli`] (flags
//! and wiring).

pub mod agent;
pub mod cli;
pub mod error;
pub mod health;
pub mod inventory;
pub mod metrics;
pub mod publish;
pub mod slices;

pub use error::Error;
