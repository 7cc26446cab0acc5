//! The user-facing API of Switchyard, from the `switchyard-api` crate (which the driver agent
//! uses too), under the operator's historical path.

pub use switchyard_api::{GROUP, v1alpha1};
