//! The pool's judgements, all pure: which nodes move when ([`rollout`]), whether the cluster can
//! serve the pool through DRA ([`prerequisites`], [`capacity`]), that no node is served twice
//! ([`overlap`]), where each DaemonSet runs ([`placement`]), the DeviceClasses
//! ([`device_classes`], [`selectors`]), whether a Replace migration's target has room ([`replace`],
//! [`fits`]), who still counts GPUs the device-plugin way
//! ([`readers`]), and what `switchyard plan` shows ([`preview`]).

pub mod capacity;
pub mod device_classes;
pub mod fits;
pub mod gate;
pub mod overlap;
pub mod placement;
pub mod plugin_config;
pub mod prerequisites;
pub mod preview;
pub mod readers;
pub mod replace;
pub mod rollout;
pub mod selectors;
