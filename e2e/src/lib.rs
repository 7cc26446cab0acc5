//! End-to-end harness for Switchyard: the one real control plane every test shares
//! ([`cluster`]), the GPU node simulator that stands in for the kubelet ([`sim`]), and polling
//! helpers ([`wait`]). The scenarios live in `e2e/tests/`.

pub mod cluster;
pub mod pool;
pub mod sim;
pub mod wait;
