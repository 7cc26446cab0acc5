//! Real GPUs through NVML: discovery, and the blocking event-watcher thread that turns XID, ECC
//! and GPU-lost events into [`HealthEvent`]s.
//!
//! NVML calls block (some for seconds on a sick GPU), so discovery runs in
//! `tokio::task::spawn_blocking` and the event watcher on its own thread.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::DeviceAttributes;
use tokio::sync::mpsc;

use super::{Discovery, EventSource, Gpu, MigDevice, NodeGpus};
use crate::error::Error;
use crate::health::{FaultKind, HealthEvent};
use crate::metrics::Metrics;

/// How long one NVML event wait blocks, so the watcher notices a stop request promptly.
const EVENT_WAIT_MS: u32 = 1000;
/// How often the watcher probes every GPU: finds GPUs that fell off the bus without an event, and
/// notices when a lost or ECC-failed GPU answers cleanly again (after a reset).
const PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// The NVML library's file name, as the NVIDIA driver installs it.
pub const LIBRARY_NAME: &str = "libnvidia-ml.so.1";

/// Where the library sits under a driver root (`--driver-root`: the host's `/`, or the GPU
/// Operator's driver container at `/run/nvidia/driver`), in the order tried: Debian and Ubuntu,
/// RHEL-like systems, then the generic directories.
const LIBRARY_DIRS: [&str; 6] = [
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib64",
    "usr/lib",
];

/// Which libnvidia-ml the agent loads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Library {
    /// The file, or `None` for the dynamic loader's search path (the image's own library
    /// directories, or what a runtime class such as `nvidia` mounts into the container).
    pub path: Option<PathBuf>,
    /// Where the agent looked under `--driver-root` before settling, for the message when the
    /// library cannot be loaded.
    pub searched: Vec<PathBuf>,
}

impl Library {
    /// `--nvml-library` when given; else the first [`LIBRARY_NAME`] in a `LIBRARY_DIRS` entry
    /// of `--driver-root`; else the loader's search path.
    pub fn resolve(explicit: Option<&Path>, driver_root: Option<&Path>) -> Library {
        if let Some(p) = explicit {
            return Library { path: Some(p.to_path_buf()), searched: Vec::new() };
        }
        let Some(root) = driver_root else { return Library::default() };
        let searched: Vec<PathBuf> = LIBRARY_DIRS.iter().map(|d| root.join(d).join(LIBRARY_NAME)).collect();
        let path = searched.iter().find(|p| p.exists()).cloned();
        Library { path, searched }
    }

