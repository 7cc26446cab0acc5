//! The user-facing API of Switchyard, one submodule per served version.
//!
//! `v1alpha1` is the only version today and is the storage version.

// kube's `printcolumn(...)` repeats `type_ = "integer"` per column, which clippy mistakes for a
// duplicated attribute.
#[allow(clippy::duplicated_attributes)]
pub mod v1alpha1;

/// The API group of every Switchyard custom resource.
pub const GROUP: &str = "switchyard.dev";
