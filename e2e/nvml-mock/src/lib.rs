//! `libnvidia-ml.so.1` for machines without a GPU: the NVML C functions the agent's discovery and
//! health watch call, answered from an inventory file instead of a driver. Only the GPU is fake:
//! the callers load this library as they load NVIDIA's and call it through the same C ABI.
//!
//! The inventory is JSON ([`inventory::Inventory`]): `$SWITCHYARD_NVML_MOCK_INVENTORY`, else
//! `nvml-mock.json` beside the library (so a driver root laid out with the library in it carries
//! its node's GPUs). A missing or invalid inventory makes `nvmlInit` fail with
//! `NVML_ERROR_DRIVER_NOT_LOADED`, as a host without a driver does.
//!
//! Faults are JSON lines appended to the faults file (`<inventory>.faults` unless the inventory
//! names one): `{"uuid": "GPU-…", "kind": "xid", "xid": 79}`, `ecc-dbe`, `lost`, `recover`. An
//! XID or ECC fault is delivered once through `nvmlEventSetWait` to the event sets registered for
//! its device; a lost GPU answers `NVML_ERROR_GPU_IS_LOST` until it recovers. A process that loads
//! the library after a fault was raised finds its state (a GPU still lost, the ECC count) but not
//! its event, as a process started on a real node after the fault would.
//!
//! Why a Rust `cdylib` and not Go's `-buildmode=c-shared`: NVIDIA's callers are Go programs, and
//! a c-shared Go library brings a second Go runtime into them (signal handlers, thread state),
//! which Go does not support; a library with no runtime loads into Go and Rust callers alike.
//! Every function answers as NVML documents for the state the inventory describes. Every other
//! function NVML's header declares is exported too, answering `NVML_ERROR_NOT_SUPPORTED`
//! (`stubs.rs`, written by `e2e/hack/gen-nvml-stubs.sh`): NVIDIA's Go callers bind them all, and
//! calling one the library lacks would abort them.

#![allow(non_snake_case)]

pub mod inventory;
pub mod mig;

use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use inventory::{FaultKind, Inventory};
use nvml_wrapper_sys::bindings::{
    nvmlComputeInstance_t, nvmlComputeInstanceInfo_t, nvmlComputeInstancePlacement_t,
    nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlDeviceAttributes_t, nvmlEventData_t, nvmlEventSet_t,
    nvmlGpuInstance_t, nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
    nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t,
};

type Ret = c_uint;
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const DRIVER_NOT_LOADED: Ret = 9;
const TIMEOUT: Ret = 10;
const GPU_IS_LOST: Ret = 15;

const EVENT_ECC_DBE: u64 = 2;
const EVENT_XID: u64 = 8;

/// The environment variable that names the inventory file.
pub const INVENTORY_ENV: &str = "SWITCHYARD_NVML_MOCK_INVENTORY";
/// The inventory's file name beside the library, where the variable is not set.
pub const INVENTORY_FILE: &str = "nvml-mock.json";

/// What a handle points at: a GPU, or one of its MIG devices.
struct Handle {
    gpu: usize,
    mig: Option<usize>,
}

/// A delivered-once event.
struct Pending {
    gpu: usize,
    kind: u64,
    data: u64,
}

struct State {
    inv: Inventory,
    /// One per GPU, then one per MIG device; leaked, so their addresses stay valid as handles.
    handles: &'static [Handle],
    faults: PathBuf,
    faults_read: u64,
    lost: Vec<bool>,
    ecc_dbe: Vec<u64>,
    pending: VecDeque<Pending>,
    /// A loss not yet answered by an event wait.
    lost_news: bool,
    inits: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// An event set: the devices registered on it and for which event types.
struct EventSet {
    registered: Vec<(usize, u64)>,
}

fn inventory_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(INVENTORY_ENV) {
        return Some(PathBuf::from(p));
    }
    // Beside this library: dladdr of one of its own functions gives its file.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(nvmlInit_v2 as *const libc::c_void, &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path owned by the loader.
    let lib = PathBuf::from(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned());
    Some(lib.parent()?.join(INVENTORY_FILE))
}

