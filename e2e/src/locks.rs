//! Locks between the scenarios that share the one e2e cluster, both inside a test process and
//! across the test processes that `e2e/hack/run-e2e.sh` runs at the same time.
//!
//! Each lock is a tokio lock for the scenarios of one process, taken first, and then an advisory
//! file lock (`flock`) beside the cluster's kubeconfig for the other processes. A file lock is
//! released when its file is closed, so a test process that dies holds nothing.
//!
//! - [`cluster_shared`] (or [`cluster_shared_blocking`] in a plain `#[test]`): every scenario that
//!   uses the cluster holds it while it runs.
//! - [`cluster_alone`]: a scenario that disrupts the whole cluster (an API-server restart) holds
//!   it instead, so that no other scenario, in any process, runs through the outage.
//! - [`nvidia_gpu`]: a scenario whose pool or DeviceClasses use the real `nvidia.com/gpu` name
//!   holds it (after [`cluster_shared`]): two DeviceClasses for one extended resource name
//!   shadow each other, so two such scenarios cannot run at once anywhere.
//!
//! Always take `cluster_*` before `nvidia_gpu`; taking them in one order rules out a deadlock.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use anyhow::Context as _;
use tokio::sync::{Mutex, RwLock};

use crate::cluster;

static NVIDIA_GPU: Mutex<()> = Mutex::const_new(());
static CLUSTER: RwLock<()> = RwLock::const_new(());

/// A held lock: dropping it releases the file lock, then the in-process one.
#[must_use = "the lock is released when this is dropped"]
pub struct Held {
    // Field order is drop order: the file lock goes before the in-process guard, so another
    // scenario of this process never waits on a file lock that this one still holds.
    _file: File,
    _guard: Box<dyn Send + Sync>,
}

#[derive(Clone, Copy)]
enum Mode {
    Shared,
    Exclusive,
}

/// Holds the cluster shared with every other scenario, waiting while one holds it alone.
pub async fn cluster_shared() -> anyhow::Result<Held> {
    let guard = CLUSTER.read().await;
    let file = flock("cluster", Mode::Shared).await?;
    Ok(Held { _file: file, _guard: Box::new(guard) })
}

/// Holds the cluster alone: waits until no scenario in any process holds it, and keeps new ones
/// out until dropped.
pub async fn cluster_alone() -> anyhow::Result<Held> {
    let guard = CLUSTER.write().await;
    let file = flock("cluster", Mode::Exclusive).await?;
    Ok(Held { _file: file, _guard: Box::new(guard) })
}

/// [`cluster_shared`] for a test that runs without an async runtime (a plain `#[test]`).
pub fn cluster_shared_blocking() -> anyhow::Result<Held> {
    let guard = CLUSTER.blocking_read();
    let file = flock_blocking("cluster", Mode::Shared)?;
    Ok(Held { _file: file, _guard: Box::new(guard) })
}

/// Holds the `nvidia.com/gpu` extended resource name: one such scenario at a time, in any process.
pub async fn nvidia_gpu() -> anyhow::Result<Held> {
    let guard = NVIDIA_GPU.lock().await;
    let file = flock("nvidia-gpu", Mode::Exclusive).await?;
    Ok(Held { _file: file, _guard: Box::new(guard) })
}

/// The lock files live beside the kubeconfig (`e2e/.cluster/locks/`), so they are per cluster.
/// They stay empty; a lock is the open file, not the file's existence.
fn lock_path(name: &str) -> anyhow::Result<PathBuf> {
    let dir = cluster::kubeconfig().parent().context("the kubeconfig has a directory")?.join("locks");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.join(format!("{name}.lock")))
}

async fn flock(name: &'static str, mode: Mode) -> anyhow::Result<File> {
    // flock(2) blocks the thread; a blocking thread keeps the scenarios' runtime free meanwhile.
    tokio::task::spawn_blocking(move || flock_blocking(name, mode)).await?
}

fn flock_blocking(name: &str, mode: Mode) -> anyhow::Result<File> {
    let path = lock_path(name)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match mode {
        Mode::Shared => file.lock_shared(),
        Mode::Exclusive => file.lock(),
    }
    .with_context(|| format!("locking {}", path.display()))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file half, on a temporary file: shared holders coexist, an exclusive one waits for
    /// them, and a closed file releases its lock.
    #[test]
    fn file_locks_share_exclude_and_release_on_close() {
        let path = std::env::temp_dir().join(format!("switchyard-locks-{}.lock", std::process::id()));
        let open = || OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap();
        let (a, b) = (open(), open());
        a.lock_shared().unwrap();
        b.try_lock_shared().expect("two shared holders coexist");
        let c = open();
        assert!(c.try_lock().is_err(), "an exclusive lock waits for the shared holders");
        drop(a);
        assert!(c.try_lock().is_err(), "one shared holder is still there");
        drop(b);
        c.try_lock().expect("closing the files released their locks");
        let d = open();
        assert!(d.try_lock_shared().is_err(), "a shared lock waits for the exclusive holder");
        drop(c);
        d.try_lock_shared().expect("closing the exclusive holder's file released it");
        let _ = std::fs::remove_file(&path);
    }
}
