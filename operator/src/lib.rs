//! Switchyard operator: moves GPU node pools from the NVIDIA device plugin to a DRA driver, node
//! by node, and back.

pub mod api;
pub mod crd;
#[doc(hidden)]
pub mod testing;
pub mod well_known;
