//! The pool's nodes as `spec.nodeSelector` selects them, listed from the API (the CLI's read;
//! the controller reads its node cache instead).

use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::Selector;

use crate::api::v1alpha1::GpuPoolMigrationSpec;
use crate::error::{Error, Result};
use crate::node::slim::SlimNode;

pub(crate) fn node_selector(spec: &GpuPoolMigrationSpec) -> Result<Selector> {
    Selector::try_from(spec.node_selector.clone())
        .map_err(|e| Error::InvalidSpec { message: format!("spec.nodeSelector: {e}") })
}

/// The nodes `spec.nodeSelector` selects, listed from the API and read as the cache reads them
/// (the CLI's read; the controller reads its cache with `cached_pool_nodes`).
pub async fn list_pool_nodes(client: &Client, spec: &GpuPoolMigrationSpec) -> Result<Vec<SlimNode>> {
    let selector = node_selector(spec)?;
    Api::<SlimNode>::all(client.clone())
        .list(&ListParams::default().labels_from(&selector))
        .await
        .map(|l| l.items)
        .map_err(|source| Error::ListNodes { source })
}
