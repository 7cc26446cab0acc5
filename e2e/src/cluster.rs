//! The shared e2e control plane. The first test in a process starts it with
//! `e2e/hack/cluster-up.sh` (which reuses a running one) and applies `crds/`; every test then
//! builds its own client from the admin kubeconfig. There is no fallback: if the cluster cannot be
//! started, the test fails with the script's output, so e2e is never skipped silently.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Where a running cluster's admin kubeconfig is taken from, instead of starting one.
pub const KUBECONFIG_ENV: &str = "SWITCHYARD_E2E_KUBECONFIG";

struct Shared {
    kubeconfig: PathBuf,
    bin_dir: PathBuf,
}

static SHARED: OnceLock<Result<Shared, String>> = OnceLock::new();

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("e2e/ has a parent").to_path_buf()
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `program args...` under coreutils `timeout`: a step of the shared set-up that hangs fails the
/// scenario with its name and output instead of stalling the whole suite.
fn bounded(seconds: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.arg("--kill-after=10").arg(seconds.to_string()).arg(program);
    cmd
}

fn start() -> Result<Shared, String> {
    let root = repo_root();
    // Cold, this builds Kubernetes (make test builds it first); warm, it returns at once.
    let bin_dir = PathBuf::from(run(bounded(3600, "bash").arg(root.join("e2e/hack/build-controlplane.sh")))?);
    let kubeconfig = match std::env::var_os(KUBECONFIG_ENV) {
        Some(path) => PathBuf::from(path),
        None => {
            run(bounded(1800, "bash").arg(root.join("e2e/hack/cluster-up.sh")))?;
            root.join("e2e/.cluster/kubeconfig")
        }
    };
    let kubectl = bin_dir.join("kubectl");
    run(bounded(120, &kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(root.join("crds")))?;
    run(bounded(120, &kubectl).arg("--kubeconfig").arg(&kubeconfig).args([
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/gpupoolmigrations.switchyard.dev",
    ]))?;
    Ok(Shared { kubeconfig, bin_dir })
}

fn shared() -> &'static Shared {
    match SHARED.get_or_init(start) {
        Ok(shared) => shared,
        Err(e) => panic!("the e2e control plane is not available, so this test cannot run:\n{e}"),
    }
}

/// The admin kubeconfig of the shared cluster (starting it if needed).
pub fn kubeconfig() -> &'static Path {
    &shared().kubeconfig
}

/// The directory holding the cached upstream binaries (kubectl among them).
pub fn bin_dir() -> &'static Path {
    &shared().bin_dir
}

/// A client for the shared cluster, as the cluster admin (system:masters).
pub async fn client() -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig())?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// A short random suffix so that concurrent tests never share object names.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{:x}{n}", (nanos ^ std::process::id()) & 0xfffff)
}

/// A binary the e2e suite runs as a process, from `env` (set by `e2e/hack/run-e2e.sh`) or the
/// default target directory. Panics with the command to run when it is missing.
fn built_binary(env: &str, name: &str) -> PathBuf {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/debug").join(name));
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build -p switchyard-operator -p switchyard-cli -p switchyard-driver-agent --bins` or `make e2e`",
        path.display()
    );
    path
}

/// The `switchyard-driver-agent` binary.
pub fn agent_bin() -> PathBuf {
    built_binary("SWITCHYARD_AGENT_BIN", "switchyard-driver-agent")
}

/// The `switchyard-operator` binary.
pub fn operator_bin() -> PathBuf {
    built_binary("SWITCHYARD_OPERATOR_BIN", "switchyard-operator")
}

/// The `switchyard` CLI binary.
pub fn cli_bin() -> PathBuf {
    built_binary("SWITCHYARD_CLI_BIN", "switchyard")
}

/// Label on every namespace a scenario creates; `e2e/hack/sweep.sh` removes old ones that an
/// interrupted run left behind.
pub const LABEL_SCENARIO: &str = "e2e.switchyard.dev/scenario";

/// Creates a scenario namespace and waits for its default ServiceAccount, without which no pod
/// can be created there.
pub async fn create_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use kube::Api;
    use kube::api::PostParams;
    let ns: Namespace = serde_json::from_value(
        serde_json::json!({"metadata": {"name": name, "labels": {LABEL_SCENARIO: "true"}}}),
    )?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    crate::wait::until(
        &format!("the default ServiceAccount in {name}"),
        std::time::Duration::from_secs(60),
        || {
            let sas = sas.clone();
            async move { Ok(sas.get_opt("default").await?.map(|_| ())) }
        },
    )
    .await
}
