//! What the operator tells people and tools: kstatus conditions ([`conditions`]), Kubernetes
//! events ([`events`]) and Prometheus metrics ([`metrics`]).

pub mod conditions;
pub mod events;
pub mod gpus;
pub mod metrics;
