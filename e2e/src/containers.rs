//! What the workload's containers on the real nodes hold, for the sampler ([`crate::pool::Sampler`]):
//! each running container's GPU device nodes, read once per container from what the workload image
//! prints as it starts (`/dev/nvidia<N>` as `ls -l` shows it, then `workload: ready`), and the check
//! made at every pod event: no GPU inside two running containers of one node.
//!
//! The API says which GPU a DRA claim holds, but not which GPU the device plugin gave a container
//! (only the kubelet's checkpoint does), so the container's own view is the one source that covers
//! both backends. A GPU is named by its device node's major:minor and path on the node
//! ([`crate::real::device_node`]), which NVIDIA's device plugin and its DRA driver's CDI spec give
//! alike for one GPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::LogParams;
use kube::{Api, Client, ResourceExt};

use crate::real::{device_node, what_the_container_saw};

/// How long a container that runs may take to print its GPUs; it prints them before anything else.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The line the workload prints once it has listed its GPUs.
const PRINTED: &str = "workload: ready";

/// One container's GPUs (or MIG devices), as it printed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub pod: String,
    pub node: String,
    pub gpus: Vec<String>,
}

/// The running containers of one namespace's pods, and the GPUs each holds.
pub(crate) struct Containers {
    api: Api<Pod>,
    ns: String,
    /// Per container ID, what it holds: read once, kept while it runs.
    read: HashMap<String, Held>,
    /// Per pod UID, the IDs of its containers that run now.
    running: HashMap<String, Vec<String>>,
    /// Containers read so far, running or not.
    pub read_count: usize,
}

impl Containers {
    pub(crate) fn new(client: Client, ns: &str) -> Self {
        Self {
            api: Api::namespaced(client, ns),
            ns: ns.to_owned(),
            read: HashMap::new(),
            running: HashMap::new(),
            read_count: 0,
        }
    }