fn load() -> Result<State, String> {
    let path = inventory_path().ok_or("no inventory path")?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let inv = Inventory::parse(&text)?;
    let faults = inv
        .faults_file
        .as_ref()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("{}.faults", path.display())));
    let mut handles = Vec::new();
    for (i, _) in inv.gpus.iter().enumerate() {
        handles.push(Handle { gpu: i, mig: None });
    }
    for (i, g) in inv.gpus.iter().enumerate() {
        for j in 0..g.mig.len() {
            handles.push(Handle { gpu: i, mig: Some(j) });
        }
    }
    let n = inv.gpus.len();
    let mut state = State {
        inv,
        handles: Box::leak(handles.into_boxed_slice()),
        faults,
        faults_read: 0,
        lost: vec![false; n],
        ecc_dbe: vec![0; n],
        pending: VecDeque::new(),
        lost_news: false,
        inits: 0,
    };
    // Faults raised before this process started have happened already: a GPU lost then is lost
    // now (until a recover line), and its ECC counter counts, but their events are past.
    state.apply_faults(false);
    Ok(state)
}

impl State {
    fn handle(&self, h: nvmlDevice_t) -> Option<&'static Handle> {
        let handles = self.handles;
        handles.iter().find(|x| std::ptr::eq(*x as *const Handle, h as *const Handle))
    }

    fn ptr(&self, gpu: usize, mig: Option<usize>) -> nvmlDevice_t {
        let h = self.handles.iter().find(|x| x.gpu == gpu && x.mig == mig).expect("a handle for each device");
        h as *const Handle as nvmlDevice_t
    }

    /// Applies the faults appended since the last read, their events included.
    fn refresh(&mut self) {
        self.apply_faults(true);
    }

    /// Applies the faults appended since the last read; `deliver`: queue their events (XID, ECC)
    /// and wake event waits for a lost GPU.
    fn apply_faults(&mut self, deliver: bool) {
        let Ok(mut f) = std::fs::File::open(&self.faults) else { return };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.faults_read {
            self.faults_read = 0; // truncated: start over
        }
        if len == self.faults_read || f.seek(SeekFrom::Start(self.faults_read)).is_err() {
            return;
        }
        let mut text = String::new();
        if f.read_to_string(&mut text).is_err() {
            return;
        }
        // Only whole lines: a writer may be mid-line.
        let Some(end) = text.rfind('\n') else { return };
        self.faults_read += end as u64 + 1;
        for line in text[..end].lines().map(str::trim).filter(|l| !l.is_empty()) {
            let Ok(fault) = serde_json::from_str::<inventory::Fault>(line) else { continue };
            let Some(gpu) = self.inv.gpus.iter().position(|g| g.uuid == fault.uuid) else { continue };
            match fault.kind {
                FaultKind::Xid if deliver => {
                    self.pending.push_back(Pending { gpu, kind: EVENT_XID, data: fault.xid })
                }
                FaultKind::Xid => {}
                FaultKind::EccDbe => {
                    self.ecc_dbe[gpu] += 1;
                    if deliver {
                        self.pending.push_back(Pending { gpu, kind: EVENT_ECC_DBE, data: 0 });
                    }
                }
                FaultKind::Lost => {
                    self.lost[gpu] = true;
                    self.lost_news |= deliver;
                }
                FaultKind::Recover => {
                    self.lost[gpu] = false;
                    self.ecc_dbe[gpu] = 0;
                }
            }
        }
    }
}

/// Runs `f` on the loaded state, or answers `NVML_ERROR_UNINITIALIZED`.
fn with<F: FnOnce(&mut State) -> Ret>(f: F) -> Ret {
    let Ok(mut guard) = STATE.lock() else { return UNINITIALIZED };
    match guard.as_mut() {
        Some(s) if s.inits > 0 => f(s),
        _ => UNINITIALIZED,
    }
}

