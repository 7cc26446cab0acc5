//! The kubelet plugin registration service: tells the kubelet's plugin watcher that we are a DRA
//! plugin, for which driver, where our DRAPlugin socket is and which services it offers, and hears
//! back whether the kubelet accepted us.

use k8s_openapi::jiff::Timestamp;
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

/// Value of the `<driver>/kubelet-plugin-not-registered` taint while the kubelet has given no
/// verdict yet. A taint value must be a label value (at most 63 characters), so the kubelet's
/// free-text reason for a refusal goes to the log, not into the taint.
pub const NOT_REGISTERED_PENDING: &str = "pending";
/// Value of the `<driver>/kubelet-plugin-not-registered` taint after the kubelet refused us.
pub const NOT_REGISTERED_REFUSED: &str = "refused";

impl RegistrationState {
    /// The value of the not-registered taint in this state; `None` once the kubelet registered us.
    pub fn not_registered(&self) -> Option<&'static str> {
        match self {
            RegistrationState::Pending => Some(NOT_REGISTERED_PENDING),
            RegistrationState::Registered => None,
            RegistrationState::Failed(_) => Some(NOT_REGISTERED_REFUSED),
        }
    }
}

/// The kubelet's verdicts as the agent loop reads them. While the kubelet has not registered our
/// plugin, the agent publishes every device with a `<driver>/kubelet-plugin-not-registered`
/// NoSchedule taint: a claim the scheduler allocated then would fail in the kubelet's prepare
/// ("DRA driver ... is not registered"), and the kubelet retries only on its next pod resync.
pub struct RegistrationWatch {
    rx: watch::Receiver<RegistrationState>,
    /// Since when the kubelet has not registered us, while it has not.
    since: Option<Timestamp>,
    /// The taint value last reported, to log each change once.
    reported: Option<&'static str>,
}

impl RegistrationWatch {
    /// Follows `rx` (from [`RegistrationService::state`]); the condition counts from now.
    pub fn new(rx: watch::Receiver<RegistrationState>) -> Self {
        let since = rx.borrow().not_registered().map(|_| Timestamp::now());
        Self { rx, since, reported: None }
    }

    /// Waits for the next verdict. Once the plugin is gone (the sender dropped) it waits forever,
    /// so that a `select!` over it does not spin on a closed channel.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Since when the kubelet has not registered us, and the taint value (`pending`,
    /// `refused`); `None` while it has. A refusal after `pending` keeps the time the condition
    /// began; a refusal after a registration (a restarted kubelet) starts it again.
    pub fn not_registered(&mut self) -> Option<(Timestamp, &'static str)> {
        let state = self.rx.borrow_and_update().clone();
        let value = state.not_registered();
        self.since = match (value, self.since) {
            (None, _) => None,
            (Some(_), Some(since)) => Some(since),
            (Some(_), None) => Some(Timestamp::now()),
        };
        if value != self.reported {
            let taint = switchyard_api::well_known::TAINT_KEY_PLUGIN_NOT_REGISTERED;
            match &state {
                RegistrationState::Registered => tracing::info!(taint, "plugin registered; taint removed"),
                RegistrationState::Pending => {
                    tracing::info!(taint, "plugin not registered yet; devices tainted")
                }
                RegistrationState::Failed(reason) => {
                    tracing::info!(taint, %reason, "plugin refused by the kubelet; devices tainted")
                }
            }
            self.reported = value;
        }
        Some((self.since?, value?))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Pending and refused keep the time the condition began, a registration clears it, a later
    /// refusal starts it again; a closed channel leaves `changed` waiting instead of spinning.
    #[tokio::test]
    async fn watch_reports_the_condition_and_since_when() {
        let (tx, rx) = watch::channel(RegistrationState::Pending);
        let mut w = RegistrationWatch::new(rx);
        let (began, value) = w.not_registered().expect("pending");
        assert_eq!(value, NOT_REGISTERED_PENDING);

        tx.send_replace(RegistrationState::Failed("a long free-text reason from the kubelet".into()));
        tokio::time::timeout(Duration::from_secs(5), w.changed()).await.expect("a change");
        assert_eq!(w.not_registered(), Some((began, NOT_REGISTERED_REFUSED)));

        tx.send_replace(RegistrationState::Registered);
        w.changed().await;
        assert_eq!(w.not_registered(), None);

        let restarted = Timestamp::now();
        tx.send_replace(RegistrationState::Failed("no".into()));
        let (again, value) = w.not_registered().expect("refused");
        assert_eq!(value, NOT_REGISTERED_REFUSED);
        assert!(again >= restarted && restarted > began, "counts from the refusal, not from the start");

        drop(tx);
        let waited = tokio::time::timeout(Duration::from_millis(50), w.changed()).await;
        assert!(waited.is_err(), "a closed channel is no change");
        assert_eq!(
            w.not_registered().map(|(_, v)| v),
            Some(NOT_REGISTERED_REFUSED),
            "the last verdict stays"
        );
    }

    #[test]
    fn taint_values_are_label_values() {
        for v in [NOT_REGISTERED_PENDING, NOT_REGISTERED_REFUSED] {
            assert!(
                v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "{v}"
            );
        }
        assert_eq!(RegistrationState::Registered.not_registered(), None);
    }
}
