//! `switchyard inventory`: who reads GPU capacity the device-plugin way.

use std::fmt::Write as _;

use kube::Client;
use serde::Serialize;

use super::{EXIT_FINDINGS, InventoryArgs, Output};
use switchyard_operator::pool::readers::{self, Finding, Severity, Target};
use switchyard_operator::reads::reader_objects::Scope;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Report<'a> {
    resources: Vec<String>,
    pool_nodes: usize,
    summary: String,
    findings: &'a [Finding],
    skipped: &'a [String],
}

/// Runs the inventory; exits [`EXIT_FINDINGS`] when a finding is critical.
pub async fn run(client: Client, args: &InventoryArgs) -> anyhow::Result<u8> {
    let observed = super::gather::inventory_observed(
        &client,
        args.migration.as_deref(),
        &args.resources,
        &args.device_class,
        Scope { config_maps: args.scan_config_maps, ..Default::default() },
    )
    .await?;
    let findings = readers::find(&observed);
    let report = Report {
        resources: observed.targets.iter().map(describe_target).collect(),
        pool_nodes: observed.pool_nodes.len(),
        summary: readers::summary(&findings),
        findings: &findings,
        skipped: &observed.skipped,
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Human => print!("{}", render(&report)),
    }
    Ok(if findings.iter().any(|f| f.severity == Severity::Critical) { EXIT_FINDINGS } else { 0 })
}

fn describe_target(t: &Target) -> String {
    format!("{} (DeviceClass {})", t.extended_resource_name, t.device_class_name)
}

/// The findings as text, most severe first; shared with `plan`.
pub fn render_findings(out: &mut String, findings: &[Finding], skipped: &[String]) {
    for f in findings {
        let _ = writeln!(out, "  {:<8}  {} {}", f.severity.to_string().to_uppercase(), f.kind, f.object);
        let _ = writeln!(out, "            {}", f.message);
        let _ = writeln!(out, "            what to do: {}", f.advice);
    }
    if !skipped.is_empty() {
        let _ = writeln!(out, "  not checked: {}", skipped.join("; "));
    }
}

fn render(r: &Report<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Capacity readers for {} across {} pool node(s): {}",
        r.resources.join(", "),
        r.pool_nodes,
        r.summary
    );
    render_findings(&mut out, r.findings, r.skipped);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_output_lists_severity_object_message_and_advice() {
        let findings = vec![Finding {
            severity: Severity::Warning,
            kind: "ResourceQuota".into(),
            object: "team-a/gpus".into(),
            message: "charges twice".into(),
            advice: "keep one".into(),
        }];
        let skipped = vec!["Kueue: CRDs not installed".to_string()];
        let text = render(&Report {
            resources: vec!["nvidia.com/gpu (DeviceClass gpu.switchyard.dev)".into()],
            pool_nodes: 6,
            summary: readers::summary(&findings),
            findings: &findings,
            skipped: &skipped,
        });
        assert_eq!(
            text,
            "Capacity readers for nvidia.com/gpu (DeviceClass gpu.switchyard.dev) across 6 pool node(s): 1 finding(s): 1 warning\n\
             \x20 WARNING   ResourceQuota team-a/gpus\n\
             \x20           charges twice\n\
             \x20           what to do: keep one\n\
             \x20 not checked: Kueue: CRDs not installed\n"
        );
    }
}
