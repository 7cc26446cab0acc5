//! The DRA kubelet plugin: the two Unix sockets the kubelet talks to, and their life cycle.
//!
//! Layout under the kubelet root (`--kubelet-root`, default `/var/lib/kubelet`):
//!
//! ```text
//! plugins_registry/<driver>-reg.sock   registration (the kubelet's plugin watcher finds it here)
//! plugins/<driver>/dra.sock            the DRAPlugin service the kubelet calls
//! plugins/<driver>/checkpoint.json     prepared claims, see [`checkpoint`]
//! ```
//!
//! Start-up removes sockets a crashed predecessor left, binds the DRAPlugin socket, then the
//! registration socket (so the kubelet never finds us before we can answer). Shutdown refuses new
//! claims but keeps both sockets up until every prepared claim is unprepared or the drain timeout
//! passes: pods holding claims cannot finish terminating without us. Then it removes the
//! registration socket (the kubelet deregisters us), stops the servers and removes the sockets.

pub mod authority;
pub mod checkpoint;
pub mod dra;
pub mod registration;

use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

use crate::error::Error;
use crate::metrics::Metrics;
use dra::{DraGrpc, DraService};
use registration::RegistrationService;

/// Generated from `proto/`: messages, clients and servers of the kubelet's protocols.
pub mod pb {
    /// Kubelet plugin registration v1 (package `pluginregistration`).
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// DRA kubelet plugin API v1 (package `k8s.io.kubelet.pkg.apis.dra.v1`).
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
}

/// The kubelet's default root directory.
pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";
/// How long shutdown keeps serving while claims are still prepared. Below the DaemonSet's 30 s
/// termination grace period, which the driver-unavailable taint publication shares.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a gRPC server may take to close its connections once told to stop.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the plugin lives and how it stops.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    pub driver: String,
    pub node_name: String,
    pub kubelet_root: PathBuf,
    pub cdi_dir: PathBuf,
    pub drain_timeout: Duration,
    /// `--dev-root`, where it is not `/`.
    pub dev_root: Option<String>,
}

impl PluginConfig {
    /// `<root>/plugins/<driver>`: our socket and checkpoint.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_root.join("plugins").join(&self.driver)
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    pub fn checkpoint_path(&self) -> PathBuf {
        self.plugin_dir().join("checkpoint.json")
    }

    /// `<root>/plugins_registry/<driver>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_root.join("plugins_registry").join(format!("{}-reg.sock", self.driver))
    }

    pub fn dra_config(&self) -> dra::DraConfig {
        dra::DraConfig {
            driver: self.driver.clone(),
            node_name: self.node_name.clone(),
            cdi_dir: self.cdi_dir.clone(),
            checkpoint: self.checkpoint_path(),
            dev_root: self.dev_root.clone(),
        }
    }
}

fn socket_err(path: &Path, source: std::io::Error) -> Error {
    Error::PluginSocket { path: path.display().to_string(), source }
}

/// Remove a socket left at `path`; anything else there is an error, not ours to delete.
fn remove_stale_socket(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(socket_err(path, e)),
        Ok(m) if m.file_type().is_socket() => {
            tracing::info!(path = %path.display(), "removing stale socket");
            std::fs::remove_file(path).map_err(|e| socket_err(path, e))
        }
        Ok(_) => Err(socket_err(path, std::io::Error::other("exists and is not a socket"))),
    }
}

/// Bind a Unix socket at `path`, creating its directory and replacing a stale socket.
pub fn bind(path: &Path) -> Result<UnixListener, Error> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| socket_err(dir, e))?;
    }
    remove_stale_socket(path)?;
    UnixListener::bind(path).map_err(|e| socket_err(path, e))
}

type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// A plugin whose sockets are bound and served.
pub struct RunningPlugin {
    config: PluginConfig,
    service: Arc<DraService>,
    registration: RegistrationService,
    stop_registration: watch::Sender<bool>,
    stop_dra: watch::Sender<bool>,
    registration_task: ServerTask,
    dra_task: ServerTask,
}

fn serve<IO>(
    incoming: impl futures::Stream<Item = std::io::Result<IO>> + Send + 'static,
    router: tonic::transport::server::Router,
    stop: watch::Receiver<bool>,
) -> ServerTask
where
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
{
    tokio::spawn(async move {
        let mut stop = stop;
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        router.serve_with_incoming_shutdown(incoming, stopped).await
    })
}