/// Runs `f` on a device handle's GPU (and MIG device), with lost GPUs answering so.
fn with_device<F: FnOnce(&State, &inventory::Gpu, Option<&inventory::Mig>) -> Ret>(
    h: nvmlDevice_t,
    f: F,
) -> Ret {
    with(|s| {
        s.refresh();
        let Some(handle) = s.handle(h) else { return INVALID_ARGUMENT };
        if s.lost[handle.gpu] {
            return GPU_IS_LOST;
        }
        let gpu = &s.inv.gpus[handle.gpu];
        f(s, gpu, handle.mig.map(|m| &gpu.mig[m]))
    })
}

/// Runs `f` on a whole GPU in MIG mode (its index and inventory entry): a MIG device's handle, or a
/// GPU not in MIG mode, answers `NVML_ERROR_NOT_SUPPORTED`.
fn with_mig_gpu<F: FnOnce(&State, usize, &inventory::Gpu) -> Ret>(device: nvmlDevice_t, f: F) -> Ret {
    with_device(device, |s, g, mig| {
        if mig.is_some() || !g.mig_enabled {
            return NOT_SUPPORTED;
        }
        match s.handle(device) {
            Some(h) => f(s, h.gpu, g),
            None => INVALID_ARGUMENT,
        }
    })
}

/// Copies `value` with its NUL into `buf` of `len` bytes.
unsafe fn put_str(value: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = value.as_bytes();
    if bytes.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller gives `len` writable bytes at `buf`; we write bytes.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

/// Writes `value` through `out`, or answers `NVML_ERROR_INVALID_ARGUMENT` for a null pointer.
unsafe fn put<T>(out: *mut T, value: T) -> Ret {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a valid, aligned pointer to a T.
    unsafe { out.write(value) };
    SUCCESS
}

// ---- init and system ----

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Ret {
    let Ok(mut guard) = STATE.lock() else { return UNINITIALIZED };
    // The first init, or the first after the last shutdown, reads the inventory again: the
    // driver may have come or gone meanwhile.
    if guard.as_ref().is_none_or(|s| s.inits == 0) {
        match load() {
            Ok(s) => *guard = Some(s),
            Err(e) => {
                *guard = None;
                eprintln!("nvml-mock: {e}");
                return DRIVER_NOT_LOADED;
            }
        }
    }
    if let Some(s) = guard.as_mut() {
        s.inits += 1;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> Ret {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Ret {
    with(|s| {
        s.inits -= 1;
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        TIMEOUT => c"Timeout",
        GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// # Safety
/// `version` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    with(|s| unsafe { put_str(&s.inv.driver_version, version, length) })
}

/// # Safety
/// `version` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with(|s| unsafe { put_str(&s.inv.nvml_version, version, length) })
}

/// # Safety
/// `version` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    with(|s| unsafe { put(version, s.inv.cuda_driver_version) })
}

/// # Safety
/// `version` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

// ---- devices ----

/// # Safety
/// `count` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    with(|s| unsafe { put(count, s.inv.gpus.len() as c_uint) })
}

/// # Safety
/// `count` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    unsafe { nvmlDeviceGetCount_v2(count) }
}

/// # Safety
/// `device` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    with(|s| {
        s.refresh();
        let i = index as usize;
        if i >= s.inv.gpus.len() {
            return INVALID_ARGUMENT;
        }
        if s.lost[i] {
            return GPU_IS_LOST;
        }
        unsafe { put(device, s.ptr(i, None)) }
    })
}

/// # Safety
/// `device` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// # Safety
/// `uuid` is NUL-terminated; `device` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    if uuid.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let wanted = unsafe { CStr::from_ptr(uuid) }.to_string_lossy().into_owned();
    with(|s| {
        s.refresh();
        for (i, g) in s.inv.gpus.iter().enumerate() {
            let mig = g.mig.iter().position(|m| m.uuid == wanted);
            if g.uuid == wanted || mig.is_some() {
                if s.lost[i] {
                    return GPU_IS_LOST;
                }
                return unsafe { put(device, s.ptr(i, mig)) };
            }
        }
        NOT_FOUND
    })
}

