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

/// The selector of the nodes `migration` owns (`switchyard.dev/migration=<migration>`).
pub fn owned_by(migration: &str) -> Selector {
    Selector::from_iter([(crate::well_known::LABEL_MIGRATION.to_string(), migration.to_string())])
}

/// The pool of `migration` as the operator reads it ([`crate::pool::rollout::pool_members`]): the
/// nodes `spec.nodeSelector` selects, and those it owns that only lost labels GPU Feature
/// Discovery writes; listed from the API and read as the cache reads them (the CLI's read; the
/// controller reads its cache with `cached_pool_nodes`).
pub async fn list_pool_nodes(
    client: &Client,
    spec: &GpuPoolMigrationSpec,
    migration: &str,
) -> Result<Vec<SlimNode>> {
    let selector = node_selector(spec)?;
    let list = |s: Selector| async move {
        Api::<SlimNode>::all(client.clone())
            .list(&ListParams::default().labels_from(&s))
            .await
            .map(|l| l.items)
            .map_err(|source| Error::ListNodes { source })
    };
    let selected = list(selector.clone()).await?;
    let owned = list(owned_by(migration)).await?;
    Ok(crate::pool::rollout::pool_members(selected, &owned, &selector, migration))
}
