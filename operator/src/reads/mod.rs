//! Reads from the API that no cache holds: paged pod LISTs ([`pod_list`]) and the objects the
//! capacity-reader audit judges ([`reader_objects`]).

pub mod nodes;
pub mod pod_list;
pub mod pods;
pub mod reader_objects;
pub mod server;