/// # Safety
/// `minor` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> Ret {
    with_device(device, |s, g, mig| match mig {
        Some(_) => NOT_SUPPORTED,
        None => {
            let index = s.inv.gpus.iter().position(|x| x.uuid == g.uuid).unwrap_or(0) as c_uint;
            unsafe { put(minor, g.minor.unwrap_or(index)) }
        }
    })
}

/// # Safety
/// `index` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    // NVML's enumeration index of a GPU; a MIG device has none of its own.
    with_device(device, |s, g, mig| match mig {
        Some(_) => INVALID_ARGUMENT,
        None => match s.inv.gpus.iter().position(|x| x.uuid == g.uuid) {
            Some(i) => unsafe { put(index, i as c_uint) },
            None => NOT_FOUND,
        },
    })
}

/// # Safety
/// `name` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> Ret {
    with_device(device, |_, g, mig| {
        let value = match mig {
            Some(m) => format!("{} MIG {}", g.name, m.profile),
            None => g.name.clone(),
        };
        unsafe { put_str(&value, name, length) }
    })
}

/// # Safety
/// `uuid` points to `length` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> Ret {
    with_device(device, |_, g, mig| unsafe { put_str(mig.map_or(&g.uuid, |m| &m.uuid), uuid, length) })
}

/// # Safety
/// `memory` is a valid pointer to an `nvmlMemory_v2_t` whose `version` the caller set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> Ret {
    with_device(device, |_, g, mig| {
        let total = mig.map_or(g.memory_bytes, |m| m.memory_bytes);
        let version = if memory.is_null() { 0 } else { unsafe { (*memory).version } };
        unsafe { put(memory, nvmlMemory_v2_t { version, total, reserved: 0, free: total, used: 0 }) }
    })
}

/// # Safety
/// `memory` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> Ret {
    with_device(device, |_, g, mig| {
        let total = mig.map_or(g.memory_bytes, |m| m.memory_bytes);
        unsafe { put(memory, nvmlMemory_t { total, free: total, used: 0 }) }
    })
}

/// # Safety
/// `pci` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> Ret {
    with_device(device, |_, g, _| {
        let Some(bus_id) = &g.pci_bus_id else { return NOT_SUPPORTED };
        // `0000:18:00.0`: domain, bus, device.
        let parts: Vec<u32> =
            bus_id.split([':', '.']).map(|p| u32::from_str_radix(p, 16).unwrap_or(0)).collect();
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        info.domain = parts.first().copied().unwrap_or(0);
        info.bus = parts.get(1).copied().unwrap_or(0);
        info.device = parts.get(2).copied().unwrap_or(0);
        // NVML's busId is `00000000:18:00.0` (an 8-digit domain).
        let long = format!(
            "{:08X}:{:02X}:{:02X}.{}",
            info.domain,
            info.bus,
            info.device,
            parts.get(3).copied().unwrap_or(0)
        );
        for (dst, src) in info.busId.iter_mut().zip(long.bytes()) {
            *dst = src as c_char;
        }
        for (dst, src) in info.busIdLegacy.iter_mut().take(15).zip(long.bytes().skip(4)) {
            *dst = src as c_char;
        }
        unsafe { put(pci, info) }
    })
}

/// # Safety
/// `node` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, node: *mut c_uint) -> Ret {
    with_device(device, |_, g, _| match g.numa_node {
        Some(n) => unsafe { put(node, n) },
        None => NOT_SUPPORTED,
    })
}

/// NVML's `nvmlGpuTopologyLevel_t`: the nearest common ancestor of two GPUs.
const TOPOLOGY_INTERNAL: c_uint = 0;
const TOPOLOGY_NODE: c_uint = 40;
const TOPOLOGY_SYSTEM: c_uint = 50;