    /// Takes a watch event of `pod` in: the containers that run now, each newly running one's GPUs
    /// read from its log. A container that prints nothing in [`READ_TIMEOUT`] is an error (it is
    /// then not counted as holding anything).
    pub(crate) async fn observe(&mut self, pod: &Pod, live: bool) -> Result<(), String> {
        if pod.namespace().as_deref() != Some(self.ns.as_str()) {
            return Ok(());
        }
        let uid = pod.uid().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
        let now: Vec<(String, String)> = statuses
            .iter()
            .filter(|c| live && c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .filter_map(|c| Some((c.container_id.clone()?, c.name.clone())))
            .collect();
        let mut failed = Ok(());
        for (id, container) in &now {
            if self.read.contains_key(id) {
                continue;
            }
            match self.read_gpus(&pod.name_any(), container).await {
                Ok(gpus) => {
                    self.read.insert(id.clone(), Held { pod: pod.name_any(), node: node.clone(), gpus });
                    self.read_count += 1;
                }
                Err(e) => failed = Err(e),
            }
        }
        let ids: Vec<String> = now.into_iter().map(|(id, _)| id).collect();
        for gone in self.running.get(&uid).into_iter().flatten().filter(|id| !ids.contains(id)) {
            self.read.remove(gone);
        }
        if ids.is_empty() {
            self.running.remove(&uid);
        } else {
            self.running.insert(uid, ids);
        }
        failed
    }

    /// The GPU device nodes `container` of `pod` printed, once it has printed them all.
    async fn read_gpus(&self, pod: &str, container: &str) -> Result<Vec<String>, String> {
        let params = LogParams { container: Some(container.to_owned()), ..LogParams::default() };
        let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
        loop {
            let last = match self.api.logs(pod, &params).await {
                Ok(logs) if logs.lines().any(|l| l == PRINTED) => return held_devices(&logs),
                Ok(logs) => logs,
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{}/{pod}: container {container} printed no GPU list: {last}", self.ns));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The GPUs inside two or more running containers of one node now.
    pub(crate) fn shared(&self) -> Vec<Shared> {
        shared(self.running.values().flatten().filter_map(|id| self.read.get(id)))
    }
}

/// What a container holds, from what it printed: a MIG device's capability device nodes
/// (`nvidia-cap<N>`, one per GPU and compute instance; the parent GPU's `/dev/nvidia<N>` is in every
/// container on one of its MIG devices, by design), else its `/dev/nvidia<N>` GPU device nodes.
fn held_devices(logs: &str) -> Result<Vec<String>, String> {
    let caps: Vec<String> = logs
        .lines()
        .filter_map(|l| l.strip_prefix("workload: dev "))
        .filter_map(device_node)
        .filter(|d| d.contains("nvidia-cap"))
        .collect();
    if !caps.is_empty() {
        return Ok(caps);
    }
    let (_, gpus) = what_the_container_saw(logs);
    gpus.iter().map(|l| device_node(l).ok_or_else(|| format!("an unreadable device node: {l:?}"))).collect()
}

/// A GPU inside two or more running containers of one node: (node, device node, their pods).
pub type Shared = (String, String, Vec<String>);

/// The GPUs that more than one of `held` holds on the same node.
pub(crate) fn shared<'a>(held: impl Iterator<Item = &'a Held>) -> Vec<Shared> {
    let mut by_gpu: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for h in held {
        for gpu in &h.gpus {
            by_gpu.entry((h.node.clone(), gpu.clone())).or_default().insert(h.pod.clone());
        }
    }
    by_gpu
        .into_iter()
        .filter(|(_, pods)| pods.len() > 1)
        .map(|((node, gpu), pods)| (node, gpu, pods.into_iter().collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(pod: &str, node: &str, gpus: &[&str]) -> Held {
        Held { pod: pod.into(), node: node.into(), gpus: gpus.iter().map(|g| g.to_string()).collect() }
    }

    #[test]
    fn one_gpu_in_two_containers_of_a_node_is_shared() {
        let all = [
            held("a", "n1", &["195:0 /dev/nvidia0"]),
            held("b", "n1", &["195:1 /dev/nvidia1", "195:0 /dev/nvidia0"]),
            held("c", "n1", &["195:2 /dev/nvidia2"]),
        ];
        assert_eq!(
            shared(all.iter()),
            vec![("n1".to_owned(), "195:0 /dev/nvidia0".to_owned(), vec!["a".to_owned(), "b".to_owned()])]
        );
    }

    #[test]
    fn a_mig_device_is_its_capabilities_and_a_whole_gpu_its_device_node() {
        let mig = "workload: dev crw-rw-rw-    1 root     root      195,   1 Dec  7 10:00 /dev/nvidia1\n\
                   workload: dev crw-rw-rw-    1 root     root      195, 255 Dec  7 10:00 /dev/nvidiactl\n\
                   workload: dev cr--r--r--    1 root     root      511,  30 Dec  7 10:00 nvidia-cap30\n\
                   workload: dev cr--r--r--    1 root     root      511,  31 Dec  7 10:00 nvidia-cap31\n\
                   workload: ready\n";
        assert_eq!(held_devices(mig).unwrap(), ["511:30 nvidia-cap30", "511:31 nvidia-cap31"]);
        let whole = "workload: dev crw-rw-rw-    1 root     root      195,   0 Dec  7 10:00 /dev/nvidia0\n\
                     workload: dev crw-rw-rw-    1 root     root      195, 255 Dec  7 10:00 /dev/nvidiactl\n\
                     workload: ready\n";
        assert_eq!(held_devices(whole).unwrap(), ["195:0 /dev/nvidia0"]);
    }

    #[test]
    fn the_same_minor_on_two_nodes_is_two_gpus() {
        let all = [held("a", "n1", &["195:0 /dev/nvidia0"]), held("b", "n2", &["195:0 /dev/nvidia0"])];
        assert!(shared(all.iter()).is_empty());
    }
}
