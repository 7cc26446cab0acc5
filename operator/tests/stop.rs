//! The operator binary's stop on SIGTERM, as the kubelet sends it: the process ends promptly,
//! with status 0 and no panic, even when it never reached an API server.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A bound on a hang, not a measurement: the stop takes well under a second.
const STOP_BOUND: Duration = Duration::from_secs(30);

#[test]
fn sigterm_stops_the_operator_cleanly_before_it_ever_reached_the_api_server() {
    let dir = std::env::temp_dir().join(format!("switchyard-stop-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An API server address where nothing listens: every request is refused, so the migration
    // cache never syncs.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{port}', insecure-skip-tls-verify: true}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard-operator"))
        .env_clear()
        .env("KUBECONFIG", &kubeconfig)
        .env("SWITCHYARD_NO_LEADER_ELECTION", "true")
        .env("SWITCHYARD_METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Running: its health server is up, and its watches fail against the refused address.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut log = String::new();
    while !log.contains("serving /metrics") {
        assert!(out.read_line(&mut log).unwrap() > 0, "the operator exited before it ran:\n{log}");
    }
    let term = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(term.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > STOP_BOUND {
            child.kill().unwrap();
            panic!("the operator did not stop within {STOP_BOUND:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::io::Read::read_to_string(&mut out, &mut log).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "exit {status}\nstdout:\n{log}\nstderr:\n{err}");
    assert!(!err.contains("panicked") && !log.contains("panicked"), "stdout:\n{log}\nstderr:\n{err}");
    assert!(log.contains("stopping"), "the stop was not the operator's own:\n{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}
