//! Switchyard's end-to-end suite, as one test binary (`cargo test -p switchyard-e2e --test e2e`)
//! against the shared real control plane; the harness it drives (the cluster, the GPU node
//! simulator, the pools, the locks) is the `switchyard_e2e` library in `e2e/src/`. One binary
//! links the kube stack once, where a binary per scenario file linked it eleven times.
//!
//! Each module is a room of scenarios, and a test's name is its path in the binary:
//! `smoke::server_is_v1_37_and_serves_dra_v1`,
//! `migration::faults::a_leader_that_loses_its_lease_stops_at_once_and_the_standby_finishes`.
//! libtest's filters match a substring of that path, so a room runs on its own with
//! `cargo test -p switchyard-e2e --test e2e -- migration::replace::`.
//!
//! - On the GPU node simulator and the API server: [`smoke`] (the environment itself), [`agent`]
//!   (the real driver agent), [`kubelet_plugin`] (the agent driven by the kubelet's own DRA
//!   code), [`cli`] (the `switchyard` CLI), [`manifests`] (what users install, dry-run on the
//!   server) and [`migration`] (the migration engine on simulated pools: a folder of rooms by
//!   concern, `forward`, `rollback`, `faults`, `sharing`, `replace` and `status`, and the helpers
//!   they share in its `mod.rs`).
//! - On the real nodes, with the packaged operator (it manages every GpuPoolMigration of the
//!   cluster, so these take `locks::cluster_alone`): [`real_nodes`], [`nvidia_dra`], [`kueue`],
//!   [`gpu_sharing`] and [`demo`].
//!
//! `e2e/hack/run-e2e.sh` (`make e2e`) builds this binary once and runs it in two phases, every
//! process with `--no-fail-fast`:
//! 1. the `migration::` scenarios in one process, several at once
//!    (`SWITCHYARD_E2E_MIGRATION_THREADS`, 4 by default), and beside it, in a second process, the
//!    library's and binaries' unit tests and the other simulator-based modules (`agent`, `cli`,
//!    `kubelet_plugin`, `manifests`, `smoke`);
//! 2. after both, the real-node modules in one process, with the cluster to themselves.
//!
//! Each process `--skip`s the modules of the others, so that a filter given to run-e2e.sh narrows
//! every phase and no scenario runs twice; a new module runs in the second process of phase 1
//! unless run-e2e.sh names it. Scenarios that must not overlap take the locks of
//! `e2e/src/locks.rs`, which hold across processes.

mod agent;
mod cli;
mod demo;
mod gpu_sharing;
mod kubelet_plugin;
mod kueue;
mod manifests;
mod migration;
mod nvidia_dra;
mod real_nodes;
mod smoke;
