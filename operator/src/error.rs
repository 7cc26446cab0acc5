//! The operator's one error type: every variant names the operation that failed, so an event
//! reason, a metric label and a log line all say what Switchyard was doing.

use kube::runtime::finalizer;

/// Everything that can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("evicting pod {namespace}/{name}: {source}")]
    EvictPod {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting pod {namespace}/{name} past its PodDisruptionBudget: {source}")]
    DeletePod {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading ResourceClaim {namespace}/{name}: {source}")]
    GetResourceClaim {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing the cluster's ResourceClaims (paged): {source}")]
    ListResourceClaims {
        #[source]
        source: kube::Error,
    },
    #[error("listing pods on node {node}: {source}")]
    ListPods {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing the cluster's pending pods not yet bound to a node (paged): {source}")]
    ListPendingPods {
        #[source]
        source: kube::Error,
    },
    #[error("listing the cluster's bound pods (paged): {source}")]
    ListBoundPods {
        #[source]
        source: kube::Error,
    },
    #[error("listing pool nodes: {source}")]
    ListNodes {
        #[source]
        source: kube::Error,
    },
    #[error("reading node {node}: {source}")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("patching node {node}: {source}")]
    PatchNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("applying DeviceClass {name}: {source}")]
    ApplyDeviceClass {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing ResourceSlices of driver {driver}: {source}")]
    ListResourceSlices {
        driver: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading DaemonSet {namespace}/{name}: {source}")]
    GetDaemonSet {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("applying placement to DaemonSet {namespace}/{name}: {source}")]
    PatchDaemonSet {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating DeviceTaintRule {name}: {source}")]
    CreateDeviceTaintRule {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing DeviceTaintRules labelled {selector}: {source}")]
    ListDeviceTaintRules {
        selector: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting DeviceTaintRule {name}: {source}")]
    DeleteDeviceTaintRule {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating canary pod on node {node}: {source}")]
    CreateCanary {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("discovering the API server's version and resources: {source}")]
    Discovery {
        #[source]
        source: kube::Error,
    },
    #[error("listing GpuPoolMigrations: {source}")]
    ListMigrations {
        #[source]
        source: kube::Error,
    },
    #[error("writing GpuPoolMigration {name} status: {source}")]
    PatchStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("encoding {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the {kind} cache has not finished its first list: check that the operator may list and watch {kind}s, and its log"
    )]
    CacheNotSynced { kind: &'static str },
    #[error("invalid spec: {message}")]
    InvalidSpec { message: String },
    #[error("waiting for {nodes} node(s) to finish their step before the migration is removed")]
    CleanupWaiting { nodes: usize },
    #[error("finalizer: {source}")]
    Finalizer {
        #[source]
        source: Box<finalizer::Error<Error>>,
    },
}

impl Error {
    /// A short, bounded CamelCase name: the event reason and the `category` metric label.
    pub fn category(&self) -> &'static str {
        match self {
            Error::EvictPod { .. } => "EvictPod",
            Error::DeletePod { .. } => "DeletePod",
            Error::GetResourceClaim { .. } => "GetResourceClaim",
            Error::ListResourceClaims { .. } => "ListResourceClaims",
            Error::ListPods { .. } => "ListPods",
            Error::ListPendingPods { .. } => "ListPendingPods",
            Error::ListBoundPods { .. } => "ListBoundPods",
            Error::ListNodes { .. } => "ListNodes",
            Error::GetNode { .. } => "GetNode",
            Error::PatchNode { .. } => "PatchNode",
            Error::ApplyDeviceClass { .. } => "ApplyDeviceClass",
            Error::ListResourceSlices { .. } => "ListResourceSlices",
            Error::GetDaemonSet { .. } => "GetDaemonSet",
            Error::PatchDaemonSet { .. } => "PatchDaemonSet",
            Error::CreateDeviceTaintRule { .. } => "CreateDeviceTaintRule",
            Error::ListDeviceTaintRules { .. } => "ListDeviceTaintRules",
            Error::DeleteDeviceTaintRule { .. } => "DeleteDeviceTaintRule",
            Error::CreateCanary { .. } => "CreateCanary",
            Error::Discovery { .. } => "Discovery",
            Error::ListMigrations { .. } => "ListMigrations",
            Error::PatchStatus { .. } => "PatchStatus",
            Error::Encode { .. } => "Encode",
            Error::CacheNotSynced { .. } => "CacheNotSynced",
            Error::InvalidSpec { .. } => "InvalidSpec",
            Error::CleanupWaiting { .. } => "CleanupWaiting",
            // The finalizer helper wraps every apply and cleanup error: the cause is the category.
            Error::Finalizer { source } => match source.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.category(),
                _ => "Finalizer",
            },
        }
    }

    /// The cleanup waiting for nodes to finish their step: routine, not a failure. It is an
    /// `Err` only because the finalizer helper removes the finalizer on `Ok`.
    pub fn is_routine_wait(&self) -> bool {
        match self {
            Error::CleanupWaiting { .. } => true,
            Error::Finalizer { source } => {
                matches!(source.as_ref(), finalizer::Error::CleanupFailed(e) if e.is_routine_wait())
            }
            _ => false,
        }
    }

    /// The server answered 409: a precondition (resourceVersion) failed or the object exists.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::PatchNode { source, .. } if api_status_code(source) == Some(409))
    }

    /// The server answered 404: the object the request named is gone.
    pub fn is_not_found(&self) -> bool {
        match self {
            Error::EvictPod { source, .. }
            | Error::DeletePod { source, .. }
            | Error::ListPods { source, .. }
            | Error::ListPendingPods { source }
            | Error::GetNode { source, .. }
            | Error::PatchNode { source, .. }
            | Error::CreateDeviceTaintRule { source, .. }
            | Error::DeleteDeviceTaintRule { source, .. }
            | Error::CreateCanary { source, .. } => api_status_code(source) == Some(404),
            _ => false,
        }
    }

    /// True when retrying the same request later may succeed (network trouble, throttling,
    /// conflicts, server errors); false when a human must change something first.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Encode { .. } | Error::InvalidSpec { .. } => false,
            Error::CleanupWaiting { .. } => true,
            // The watch keeps retrying on its own; the reconcile waits again after the backoff.
            Error::CacheNotSynced { .. } => true,
            Error::Finalizer { source } => match source.as_ref() {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.is_transient(),
                finalizer::Error::AddFinalizer(e) | finalizer::Error::RemoveFinalizer(e) => {
                    kube_error_is_transient(e)
                }
                finalizer::Error::UnnamedObject | finalizer::Error::InvalidFinalizer => false,
            },
            Error::EvictPod { source, .. }
            | Error::DeletePod { source, .. }
            | Error::GetResourceClaim { source, .. }
            | Error::ListResourceClaims { source }
            | Error::ListPods { source, .. }
            | Error::ListPendingPods { source }
            | Error::ListBoundPods { source }
            | Error::ListNodes { source }
            | Error::GetNode { source, .. }
            | Error::PatchNode { source, .. }
            | Error::ApplyDeviceClass { source, .. }
            | Error::ListResourceSlices { source, .. }
            | Error::GetDaemonSet { source, .. }
            | Error::PatchDaemonSet { source, .. }
            | Error::CreateDeviceTaintRule { source, .. }
            | Error::ListDeviceTaintRules { source, .. }
            | Error::DeleteDeviceTaintRule { source, .. }
            | Error::CreateCanary { source, .. }
            | Error::Discovery { source }
            | Error::ListMigrations { source }
            | Error::PatchStatus { source, .. } => kube_error_is_transient(source),
        }
    }
}

impl From<finalizer::Error<Error>> for Error {
    fn from(source: finalizer::Error<Error>) -> Self {
        Error::Finalizer { source: Box::new(source) }
    }
}

/// The HTTP status code of an API error, if the server answered at all.
pub fn api_status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// Throttling (429), conflicts (409), timeouts and server errors are worth retrying; any other
/// answer from the server (400, 403, 404, 422) needs a change first. No answer at all (network,
/// TLS hiccups) is transient.
pub fn kube_error_is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => matches!(status.code, 409 | 429 | 408 | 504) || status.code >= 500,
        kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => false,
        _ => true,
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status { code, message: format!("code {code}"), ..Default::default() }))
    }

    #[test]
    fn transient_by_status_code() {
        let cases = [
            (429, true),
            (409, true),
            (500, true),
            (503, true),
            (504, true),
            (400, false),
            (403, false),
            (404, false),
            (422, false),
        ];
        for (code, want) in cases {
            let e = Error::PatchNode { node: "n1".into(), source: api_error(code) };
            assert_eq!(e.is_transient(), want, "code {code}");
            assert_eq!(e.category(), "PatchNode");
        }
    }

    #[test]
    fn spec_and_encoding_errors_are_permanent() {
        let e = Error::InvalidSpec { message: "bad".into() };
        assert!(!e.is_transient());
        let json_err = serde_json::from_str::<u8>("x").unwrap_err();
        let e = Error::Encode { what: "status", source: json_err };
        assert!(!e.is_transient());
        assert_eq!(e.category(), "Encode");
    }

    #[test]
    fn finalizer_errors_follow_their_cause() {
        let inner = Error::EvictPod { namespace: "ml".into(), name: "p".into(), source: api_error(503) };
        let e: Error = finalizer::Error::ApplyFailed(inner).into();
        assert!(e.is_transient());
        assert_eq!(e.category(), "EvictPod", "the metric names the cause, not the wrapper");
        assert!(!e.is_routine_wait());
        let e: Error = finalizer::Error::CleanupFailed(Error::CleanupWaiting { nodes: 2 }).into();
        assert!(e.is_routine_wait());
        assert_eq!(e.category(), "CleanupWaiting");
        let e: Error = finalizer::Error::<Error>::InvalidFinalizer.into();
        assert!(!e.is_transient());
    }

    #[test]
    fn not_found_means_the_object_is_gone() {
        let gone = Error::PatchNode { node: "n1".into(), source: api_error(404) };
        assert!(gone.is_not_found());
        let other = Error::PatchNode { node: "n1".into(), source: api_error(500) };
        assert!(!other.is_not_found());
        assert!(!Error::InvalidSpec { message: "x".into() }.is_not_found());
    }

    #[test]
    fn message_names_the_operation_and_object() {
        let e = Error::EvictPod { namespace: "ml".into(), name: "trainer-0".into(), source: api_error(500) };
        assert!(e.to_string().starts_with("evicting pod ml/trainer-0"));
        assert!(std::error::Error::source(&e).is_some());
    }
}