/// The path between two GPUs, from their NUMA nodes: the same GPU is `INTERNAL`, two GPUs on one
/// NUMA node share a CPU (`NODE`), any others cross the CPU interconnect (`SYSTEM`). NVIDIA's
/// device plugin asks this of every pair before it prefers an allocation (go-gpuallocator).
///
/// # Safety
/// `level` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    level: *mut c_uint,
) -> Ret {
    with(|s| {
        s.refresh();
        let (Some(a), Some(b)) = (s.handle(device1), s.handle(device2)) else { return INVALID_ARGUMENT };
        if a.mig.is_some() || b.mig.is_some() {
            return NOT_SUPPORTED;
        }
        if s.lost[a.gpu] || s.lost[b.gpu] {
            return GPU_IS_LOST;
        }
        let numa = |i: usize| s.inv.gpus[i].numa_node;
        let answer = if a.gpu == b.gpu {
            TOPOLOGY_INTERNAL
        } else if numa(a.gpu).is_some() && numa(a.gpu) == numa(b.gpu) {
            TOPOLOGY_NODE
        } else {
            TOPOLOGY_SYSTEM
        };
        unsafe { put(level, answer) }
    })
}

/// # Safety
/// `brand` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: nvmlDevice_t, brand: *mut c_uint) -> Ret {
    with_device(device, |_, g, _| unsafe { put(brand, g.brand) })
}

/// # Safety
/// `arch` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) -> Ret {
    with_device(device, |_, g, _| unsafe { put(arch, g.architecture) })
}

/// # Safety
/// `major` and `minor` are valid pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    with_device(device, |_, g, _| {
        let r = unsafe { put(major, g.compute_capability.0) };
        if r != SUCCESS { r } else { unsafe { put(minor, g.compute_capability.1) } }
    })
}

/// # Safety
/// `current` and `pending` are valid pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with_device(device, |_, g, mig| {
        if mig.is_some() {
            return NOT_SUPPORTED;
        }
        let mode = c_uint::from(g.mig_enabled);
        let r = unsafe { put(current, mode) };
        if r != SUCCESS { r } else { unsafe { put(pending, mode) } }
    })
}

/// # Safety
/// `count` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) -> Ret {
    with_device(device, |_, g, mig| match (mig, g.mig_enabled) {
        (None, true) => unsafe { put(count, g.mig.len() as c_uint) },
        _ => NOT_SUPPORTED,
    })
}

/// # Safety
/// `mig_device` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> Ret {
    with_mig_gpu(device, |s, gpu, g| {
        if index as usize >= g.mig.len() {
            return NOT_FOUND;
        }
        unsafe { put(mig_device, s.ptr(gpu, Some(index as usize))) }
    })
}

/// # Safety
/// `is_mig` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) -> Ret {
    with(|s| match s.handle(device) {
        Some(h) => unsafe { put(is_mig, c_uint::from(h.mig.is_some())) },
        None => INVALID_ARGUMENT,
    })
}

/// # Safety
/// `parent` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    device: nvmlDevice_t,
    parent: *mut nvmlDevice_t,
) -> Ret {
    with(|s| match s.handle(device) {
        Some(h) if h.mig.is_some() => unsafe { put(parent, s.ptr(h.gpu, None)) },
        Some(_) => INVALID_ARGUMENT,
        None => INVALID_ARGUMENT,
    })
}

/// # Safety
/// `attributes` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> Ret {
    with_device(device, |_, g, mig| {
        let Some(m) = mig else { return NOT_SUPPORTED };
        let mut a: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
        a.multiprocessorCount = m.multiprocessors;
        a.gpuInstanceSliceCount = m.gpu_instance_slices;
        a.computeInstanceSliceCount = m.gpu_instance_slices;
        a.memorySizeMB = m.memory_bytes >> 20;
        let _ = g;
        unsafe { put(attributes, a) }
    })
}

