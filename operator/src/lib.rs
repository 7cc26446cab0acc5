//! Switchyard operator: moves GPU node pools from the NVIDIA device plugin to a DRA driver, node
//! by node, and back.
//!
//! The folders follow the picture in the README, top to bottom; a module imports only what
//! stands below it:
//!
//! - [`controller`]: the watches, the context every reconcile shares (wiring only);
//! - [`reconcile`]: one reconcile: observe, decide (pure), execute; cleanup beside apply;
//! - [`node`]: one node: its slim cached shape, its record, its patches, its state machine,
//!   drain and canary;
//! - [`pool`]: the pool's judgements: the rollout, prerequisites, capacity, overlap, placement,
//!   DeviceClasses, selectors, the capacity readers, and the preview `switchyard plan` shows;
//! - [`reads`] and [`cache`]: API reads and the caches the watches feed;
//! - [`report`]: conditions, events and metrics;
//! - [`runtime`]: the process: leader election, the allocator, the HTTP endpoints.

pub mod api;
pub mod cache;
pub mod controller;
pub mod crd;
pub mod error;
pub mod node;
pub mod pool;
pub mod reads;
pub mod reconcile;
pub mod report;
pub mod runtime;
#[doc(hidden)]
pub mod testing;
pub use switchyard_api::well_known;

pub use error::{Error, Result};