/// Bind both sockets and start serving. Fails when a socket cannot be bound or the checkpoint
/// cannot be read.
pub fn start(
    config: PluginConfig,
    service: Arc<DraService>,
    metrics: Metrics,
) -> Result<RunningPlugin, Error> {
    std::fs::create_dir_all(&config.cdi_dir).map_err(|e| socket_err(&config.cdi_dir, e))?;
    let dra_socket = config.dra_socket();
    let reg_socket = config.registration_socket();
    let dra_listener = bind(&dra_socket)?;
    let (stop_dra, dra_rx) = watch::channel(false);
    let dra_task = serve(
        UnixListenerStream::new(dra_listener),
        tonic::transport::Server::builder()
            .add_service(pb::dra::dra_plugin_server::DraPluginServer::new(DraGrpc(service.clone()))),
        dra_rx,
    );
    let registration = RegistrationService::new(&config.driver, dra_socket.display().to_string(), metrics);
    let reg_listener = bind(&reg_socket)?;
    let (stop_registration, reg_rx) = watch::channel(false);
    // The kubelet's registration client sends the socket path as :authority; see [`authority`].
    let reg_incoming = futures::StreamExt::map(UnixListenerStream::new(reg_listener), |c| {
        c.map(authority::FixAuthority::new)
    });
    let registration_task = serve(
        reg_incoming,
        tonic::transport::Server::builder().add_service(
            pb::registration::registration_server::RegistrationServer::new(registration.clone()),
        ),
        reg_rx,
    );
    tracing::info!(
        registration = %reg_socket.display(),
        dra = %dra_socket.display(),
        cdi_dir = %config.cdi_dir.display(),
        "kubelet plugin serving"
    );
    Ok(RunningPlugin {
        config,
        service,
        registration,
        stop_registration,
        stop_dra,
        registration_task,
        dra_task,
    })
}

async fn stop_server(stop: &watch::Sender<bool>, task: ServerTask) -> Result<(), Error> {
    stop.send_replace(true);
    match tokio::time::timeout(SERVER_STOP_TIMEOUT, task).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(Error::PluginServe(e)),
        Ok(Err(join)) => Err(Error::Blocking(join)),
        Err(_) => {
            tracing::warn!("a kubelet plugin server did not stop in time; abandoning its connections");
            Ok(())
        }
    }
}

impl RunningPlugin {
    pub fn service(&self) -> &Arc<DraService> {
        &self.service
    }

    pub fn registration(&self) -> &RegistrationService {
        &self.registration
    }

    /// Serve until `shutdown` resolves (or a server fails), then drain and stop.
    pub async fn run_until(mut self, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
        let failed = tokio::select! {
            _ = shutdown => None,
            r = &mut self.dra_task => Some(r),
            r = &mut self.registration_task => Some(r),
        };
        if let Some(r) = failed {
            // A server that stops by itself is broken: take the sockets down and report it.
            let _ = std::fs::remove_file(self.config.registration_socket());
            let _ = std::fs::remove_file(self.config.dra_socket());
            return match r {
                Ok(Ok(())) => Err(Error::Config("a kubelet plugin server stopped unexpectedly".into())),
                Ok(Err(e)) => Err(Error::PluginServe(e)),
                Err(e) => Err(Error::Blocking(e)),
            };
        }
        self.shutdown().await
    }

    /// Drain (bounded by the drain timeout), deregister, stop, remove the sockets.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.service.start_draining();
        let left = self.service.prepared_claims().await;
        if !left.is_empty() {
            tracing::info!(
                claims = left.len(),
                timeout = ?self.config.drain_timeout,
                "shutting down: serving until the prepared claims are unprepared"
            );
            if !self.service.wait_drained(self.config.drain_timeout).await {
                let left = self.service.prepared_claims().await;
                tracing::warn!(claims = ?left, "drain timeout: stopping with claims still prepared; the checkpoint keeps them for the next agent");
            }
        }
        let reg_socket = self.config.registration_socket();
        let dra_socket = self.config.dra_socket();
        // Removing the registration socket is what makes the kubelet deregister us.
        let _ = remove_stale_socket(&reg_socket);
        let r1 = stop_server(&self.stop_registration, self.registration_task).await;
        let r2 = stop_server(&self.stop_dra, self.dra_task).await;
        let _ = remove_stale_socket(&dra_socket);
        tracing::info!("kubelet plugin stopped");
        r1.and(r2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_kubelet_layout() {
        let c = PluginConfig {
            driver: "gpu.switchyard.dev".into(),
            node_name: "n".into(),
            kubelet_root: "/var/lib/kubelet".into(),
            cdi_dir: "/var/run/cdi".into(),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            dev_root: None,
        };
        assert_eq!(
            c.registration_socket(),
            Path::new("/var/lib/kubelet/plugins_registry/gpu.switchyard.dev-reg.sock")
        );
        assert_eq!(c.dra_socket(), Path::new("/var/lib/kubelet/plugins/gpu.switchyard.dev/dra.sock"));
        assert_eq!(
            c.checkpoint_path(),
            Path::new("/var/lib/kubelet/plugins/gpu.switchyard.dev/checkpoint.json")
        );
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_and_other_files_are_not() {
        let dir = std::env::temp_dir().join(format!("sy-sock-{}", std::process::id()));
        let path = dir.join("a/x.sock");
        let first = bind(&path).unwrap();
        drop(first); // leaves the socket file behind, as a crash would
        assert!(path.exists());
        let _second = bind(&path).unwrap();
        let file = dir.join("a/plain");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(bind(&file), Err(Error::PluginSocket { .. })));
        assert!(file.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
