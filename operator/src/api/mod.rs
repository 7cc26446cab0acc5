//! The user-facing API of Switchyard, one submodule per served version.
//!
//! `v1alpha1` is the only version today and is the storage version.

pub mod v1alpha1;

/// The API group of every Switchyard custom resource.
pub const GROUP: &str = "switchyard.dev";