/// # Safety
/// `id` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    with_device(device, |_, _, mig| match mig {
        Some(m) => unsafe { put(id, m.gpu_instance_id) },
        None => NOT_SUPPORTED,
    })
}

/// # Safety
/// `id` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) -> Ret {
    with_device(device, |_, _, mig| match mig {
        Some(m) => unsafe { put(id, m.compute_instance_id) },
        None => NOT_SUPPORTED,
    })
}

// ---- MIG: GPU instances and compute instances ----
//
// A GPU in MIG mode answers an H100 80GB's GPU instance profiles and their possible placements
// (`mig::H100_80GB`), whatever instances it holds. Each MIG device of the inventory is one GPU
// instance, at the placement `mig::place` gave it, holding one compute instance that spans it; the
// instance handles are the MIG device's handle. This is what go-nvlib's MIG profile lookup walks
// (GPU Feature Discovery's MIG labels) and what NVIDIA's DRA driver reads to publish MIG devices:
// the profiles and their placements, the instance by id, its info, then the profiles until one
// matches.

/// Runs `f` on the MIG device an instance handle names.
fn with_instance<F: FnOnce(&State, &inventory::Gpu, &inventory::Mig, nvmlDevice_t) -> Ret>(
    instance: nvmlDevice_t,
    f: F,
) -> Ret {
    with_device(instance, |s, g, mig| match (mig, s.handle(instance)) {
        (Some(m), Some(h)) => f(s, g, m, s.ptr(h.gpu, None)),
        _ => INVALID_ARGUMENT,
    })
}

/// Writes `items` to the caller's array of `*count` entries (NULL: only their number), as NVML's
/// list calls do.
unsafe fn put_list<T: Copy>(items: &[T], out: *mut T, count: *mut c_uint) -> Ret {
    if count.is_null() {
        return INVALID_ARGUMENT;
    }
    let n = items.len() as c_uint;
    if !out.is_null() {
        // SAFETY: NVML's contract: `out` holds as many entries as the profile can have.
        unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), out, items.len()) };
    }
    unsafe { put(count, n) }
}

/// # Safety
/// `gpu_instance` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gpu_instance: *mut nvmlGpuInstance_t,
) -> Ret {
    with_mig_gpu(device, |s, gpu, g| match g.mig.iter().position(|m| m.gpu_instance_id == id) {
        Some(j) => unsafe { put(gpu_instance, s.ptr(gpu, Some(j)) as nvmlGpuInstance_t) },
        None => NOT_FOUND,
    })
}

/// The GPU instances of the profile `profile_id` (an id, not an index).
///
/// # Safety
/// `count` is a valid pointer; `gpu_instances` is NULL or holds the profile's instance count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gpu_instances: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> Ret {
    with_mig_gpu(device, |s, gpu, g| {
        let Some(p) = mig::by_id(profile_id) else { return INVALID_ARGUMENT };
        let of_profile: Vec<nvmlGpuInstance_t> = (0..g.mig.len())
            .filter(|&j| mig::of(&g.mig[j]).id == p.id)
            .map(|j| s.ptr(gpu, Some(j)) as nvmlGpuInstance_t)
            .collect();
        unsafe { put_list(&of_profile, gpu_instances, count) }
    })
}

/// Where an instance of the profile `profile_id` may be created: every placement an H100 80GB
/// has for it, taken or not.
///
/// # Safety
/// `count` is a valid pointer; `placements` is NULL or holds as many as the profile has.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    with_mig_gpu(device, |_, _, _| {
        let Some(p) = mig::by_id(profile_id) else { return INVALID_ARGUMENT };
        let all: Vec<nvmlGpuInstancePlacement_t> =
            p.starts.iter().map(|&start| nvmlGpuInstancePlacement_t { start, size: p.size }).collect();
        unsafe { put_list(&all, placements, count) }
    })
}

/// # Safety
/// As [`nvmlDeviceGetGpuInstancePossiblePlacements_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> Ret {
    unsafe { nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profile_id, placements, count) }
}

