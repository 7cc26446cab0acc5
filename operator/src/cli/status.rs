//! `switchyard status <name>`: follows a GpuPoolMigration with a watch.

use kube::Client;

use super::StatusArgs;

/// Follows the migration; returns the exit code.
pub async fn run(_client: Client, _args: &StatusArgs) -> anyhow::Result<u8> {
    anyhow::bail!("status: not built yet")
}
