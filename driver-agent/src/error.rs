//! The agent's one error enum: a variant per operation that can fail.

/// Everything the agent can fail at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NVML could not be loaded or initialised: no NVIDIA driver (or no libnvidia-ml) on the node.
    /// The agent stays up, publishes nothing and retries discovery.
    #[error("no NVIDIA driver: {0}")]
    NoDriver(#[source] nvml_wrapper::error::NvmlError),

    /// An NVML query failed during discovery.
    #[error("NVML {op} failed")]
    Nvml {
        op: &'static str,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },

    /// A blocking task panicked or was cancelled.
    #[error("blocking task failed")]
    Blocking(#[source] tokio::task::JoinError),

    /// The simulated-inventory file could not be read.
    #[error("reading simulated inventory {path}")]
    ReadSimConfig {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// The simulated-inventory file is not valid.
    #[error("invalid simulated inventory: {0}")]
    InvalidSimConfig(String),

    /// Reading the Node object (for its uid) failed.
    #[error("getting node {node}")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },

    /// Listing our existing ResourceSlices failed.
    #[error("listing ResourceSlices")]
    ListSlices(#[source] kube::Error),

    /// Server-side apply of a ResourceSlice failed.
    #[error("applying ResourceSlice {name}")]
    PublishSlice {
        name: String,
        #[source]
        source: kube::Error,
    },

    /// Deleting one of our stale ResourceSlices failed.
    #[error("deleting stale ResourceSlice {name}")]
    DeleteSlice {
        name: String,
        #[source]
        source: kube::Error,
    },

    /// Building the Kubernetes client failed.
    #[error("creating Kubernetes client")]
    Client(#[source] kube::Error),

    /// Binding or serving an HTTP listener failed.
    #[error("serving HTTP on {addr}")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    /// Rendering ResourceSlices as YAML failed.
    #[error("rendering YAML")]
    Render(#[source] serde_yaml::Error),

    /// The command line is inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// Creating, binding or removing a kubelet plugin socket (or its directory) failed.
    #[error("kubelet plugin socket {path}")]
    PluginSocket {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A kubelet plugin gRPC server stopped with an error.
    #[error("serving the kubelet plugin")]
    PluginServe(#[source] tonic::transport::Error),

    /// Reading or writing the prepared-claims checkpoint failed.
    #[error("checkpoint {path}")]
    Checkpoint {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// The checkpoint file exists but does not parse.
    #[error("checkpoint {path} is corrupt")]
    InvalidCheckpoint {
        path: String,
        #[source]
        source: serde_json::Error,
    },

    /// Writing or removing a claim's CDI spec failed.
    #[error("CDI spec {path}")]
    CdiSpec {
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// Reading a ResourceClaim from the API failed.
    #[error("getting ResourceClaim {claim}")]
    GetClaim {
        claim: String,
        #[source]
        source: kube::Error,
    },

    /// The ResourceClaim the kubelet named does not exist (or has another uid: it was recreated).
    #[error("ResourceClaim {claim} not found")]
    ClaimNotFound { claim: String },

    /// The ResourceClaim cannot be prepared here: not allocated, allocated to another driver or
    /// node, or naming a device this node does not have.
    #[error("ResourceClaim {claim}: {reason}")]
    InvalidClaim { claim: String, reason: String },

    /// The plugin is shutting down and prepares no new claims.
    #[error("the driver is shutting down; not preparing new claims")]
    ShuttingDown,
}

impl Error {
    /// The message with every source appended (`a: b: c`), for places that take one string, like
    /// the per-claim error the kubelet shows in pod events.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            out.push_str(": ");
            out.push_str(&s.to_string());
            source = s.source();
        }
        out
    }

    /// Short, bounded name for metric labels and log fields.
    pub fn category(&self) -> &'static str {
        match self {
            Error::NoDriver(_) => "no_driver",
            Error::Nvml { .. } => "nvml",
            Error::Blocking(_) => "blocking",
            Error::ReadSimConfig { .. } | Error::InvalidSimConfig(_) => "sim_config",
            Error::GetNode { .. } => "get_node",
            Error::ListSlices(_) => "list_slices",
            Error::PublishSlice { .. } => "publish_slice",
            Error::DeleteSlice { .. } => "delete_slice",
            Error::Client(_) => "client",
            Error::Serve { .. } => "serve",
            Error::Render(_) => "render",
            Error::Config(_) => "config",
            Error::PluginSocket { .. } | Error::PluginServe(_) => "plugin_serve",
            Error::Checkpoint { .. } | Error::InvalidCheckpoint { .. } => "checkpoint",
            Error::CdiSpec { .. } => "cdi_spec",
            Error::GetClaim { .. } => "get_claim",
            Error::ClaimNotFound { .. } => "claim_not_found",
            Error::InvalidClaim { .. } => "invalid_claim",
            Error::ShuttingDown => "shutting_down",
        }
    }

    /// Whether retrying the same operation later can succeed. Drives backoff: transient errors
    /// retry quickly, the others only at the backoff cap.
    pub fn is_transient(&self) -> bool {
        match self {
            // A driver container may still be installing the driver.
            Error::NoDriver(_) => true,
            Error::Nvml { source, .. } => matches!(
                source,
                nvml_wrapper::error::NvmlError::Timeout
                    | nvml_wrapper::error::NvmlError::GpuLost
                    | nvml_wrapper::error::NvmlError::Unknown
                    | nvml_wrapper::error::NvmlError::InsufficientMemory
            ),
            Error::Blocking(_) => true,
            Error::GetNode { source, .. }
            | Error::ListSlices(source)
            | Error::PublishSlice { source, .. }
            | Error::DeleteSlice { source, .. }
            | Error::Client(source)
            | Error::GetClaim { source, .. } => kube_error_is_transient(source),
            // Disk trouble may pass, and the kubelet retries a shutting-down agent's claims on
            // its successor.
            Error::Checkpoint { .. } | Error::CdiSpec { .. } | Error::ShuttingDown => true,
            Error::ReadSimConfig { .. }
            | Error::InvalidSimConfig(_)
            | Error::Serve { .. }
            | Error::Render(_)
            | Error::Config(_)
            | Error::PluginSocket { .. }
            | Error::PluginServe(_)
            | Error::InvalidCheckpoint { .. }
            | Error::ClaimNotFound { .. }
            | Error::InvalidClaim { .. } => false,
        }
    }
}

/// Network trouble, throttling, conflicts and server errors pass; validation and permission
/// errors do not.
fn kube_error_is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 500..=599) || status.code == 404,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::HttpError(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("x", "y").with_code(code).boxed())
    }

    #[test]
    fn transient_classification_follows_the_api_status() {
        for (code, transient) in
            [(409, true), (429, true), (500, true), (503, true), (404, true), (422, false), (403, false)]
        {
            let e = Error::PublishSlice { name: "s".into(), source: api(code) };
            assert_eq!(e.is_transient(), transient, "HTTP {code}");
            assert_eq!(e.category(), "publish_slice");
        }
        assert!(!Error::Config("x".into()).is_transient());
        assert!(Error::NoDriver(nvml_wrapper::error::NvmlError::DriverNotLoaded).is_transient());
    }
}
