//! Compiles the kubelet plugin protocols (proto/) into tonic clients and servers. protoc comes from
//! the protoc-bin-vendored crate, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: nothing else runs in this build script yet, so no thread can read the environment
    // while it changes.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/pluginregistration/v1/api.proto", "proto/dra/v1/api.proto"], &["proto"])?;
    Ok(())
}
