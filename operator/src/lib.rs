//! Switchyard operator: moves GPU node pools from the NVIDIA device plugin to a DRA driver, node
//! by node, and back.

pub mod alloc;
pub mod api;
pub mod cache;
pub mod canary;
pub mod capacity;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod device_classes;
pub mod drain;
pub mod error;
pub mod events;
pub mod inventory;
pub mod inventory_source;
pub mod leader;
pub mod metrics;
pub mod node_fields;
pub mod node_state;
pub mod overlap;
pub mod placement;
pub mod plan;
pub mod pod_list;
pub mod prerequisites;
pub mod preview;
pub mod reconcile;
pub mod runtime;
pub mod selectors;
pub mod str_map;
#[doc(hidden)]
pub mod testing;
pub mod watch;
pub use switchyard_api::well_known;

pub use error::{Error, Result};
