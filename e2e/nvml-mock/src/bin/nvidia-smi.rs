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
//! NVML cannot initialize, as `nvidia-smi` exits without a driver.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use nvml_wrapper::Nvml;

const NO_DRIVER: u8 = 9;

fn library() -> OsString {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("lib64/libnvidia-ml.so.1")))
        .filter(|p| p.exists());
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
    let arg = std::env::args().nth(1).unwrap_or_default();
    if !matches!(arg.as_str(), "--version" | "-L" | "--list-gpus") {
        eprintln!("nvidia-smi (NVML mock): only --version and -L are answered, not {arg:?}");
        return ExitCode::from(2);
    }
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
