//! End-to-end harness for Switchyard: the one real control plane every test shares
//! ([`cluster`]), its real nodes and Switchyard installed on them as packaged ([`real`]), the GPU
//! node simulator for pools larger than the real nodes ([`sim`]), the locks between scenarios that
//! share the cluster ([`locks`]), and polling helpers ([`wait`]).
//! The scenarios are the modules of one test binary, `e2e/tests/e2e/main.rs`.

pub mod cluster;
pub mod containers;
pub mod locks;
pub mod measure;
pub mod pool;
pub mod real;
pub mod sim;
pub mod wait;