    /// What a log line or a Node event says about where the library was looked for.
    pub fn describe(&self) -> String {
        match (&self.path, self.searched.is_empty()) {
            (Some(p), _) => p.display().to_string(),
            (None, true) => format!("{LIBRARY_NAME} on the loader's search path"),
            (None, false) => format!(
                "{LIBRARY_NAME} on the loader's search path (not found under the driver root at {})",
                self.searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    fn load(&self) -> Result<Nvml, NvmlError> {
        match &self.path {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
    }
}

/// The file the process mapped for `libnvidia-ml` (from `/proc/self/maps`): which library the
/// loader really picked, whatever was asked for.
fn mapped_library(maps: &str) -> Option<&str> {
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("libnvidia-ml"))
}

/// GPUs discovered through NVML.
pub struct NvmlDiscovery {
    nvml: Mutex<Option<Arc<Nvml>>>,
    library: Library,
    sysfs: PathBuf,
    caps: PathBuf,
    metrics: Metrics,
}

/// Load NVML from `library`, and say which file and which driver it found. No driver is a state,
/// not a crash: the caller logs and retries.
fn init_nvml(library: &Library) -> Result<Arc<Nvml>, NvmlError> {
    let nvml = library.load()?;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    tracing::info!(
        library = mapped_library(&maps).unwrap_or(&library.describe()),
        driver_version = nvml.sys_driver_version().unwrap_or_default(),
        nvml_version = nvml.sys_nvml_version().unwrap_or_default(),
        "NVML loaded"
    );
    Ok(Arc::new(nvml))
}

impl NvmlDiscovery {
    /// Try to load NVML now from `library`. Without it, discovery keeps failing with
    /// [`Error::NoDriver`] (and retrying the load) until a driver shows up.
    pub fn new(metrics: Metrics, library: Library) -> Self {
        let nvml = match init_nvml(&library) {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(error = %e, library = %library.describe(), "no NVIDIA driver: NVML could not be loaded; publishing no devices");
                None
            }
        };
        NvmlDiscovery {
            nvml: Mutex::new(nvml),
            library,
            sysfs: PathBuf::from("/sys"),
            caps: PathBuf::from("/proc/driver/nvidia/capabilities"),
            metrics,
        }
    }

    /// Where the library is looked for.
    pub fn library(&self) -> &Library {
        &self.library
    }

    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// The loaded library, if any (for the event watcher).
    pub fn nvml(&self) -> Option<Arc<Nvml>> {
        self.nvml.lock().ok().and_then(|g| g.clone())
    }
}

impl Discovery for NvmlDiscovery {
    fn discover(&self) -> BoxFuture<'_, Result<NodeGpus, Error>> {
        async move {
            let current = self.nvml();
            let sysfs = self.sysfs.clone();
            let caps = self.caps.clone();
            let library = self.library.clone();
            let (loaded, result) = tokio::task::spawn_blocking(move || {
                let nvml = match current {
                    Some(n) => n,
                    None => match init_nvml(&library) {
                        Ok(n) => n,
                        Err(e) => return (None, Err(Error::NoDriver(e))),
                    },
                };
                let r = read_inventory(&nvml, &sysfs, &caps);
                (Some(nvml), r)
            })
            .await
            .map_err(Error::Blocking)?;
            if let (Some(n), Ok(mut slot)) = (loaded, self.nvml.lock())
                && slot.is_none()
            {
                *slot = Some(n);
            }
            if let Err(Error::Nvml { op, .. }) = &result {
                self.metrics.nvml_error(op);
            }
            result
        }
        .boxed()
    }
}

impl EventSource for NvmlDiscovery {
    /// Start the NVML event thread for the GPUs discovered first. GPUs that appear later (rare:
    /// hot-plug) are picked up on the next agent restart.
    fn start_events(&self, inv: &NodeGpus, tx: mpsc::Sender<HealthEvent>, stop: Arc<AtomicBool>) {
        let Some(nvml) = self.nvml() else { return };
        // A GPU lost at discovery has no UUID to watch by; the agent follows it by discovery.
        let names = inv.gpus.iter().filter(|g| !g.lost).map(|g| (g.uuid.clone(), g.device_name())).collect();
        if let Err(e) = spawn_event_watcher(nvml, names, tx, stop, self.metrics()) {
            tracing::error!(error = %e, "cannot start the NVML event thread");
        }
    }
}

/// `Ok(None)` for a field this GPU cannot report.
fn optional<T>(r: Result<T, NvmlError>, op: &'static str) -> Result<Option<T>, Error> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(NvmlError::NotSupported) => Ok(None),
        Err(source) => Err(Error::Nvml { op, source }),
    }
}

fn required<T>(r: Result<T, NvmlError>, op: &'static str) -> Result<T, Error> {
    r.map_err(|source| Error::Nvml { op, source })
}

