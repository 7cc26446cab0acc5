//! The kubelet plugin registration service: tells the kubelet's plugin watcher that we are a DRA
//! plugin, for which driver, where our DRAPlugin socket is and which services it offers, and hears
//! back whether the kubelet accepted us.

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::pb::registration as pb;
use crate::metrics::{Metrics, ResultLabels};

/// Plugin type that routes us to the kubelet's DRA handler (`pluginregistration.DRAPlugin`).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA services we offer, as the kubelet names them: `<last proto package element>.<service>`.
/// The kubelet (v1.37) knows `v1.DRAPlugin` and `v1beta1.DRAPlugin` and takes the first one of our
/// list that it knows; we serve only v1.
pub const SUPPORTED_SERVICES: [&str; 1] = ["v1.DRAPlugin"];

/// What the kubelet last told us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationState {
    /// No verdict yet.
    Pending,
    Registered,
    /// The kubelet refused us, with its reason. We keep serving: it retries when the socket is
    /// recreated, and a fixed kubelet config may accept us then.
    Failed(String),
}

/// Answers GetInfo and records NotifyRegistrationStatus.
#[derive(Clone)]
pub struct RegistrationService {
    driver: String,
    endpoint: String,
    metrics: Metrics,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// `endpoint` is the absolute path of our DRAPlugin socket.
    pub fn new(driver: impl Into<String>, endpoint: impl Into<String>, metrics: Metrics) -> Self {
        RegistrationService {
            driver: driver.into(),
            endpoint: endpoint.into(),
            metrics,
            state: watch::Sender::new(RegistrationState::Pending),
        }
    }

    /// Follow the kubelet's verdicts.
    pub fn state(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }
}

#[tonic::async_trait]
impl pb::registration_server::Registration for RegistrationService {
    async fn get_info(&self, _: Request<pb::InfoRequest>) -> Result<Response<pb::PluginInfo>, Status> {
        tracing::debug!("kubelet asked for plugin info");
        Ok(Response::new(pb::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_SERVICES.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<pb::RegistrationStatus>,
    ) -> Result<Response<pb::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let (result, state) = if status.plugin_registered {
            tracing::info!(driver = %self.driver, "the kubelet registered the DRA plugin");
            ("ok", RegistrationState::Registered)
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the DRA plugin; still serving");
            ("failed", RegistrationState::Failed(status.error))
        };
        self.metrics.plugin_registrations.get_or_create(&ResultLabels { result: result.into() }).inc();
        self.state.send_replace(state);
        Ok(Response::new(pb::RegistrationStatusResponse {}))
    }
}