/// # Safety
/// `info` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> Ret {
    with_instance(gpu_instance as nvmlDevice_t, |_, _, m, parent| {
        let p = mig::of(m);
        let start = m.placement_start.unwrap_or_default();
        let value = nvmlGpuInstanceInfo_t {
            device: parent,
            id: m.gpu_instance_id,
            profileId: p.id,
            placement: nvmlGpuInstancePlacement_t { start, size: p.size },
        };
        unsafe { put(info, value) }
    })
}

/// # Safety
/// `compute_instance` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: nvmlGpuInstance_t,
    id: c_uint,
    compute_instance: *mut nvmlComputeInstance_t,
) -> Ret {
    with_instance(gpu_instance as nvmlDevice_t, |_, _, m, _| {
        if m.compute_instance_id != id {
            return NOT_FOUND;
        }
        unsafe { put(compute_instance, gpu_instance as nvmlComputeInstance_t) }
    })
}

/// The compute instances of a GPU instance with the compute profile `profile_id`: its one, when
/// that spans the instance.
///
/// # Safety
/// `count` is a valid pointer; `compute_instances` is NULL or holds one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: nvmlGpuInstance_t,
    profile_id: c_uint,
    compute_instances: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> Ret {
    with_instance(gpu_instance as nvmlDevice_t, |_, _, m, _| {
        if profile_id >= mig::COMPUTE_INSTANCE_PROFILE_COUNT {
            return INVALID_ARGUMENT;
        }
        let spans = mig::compute_profile_index(m.gpu_instance_slices) == Some(profile_id);
        let mine = [gpu_instance as nvmlComputeInstance_t];
        unsafe { put_list(if spans { &mine[..] } else { &[] }, compute_instances, count) }
    })
}

/// # Safety
/// `info` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    with_instance(compute_instance as nvmlDevice_t, |_, _, m, parent| {
        let Some(profile) = mig::compute_profile_index(m.gpu_instance_slices) else { return NOT_SUPPORTED };
        let value = nvmlComputeInstanceInfo_t {
            device: parent,
            gpuInstance: compute_instance as nvmlGpuInstance_t,
            id: m.compute_instance_id,
            profileId: profile,
            placement: nvmlComputeInstancePlacement_t { start: 0, size: m.gpu_instance_slices },
        };
        unsafe { put(info, value) }
    })
}

/// # Safety
/// `info` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> Ret {
    unsafe { nvmlComputeInstanceGetInfo_v2(compute_instance, info) }
}

/// A GPU instance profile of a GPU in MIG mode, by NVML's index: an H100 80GB's, whether or not
/// an instance of it exists.
///
/// # Safety
/// `info` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> Ret {
    with_device(device, |_, g, mig| {
        if mig.is_some() || !g.mig_enabled {
            return NOT_SUPPORTED;
        }
        if profile >= mig::GPU_INSTANCE_PROFILE_COUNT {
            return INVALID_ARGUMENT;
        }
        let Some(p) = mig::by_index(profile) else { return NOT_SUPPORTED };
        let mut value: nvmlGpuInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        value.id = p.id;
        value.sliceCount = p.slices;
        value.instanceCount = p.instances;
        value.multiprocessorCount = p.multiprocessors;
        value.copyEngineCount = p.copy_engines;
        value.decoderCount = p.decoders;
        value.jpegCount = p.jpegs;
        value.ofaCount = p.ofas;
        value.memorySizeMB = p.memory_mb;
        unsafe { put(info, value) }
    })
}