/// NVML's CUDA driver version integer (`12080`) as `12.8`.
pub fn cuda_version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// MIG profile of a MIG device: from its name (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`), else built
/// from its attributes (`1g.10gb`, or `1c.3g.40gb` when the compute instance is smaller than its
/// GPU instance).
pub fn mig_profile(name: Option<&str>, attrs: Option<&DeviceAttributes>) -> Option<String> {
    if let Some(p) = name.and_then(|n| n.rsplit_once("MIG ")).map(|(_, p)| p.trim())
        && !p.is_empty()
    {
        return Some(p.to_string());
    }
    let a = attrs?;
    let gb = (a.memory_size_mb as f64 / 1024.0).round() as u64;
    Some(
        if a.compute_instance_slice_count != a.gpu_instance_slice_count && a.compute_instance_slice_count > 0
        {
            format!("{}c.{}g.{gb}gb", a.compute_instance_slice_count, a.gpu_instance_slice_count)
        } else {
            format!("{}g.{gb}gb", a.gpu_instance_slice_count)
        },
    )
}

/// GPU and compute instance ids of a MIG device. nvml-wrapper does not wrap these two calls, so
/// they go to the loaded library directly; `None` when the symbol or the call fails.
fn mig_instance_ids(dev: &nvml_wrapper::Device<'_>) -> (Option<u32>, Option<u32>) {
    let lib = dev.nvml().lib();
    let mut gi: std::os::raw::c_uint = 0;
    let mut ci: std::os::raw::c_uint = 0;
    // SAFETY: `dev` is a live handle owned by a live `Nvml`; each call only writes one c_uint
    // through a pointer to a local, and is made only when the symbol was found.
    let (gi_ok, ci_ok) = unsafe {
        let h = dev.handle();
        let gi_ok = lib.nvmlDeviceGetGpuInstanceId.is_ok() && lib.nvmlDeviceGetGpuInstanceId(h, &mut gi) == 0;
        let ci_ok =
            lib.nvmlDeviceGetComputeInstanceId.is_ok() && lib.nvmlDeviceGetComputeInstanceId(h, &mut ci) == 0;
        (gi_ok, ci_ok)
    };
    (gi_ok.then_some(gi), ci_ok.then_some(ci))
}

