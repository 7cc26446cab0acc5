//! `nvidia-smi` of the mock driver root: the two questions NVIDIA's components ask of it, answered
//! through NVML from the library beside it, as the driver's own tool answers them. NVIDIA's DRA
//! driver runs `nvidia-smi --version` (with the driver root's `libnvidia-ml.so.1` preloaded) to
//! decide that the driver root holds a working driver before its kubelet plugin starts.
//!
//!   nvidia-smi --version    the nvidia-smi, NVML, driver and CUDA versions
//!   nvidia-smi -L           one line per GPU: index, product name, UUID
//!
//! The library is `../lib64/libnvidia-ml.so.1` from this binary (a driver root's `usr/bin` and
//! `usr/lib64`), else `libnvidia-ml.so.1` from the loader's path. Exit status 0 on success; 9 when
//! NVML cannot initialize, as `nvidia-smi` exits without a driver; 2 for anything else asked.
//!
//! Every call is recorded, one line each, in `../lib64/nvidia-smi.calls` beside the library
//! (`answered --version`, `refused compute-policy -i GPU-... --set-timeslice 1`), where the driver
//! root is writable to the caller (NVIDIA's GPU kubelet plugin mounts it so): an e2e scenario
//! reads it from the node's driver root to see what NVIDIA's prepare path asked.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use nvml_wrapper::Nvml;

const NO_DRIVER: u8 = 9;

/// `usr/lib64` of the driver root this binary lies in, where it does.
fn lib_dir() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("lib64")))
        .filter(|d| d.is_dir())
}

/// Appends `<outcome> <args>` to the calls file; a driver root mounted read-only records nothing.
fn record(outcome: &str, args: &[String]) {
    use std::io::Write;
    let Some(dir) = lib_dir() else { return };
    let file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(CALLS));
    if let Ok(mut f) = file {
        let _ = writeln!(f, "{outcome} {}", args.join(" "));
    }
}

/// The calls file's name beside the library.
const CALLS: &str = "nvidia-smi.calls";

fn library() -> OsString {
    let beside = lib_dir().map(|d| d.join("libnvidia-ml.so.1")).filter(|p| p.exists());
    beside.map_or_else(|| "libnvidia-ml.so.1".into(), PathBuf::into_os_string)
}

fn cuda(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

fn run(nvml: &Nvml, arg: &str) -> Result<(), nvml_wrapper::error::NvmlError> {
    match arg {
        "--version" => {
            let driver = nvml.sys_driver_version()?;
            println!("NVIDIA-SMI version  : {driver}");
            println!("NVML version        : {}", nvml.sys_nvml_version()?);
            println!("DRIVER version      : {driver}");
            println!("CUDA Version        : {}", cuda(nvml.sys_cuda_driver_version()?));
        }
        _ => {
            for index in 0..nvml.device_count()? {
                let device = nvml.device_by_index(index)?;
                println!("GPU {index}: {} (UUID: {})", device.name()?, device.uuid()?);
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = args.first().cloned().unwrap_or_default();
    if !matches!(arg.as_str(), "--version" | "-L" | "--list-gpus") {
        record("refused", &args);
        eprintln!("nvidia-smi (NVML mock): only --version and -L are answered, not {args:?}");
        return ExitCode::from(2);
    }
    record("answered", &args);
    let nvml = match Nvml::builder().lib_path(&library()).init() {
        Ok(nvml) => nvml,
        Err(e) => {
            println!("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver: {e}");
            return ExitCode::from(NO_DRIVER);
        }
    };
    match run(&nvml, &arg) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvidia-smi (NVML mock): {e}");
            ExitCode::FAILURE
        }
    }
}