/// The one compute instance profile of a GPU instance: the whole instance, shared engines.
///
/// # Safety
/// `info` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: nvmlGpuInstance_t,
    profile: c_uint,
    engine_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> Ret {
    with_instance(gpu_instance as nvmlDevice_t, |_, _, m, _| {
        if profile >= mig::COMPUTE_INSTANCE_PROFILE_COUNT {
            return INVALID_ARGUMENT;
        }
        if engine_profile != 0 || mig::compute_profile_index(m.gpu_instance_slices) != Some(profile) {
            return NOT_SUPPORTED;
        }
        let p = mig::of(m);
        let mut value: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        value.id = profile;
        value.sliceCount = m.gpu_instance_slices;
        value.instanceCount = 1;
        value.multiprocessorCount = p.multiprocessors;
        value.sharedCopyEngineCount = p.copy_engines;
        value.sharedDecoderCount = p.decoders;
        value.sharedJpegCount = p.jpegs;
        value.sharedOfaCount = p.ofas;
        unsafe { put(info, value) }
    })
}

/// # Safety
/// `count` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: c_uint,
    _counter_type: c_uint,
    count: *mut c_ulonglong,
) -> Ret {
    with(|s| {
        s.refresh();
        let Some(h) = s.handle(device) else { return INVALID_ARGUMENT };
        if s.lost[h.gpu] {
            return GPU_IS_LOST;
        }
        // NVML_MEMORY_ERROR_TYPE_UNCORRECTED is 1; corrected errors are never raised here.
        let n = if error_type == 1 { s.ecc_dbe[h.gpu] } else { 0 };
        unsafe { put(count, n) }
    })
}

// ---- events ----

/// # Safety
/// `types` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    with_device(device, |_, _, _| unsafe { put(types, EVENT_XID | EVENT_ECC_DBE) })
}

/// # Safety
/// `set` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    with(|_| {
        let boxed = Box::new(EventSet { registered: Vec::new() });
        unsafe { put(set, Box::into_raw(boxed) as nvmlEventSet_t) }
    })
}

/// # Safety
/// `set` came from [`nvmlEventSetCreate`] and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    with(|s| {
        let Some(h) = s.handle(device) else { return INVALID_ARGUMENT };
        if types & !(EVENT_XID | EVENT_ECC_DBE) != 0 {
            return NOT_SUPPORTED;
        }
        // SAFETY: `set` is a live EventSet (the caller's contract).
        unsafe { (*(set as *mut EventSet)).registered.push((h.gpu, types)) };
        SUCCESS
    })
}

/// # Safety
/// `set` came from [`nvmlEventSetCreate`] and was not freed; `data` is a valid pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    if set.is_null() || data.is_null() {
        return INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    loop {
        let r = with(|s| {
            s.refresh();
            if s.lost_news {
                s.lost_news = false;
                return GPU_IS_LOST;
            }
            // SAFETY: `set` is a live EventSet.
            let registered = unsafe { &(*(set as *const EventSet)).registered };
            let wanted = |p: &Pending| registered.iter().any(|(g, t)| *g == p.gpu && t & p.kind != 0);
            let Some(i) = s.pending.iter().position(wanted) else { return TIMEOUT };
            let p = s.pending.remove(i).expect("the position found");
            let event = nvmlEventData_t {
                device: s.ptr(p.gpu, None),
                eventType: p.kind,
                eventData: p.data,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            };
            unsafe { put(data, event) }
        });
        if r != TIMEOUT || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20).min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// # Safety
/// As [`nvmlEventSetWait_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    unsafe { nvmlEventSetWait_v2(set, data, timeout_ms) }
}

/// # Safety
/// `set` came from [`nvmlEventSetCreate`] and is not used after.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: `set` was made by Box::into_raw in nvmlEventSetCreate.
    drop(unsafe { Box::from_raw(set as *mut EventSet) });
    SUCCESS
}

// ---- everything else ----

/// Exports each named NVML function answering `NVML_ERROR_NOT_SUPPORTED`, as NVML does for a
/// feature a GPU lacks. Each NVML function returns `nvmlReturn_t`; on the C ABIs NVML ships for
/// (x86-64 and AArch64 System V), the caller passes and cleans up the arguments, so one that takes
/// none can answer a call with any.
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> Ret {
                NOT_SUPPORTED
            }
        )*
    };
}

include!("stubs.rs");