fn read_inventory(nvml: &Nvml, sysfs: &std::path::Path, caps: &std::path::Path) -> Result<NodeGpus, Error> {
    let driver_version = required(nvml.sys_driver_version(), "sys_driver_version")?;
    let cuda_driver_version =
        cuda_version_string(required(nvml.sys_cuda_driver_version(), "sys_cuda_driver_version")?);
    let count = required(nvml.device_count(), "device_count")?;
    let mut gpus = Vec::with_capacity(count as usize);
    for i in 0..count {
        match read_gpu(nvml, i, sysfs, caps) {
            Ok(gpu) => gpus.push(gpu),
            // One GPU fallen off the bus must not hide the others: it keeps its name, and the
            // agent taints it lost (see `Gpu::lost`).
            Err(Error::Nvml { op, source: NvmlError::GpuLost }) => {
                tracing::warn!(
                    index = i,
                    op,
                    "NVML reports GPU {i} lost; publishing gpu-{i} tainted until it answers"
                );
                gpus.push(Gpu::lost(i));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(NodeGpus { driver_version, cuda_driver_version, gpus })
}

/// One GPU, read whole.
fn read_gpu(nvml: &Nvml, i: u32, sysfs: &std::path::Path, caps: &std::path::Path) -> Result<Gpu, Error> {
    let dev = required(nvml.device_by_index(i), "device_by_index")?;
    let minor = required(dev.minor_number(), "minor_number")?;
    let pci_bus_id = optional(dev.pci_info(), "pci_info")?.map(|p| super::normalize_bus_id(&p.bus_id));
    let numa_node = match optional(dev.numa_node_id(), "numa_node_id") {
        Ok(Some(n)) => Some(n),
        _ => pci_bus_id.as_deref().and_then(|b| super::numa_node_from_sysfs(sysfs, b)),
    };
    let mig_enabled = optional(dev.mig_mode(), "mig_mode")?.map(|m| m.current == 1);
    let mut mig = Vec::new();
    if mig_enabled == Some(true) {
        let max = required(dev.mig_device_count(), "mig_device_count")?;
        for j in 0..max {
            let m = match dev.mig_device_by_index(j) {
                Ok(m) => m,
                Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
                Err(source) => return Err(Error::Nvml { op: "mig_device_by_index", source }),
            };
            let attrs = optional(m.attributes(), "mig_attributes")?;
            let name = optional(m.name(), "mig_name")?;
            let (gi, ci) = mig_instance_ids(&m);
            let (gi, ci) = (gi.unwrap_or(j), ci.unwrap_or(0));
            let (gi_cap_minor, ci_cap_minor) = super::mig_cap_minors(caps, minor, gi, ci);
            let Some(profile) = mig_profile(name.as_deref(), attrs.as_ref()) else { continue };
            mig.push(MigDevice {
                uuid: required(m.uuid(), "mig_uuid")?,
                profile,
                memory_bytes: required(m.memory_info(), "mig_memory_info")?.total,
                multiprocessors: attrs.as_ref().map_or(0, |a| a.multiprocessor_count),
                gi,
                ci,
                gi_cap_minor,
                ci_cap_minor,
            });
        }
    }
    Ok(Gpu {
        index: i,
        minor,
        uuid: required(dev.uuid(), "uuid")?,
        product_name: required(dev.name(), "name")?,
        brand: optional(dev.brand(), "brand")?.map(|b| format!("{b:?}")),
        architecture: optional(dev.architecture(), "architecture")?.map(|a| a.to_string()),
        cuda_compute_capability: optional(dev.cuda_compute_capability(), "cuda_compute_capability")?
            .map(|c| format!("{}.{}", c.major, c.minor)),
        memory_bytes: required(dev.memory_info(), "memory_info")?.total,
        pcie_root: pci_bus_id.as_deref().and_then(|b| super::pcie_root_from_sysfs(sysfs, b)),
        pci_bus_id,
        numa_node,
        mig_enabled,
        mig,
        lost: false,
    })
}

/// The health fault an NVML event means, if any.
pub fn fault_of_event(types: EventTypes, xid: Option<&XidError>) -> Option<FaultKind> {
    if types.contains(EventTypes::CRITICAL_XID_ERROR) {
        // An XID NVML could not name is treated as fatal, under value 0.
        let xid = match xid {
            Some(XidError::Value(v)) => u32::try_from(*v).unwrap_or(0),
            _ => 0,
        };
        return Some(FaultKind::Xid { xid });
    }
    if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        return Some(FaultKind::EccDbe);
    }
    None
}

/// Watch NVML events and probe GPUs on a dedicated thread until `stop` is set, sending health
/// events for the GPUs in `names` (uuid -> device name) into `tx`, the channel the simulator's
/// fault endpoint feeds too.
pub fn spawn_event_watcher(
    nvml: Arc<Nvml>,
    names: HashMap<String, String>,
    tx: mpsc::Sender<HealthEvent>,
    stop: Arc<AtomicBool>,
    metrics: Metrics,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("nvml-events".into())
        .spawn(move || watch(&nvml, &names, &tx, &stop, &metrics))
}

fn watch(
    nvml: &Nvml,
    names: &HashMap<String, String>,
    tx: &mpsc::Sender<HealthEvent>,
    stop: &AtomicBool,
    metrics: &Metrics,
) {
    let send = |device: &str, kind: FaultKind| {
        tracing::warn!(device, ?kind, "NVML health event");
        tx.blocking_send(HealthEvent { device: device.to_string(), kind, at: Timestamp::now() }).is_ok()
    };
    let mut set = match nvml.create_event_set() {
        Ok(s) => Some(s),
        Err(e) => {
            metrics.nvml_error("create_event_set");
            tracing::error!(error = %e, "cannot create an NVML event set; relying on probes only");
            None
        }
    };
    for uuid in names.keys() {
        let Some(s) = set.take() else { break };
        let Ok(dev) = nvml.device_by_uuid(uuid.as_str()) else {
            set = Some(s);
            continue;
        };
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let types = dev.supported_event_types().map(|t| t & wanted).unwrap_or(EventTypes::empty());
        if types.is_empty() {
            set = Some(s);
            continue;
        }
        match dev.register_events(types, s) {
            Ok(s) => set = Some(s),
            Err(e) => {
                metrics.nvml_error("register_events");
                tracing::error!(error = %e, uuid, "cannot register for NVML events");
                set = nvml.create_event_set().ok();
            }
        }
    }
    // GPUs this thread reported lost or ECC-failed; they get a Recover once they probe clean.
    let mut reported: HashSet<String> = HashSet::new();
    let mut next_probe = Instant::now();
    while !stop.load(Ordering::Relaxed) && !tx.is_closed() {
        if let Some(s) = &set {
            match s.wait(EVENT_WAIT_MS) {
                Ok(data) => {
                    let uuid = data.device.uuid().ok();
                    let name = uuid.as_ref().and_then(|u| names.get(u));
                    if let (Some(name), Some(kind)) =
                        (name, fault_of_event(data.event_type, data.event_data.as_ref()))
                    {
                        if kind == FaultKind::EccDbe
                            && let Some(u) = &uuid
                        {
                            reported.insert(u.clone());
                        }
                        if !send(name, kind) {
                            return;
                        }
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(NvmlError::GpuLost) => next_probe = Instant::now(),
                Err(e) => {
                    metrics.nvml_error("event_wait");
                    tracing::warn!(error = %e, "NVML event wait failed");
                    std::thread::sleep(Duration::from_millis(EVENT_WAIT_MS.into()));
                }
            }
        } else {
            std::thread::sleep(Duration::from_millis(EVENT_WAIT_MS.into()));
        }
        if Instant::now() >= next_probe {
            next_probe = Instant::now() + PROBE_INTERVAL;
            for (uuid, name) in names {
                let probe = nvml.device_by_uuid(uuid.as_str()).and_then(|d| {
                    d.memory_info()?;
                    match d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                        Ok(n) => Ok(n),
                        Err(NvmlError::NotSupported) => Ok(0),
                        Err(e) => Err(e),
                    }
                });
                // A GPU is reported lost once, and recovered once when it answers cleanly again.
                let event = match probe {
                    Err(_) if reported.insert(uuid.clone()) => Some(FaultKind::GpuLost),
                    Ok(0) if reported.remove(uuid) => Some(FaultKind::Recover),
                    _ => None,
                };
                if let Some(kind) = event
                    && !send(name, kind)
                {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(gi: u32, ci: u32, mb: u64) -> DeviceAttributes {
        DeviceAttributes {
            multiprocessor_count: 14,
            shared_copy_engine_count: 1,
            shared_decoder_count: 0,
            shared_encoder_count: 0,
            shared_jpeg_count: 0,
            shared_ofa_count: 0,
            gpu_instance_slice_count: gi,
            compute_instance_slice_count: ci,
            memory_size_mb: mb,
        }
    }

    #[test]
    fn mig_profiles_from_name_or_attributes() {
        let cases: Vec<(Option<&str>, Option<DeviceAttributes>, Option<&str>)> = vec![
            (Some("NVIDIA A100-SXM4-80GB MIG 1g.10gb"), None, Some("1g.10gb")),
            (Some("NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"), Some(attrs(3, 1, 40192)), Some("1c.3g.40gb")),
            (Some("NVIDIA H100 80GB HBM3"), Some(attrs(3, 3, 40192)), Some("3g.39gb")),
            (None, Some(attrs(1, 1, 9856)), Some("1g.10gb")),
            (None, Some(attrs(3, 1, 40960)), Some("1c.3g.40gb")),
            (None, None, None),
        ];
        for (name, a, want) in cases {
            assert_eq!(mig_profile(name, a.as_ref()).as_deref(), want, "{name:?}");
        }
    }

    #[test]
    fn cuda_versions_render_major_minor() {
        for (v, s) in [(12080, "12.8"), (12040, "12.4"), (11020, "11.2"), (13000, "13.0")] {
            assert_eq!(cuda_version_string(v), s);
        }
    }

    #[test]
    fn nvml_events_map_to_faults() {
        let cases = [
            (EventTypes::CRITICAL_XID_ERROR, Some(XidError::Value(79)), Some(FaultKind::Xid { xid: 79 })),
            (EventTypes::CRITICAL_XID_ERROR, Some(XidError::Unknown), Some(FaultKind::Xid { xid: 0 })),
            (EventTypes::DOUBLE_BIT_ECC_ERROR, None, Some(FaultKind::EccDbe)),
            (EventTypes::SINGLE_BIT_ECC_ERROR, None, None),
            (EventTypes::PSTATE_CHANGE, None, None),
        ];
        for (types, xid, want) in cases {
            assert_eq!(fault_of_event(types, xid.as_ref()), want, "{types:?}");
        }
    }

    #[test]
    fn the_library_comes_from_the_flag_the_driver_root_or_the_loader() {
        let root = std::env::temp_dir().join(format!("switchyard-nvml-{}", std::process::id()));
        let rhel = root.join("usr/lib64");
        std::fs::create_dir_all(&rhel).unwrap();
        let explicit = PathBuf::from("/opt/nvidia/libnvidia-ml.so.1");
        assert_eq!(Library::resolve(Some(&explicit), Some(&root)).path, Some(explicit));
        // Nothing under the root yet: the loader's path, and the message names where it looked.
        let none = Library::resolve(None, Some(&root));
        assert_eq!(none.path, None);
        assert_eq!(none.searched.len(), LIBRARY_DIRS.len());
        assert!(
            none.describe().contains(&format!("{}/usr/lib64/{LIBRARY_NAME}", root.display())),
            "{}",
            none.describe()
        );
        std::fs::write(rhel.join(LIBRARY_NAME), b"").unwrap();
        assert_eq!(Library::resolve(None, Some(&root)).path, Some(rhel.join(LIBRARY_NAME)));
        // Debian's directory comes first when both exist.
        let debian = root.join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&debian).unwrap();
        std::fs::write(debian.join(LIBRARY_NAME), b"").unwrap();
        assert_eq!(Library::resolve(None, Some(&root)).path, Some(debian.join(LIBRARY_NAME)));
        assert_eq!(Library::resolve(None, None), Library::default());
        assert_eq!(Library::default().describe(), format!("{LIBRARY_NAME} on the loader's search path"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_mapped_library_is_read_from_proc_maps() {
        let maps = "7f1c2a000000-7f1c2a100000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f1c2b000000-7f1c2b200000 r-xp 00000000 08:01 5678 /driver-root/usr/lib64/libnvidia-ml.so.570.124.06\n";
        assert_eq!(mapped_library(maps), Some("/driver-root/usr/lib64/libnvidia-ml.so.570.124.06"));
        assert_eq!(mapped_library("00-01 r-xp 0 0:0 0 [vdso]\n"), None);
    }

    #[tokio::test]
    async fn discovery_reports_gpus_or_a_clear_no_driver_state() {
        let inv = NvmlDiscovery::new(Metrics::default(), Library::default());
        match Nvml::init() {
            // A GPU machine: discovery must work and name every GPU.
            Ok(_) => {
                let got = inv.discover().await.unwrap();
                assert!(!got.driver_version.is_empty());
                assert!(got.gpus.iter().all(|g| g.uuid.starts_with("GPU-")));
            }
            // The usual CI machine: no driver is an error state, not a crash.
            Err(_) => {
                assert!(inv.nvml().is_none());
                let err = inv.discover().await.unwrap_err();
                assert!(matches!(err, Error::NoDriver(_)), "{err}");
                assert!(err.to_string().starts_with("no NVIDIA driver"));
                assert!(err.is_transient());
            }
        }
    }
}
