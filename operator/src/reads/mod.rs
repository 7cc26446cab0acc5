//! Reads from the API that no cache holds: paged pod LISTs ([`pod_list`]) and the objects the
//! capacity-reader audit judges ([`reader_objects`]), and a Replace migration's target pool
//! ([`target_pool`]).

pub mod nodes;
pub mod pod_list;
pub mod pods;
pub mod reader_objects;
pub mod server;
pub mod target_pool;
