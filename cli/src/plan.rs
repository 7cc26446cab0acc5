//! `switchyard plan`: the preview of a migration, for people and for scripts.

use std::fmt::Write as _;

use anyhow::Context as _;
use kube::Client;
use kube::api::Api;

use super::{EXIT_FINDINGS, Output, PlanArgs};
use switchyard_operator::api::v1alpha1::GpuPoolMigration;
use switchyard_operator::node::record::state_str;
use switchyard_operator::pool::preview::{
    self, ClassAction, NodeAction, PlacementAction, PodFlag, Report, SelectorBasis,
};
use switchyard_operator::reads::reader_objects::Scope;

/// Prints the plan; exits [`EXIT_FINDINGS`] when something would block the migration.
pub async fn run(client: Client, args: &PlanArgs) -> anyhow::Result<u8> {
    let (gpm, exists) = match (&args.name, &args.filename) {
        (_, Some(path)) => {
            let manifest = super::gather::read_manifest(path)?;
            super::gather::dry_run_apply(&client, &manifest).await?
        }
        (Some(name), None) => {
            let got = Api::<GpuPoolMigration>::all(client.clone())
                .get_opt(name)
                .await
                .context("reading the GpuPoolMigration")?
                .with_context(|| format!("GpuPoolMigration {name} not found"))?;
            (got, true)
        }
        (None, None) => anyhow::bail!("name a GpuPoolMigration or pass -f <manifest>"),
    };
    let inputs = super::gather::plan_inputs(
        &client,
        &gpm,
        exists,
        Scope { config_maps: args.scan_config_maps, ..Default::default() },
    )
    .await?;
    let report = preview::build(&inputs).map_err(|m| anyhow::anyhow!("spec: {m}"))?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Human => print!("{}", render(&report)),
    }
    Ok(if report.blockers.is_empty() { 0 } else { EXIT_FINDINGS })
}

/// Left-aligned columns, two spaces apart.
fn table(out: &mut String, indent: &str, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let mut line = String::from(indent);
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

fn flag_text(f: &PodFlag) -> String {
    match f {
        PodFlag::PdbBlocks { pdb } => format!("PDB {pdb} allows no disruption now: the eviction waits"),
        PodFlag::NoController => "no controller: nothing recreates it".into(),
        PodFlag::EmptyDir { deleted: true } => "emptyDir: its data is deleted".into(),
        PodFlag::EmptyDir { deleted: false } => {
            "emptyDir: the drain waits for it (set strategy.drain.deleteEmptyDirData to evict)".into()
        }
        PodFlag::Terminating => "terminating: the drain waits for it".into(),
    }
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Plan for GpuPoolMigration {} ({}; nothing was changed): direction {:?}, maxUnavailable {}",
        r.migration,
        if r.exists { "exists" } else { "not applied yet" },
        r.direction,
        r.max_unavailable
    );

    let p = &r.prerequisites;
    let _ = writeln!(
        out,
        "\nPREREQUISITES  {} ({}): {}",
        if p.met { "met" } else { "NOT MET" },
        p.reason,
        p.message
    );
    let _ = writeln!(out, "  control plane: {}", p.control_plane.join("; "));
    for w in &p.warnings {
        let _ = writeln!(out, "  warning: {w}");
    }

    render_nodes(&mut out, r);

    render_replace(&mut out, r);

    render_classes(&mut out, r);

    render_placement(&mut out, r);

    let _ = writeln!(out, "\nINVENTORY  {}", r.inventory.summary);
    super::inventory::render_findings(&mut out, &r.inventory.findings, &r.inventory.skipped);

    if r.blockers.is_empty() {
        let _ = writeln!(out, "\nREADY: nothing blocks this migration.");
    } else {
        let _ = writeln!(out, "\nBLOCKED:");
        for b in &r.blockers {
            let _ = writeln!(out, "  - {b}");
        }
    }
    out
}

/// `units` as `2 nvidia.com/gpu, 1 nvidia.com/mig-1g.10gb`, or `nothing`.
fn units(d: &std::collections::BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = d.iter().filter(|(_, n)| **n > 0).map(|(r, n)| format!("{n} {r}")).collect();
    if parts.is_empty() { "no GPU".into() } else { parts.join(", ") }
}

/// The TARGET POOL section of a Replace plan: its room, then each node's needs in order.
fn render_replace(out: &mut String, r: &Report) {
    let Some(p) = &r.replace else {
        return;
    };
    let rooms: Vec<String> = p
        .capacity
        .iter()
        .map(|c| format!("{}: {} device(s), {} free", c.resource, c.devices, c.free))
        .collect();
    let _ = writeln!(
        out,
        "\nTARGET POOL (strategy Replace)  {} Ready, schedulable node(s); {}; the nodes to move need {}",
        p.target_nodes,
        if rooms.is_empty() { "no resource".into() } else { rooms.join("; ") },
        units(&p.needed)
    );
    for n in &p.nodes {
        let verdict = if n.fits { "fits".to_string() } else { format!("waits: {}", n.short) };
        let _ = writeln!(out, "  {}  needs {}: {verdict}", n.name, units(&n.needs));
    }
}

/// The NODES section: the summary, one row a node, and the pods each node evicts.
fn render_nodes(out: &mut String, r: &Report) {
    let s = &r.summary;
    let _ = writeln!(
        out,
        "\nNODES  {} selected, {} to move in {} wave(s), {} GPU(s); {} pod(s) to evict ({} use GPUs), {} blocked by a PDB, {} without a controller, {} with emptyDir",
        s.nodes_selected,
        s.nodes_to_move,
        s.waves,
        s.gpus_to_move,
        s.pods_to_evict,
        s.gpu_pods_to_evict,
        s.pods_blocked_by_pdb,
        s.bare_pods,
        s.empty_dir_pods
    );
    let mut rows = vec![
        ["#", "WAVE", "NODE", "STATE", "BACKEND", "GPUS", "EVICT", "STAY", "NOTE"].map(String::from).to_vec(),
    ];
    for n in &r.nodes {
        let dash = || "-".to_string();
        let action = match n.action {
            NodeAction::Moves | NodeAction::InFlight => state_str(n.state),
            NodeAction::Done => "done".into(),
            NodeAction::Refused => "refused".into(),
            NodeAction::Failed => "failed".into(),
        };
        rows.push(vec![
            n.order.map(|o| o.to_string()).unwrap_or_else(dash),
            n.wave.map(|w| w.to_string()).unwrap_or_else(dash),
            n.name.clone(),
            action,
            n.backend.clone(),
            n.gpus.to_string(),
            n.evict.len().to_string(),
            n.stay.to_string(),
            n.note.clone(),
        ]);
    }
    table(out, "  ", &rows);
    for n in r.nodes.iter().filter(|n| !n.evict.is_empty()) {
        let _ = writeln!(out, "  {} evicts:", n.name);
        for pod in &n.evict {
            let mut notes: Vec<String> = pod.flags.iter().map(flag_text).collect();
            notes.insert(0, if pod.uses_gpu { "GPU".into() } else { "no GPU".into() });
            let _ = writeln!(out, "    {}/{}  [{}]", pod.namespace, pod.name, notes.join("; "));
        }
    }
}

/// The DEVICECLASSES section: what happens to each class, and what its selector selects.
fn render_classes(out: &mut String, r: &Report) {
    let _ = writeln!(out, "\nDEVICECLASSES");
    let mut rows = Vec::new();
    for c in &r.device_classes {
        let action = match c.action {
            ClassAction::Create => "create",
            ClassAction::Update => "update",
            ClassAction::Unchanged => "unchanged",
        };
        let verdict = if c.effective {
            "the scheduler will use it".to_string()
        } else if !c.shadowed_by.is_empty() {
            format!("SHADOWED by {}", c.shadowed_by)
        } else {
            "not effective".to_string()
        };
        let selects = match c.selector.checked_against {
            SelectorBasis::PublishedDevices => format!(
                "selects {} of {} device(s) published on {} node(s)",
                c.selector.selected, c.selector.devices, c.selector.nodes
            ),
            SelectorBasis::KnownAttributes => "selector checked against the driver's known attributes".into(),
            SelectorBasis::NotChecked => "selector not checked: the driver publishes no device yet".into(),
        };
        rows.push(vec![
            action.to_string(),
            c.name.clone(),
            c.extended_resource_name.clone(),
            verdict,
            selects,
        ]);
    }
    table(out, "  ", &rows);
    for c in &r.device_classes {
        for p in &c.selector.problems {
            let _ = writeln!(out, "  {}: {p}", c.name);
        }
    }
}

/// The PLACEMENT section: what each DaemonSet needs to keep to its backend.
fn render_placement(out: &mut String, r: &Report) {
    let _ = writeln!(out, "\nPLACEMENT");
    if r.placement.is_empty() && r.replace.is_some() {
        let _ = writeln!(
            out,
            "  nothing to place (strategy Replace): no DaemonSet is edited; the old nodes keep the device plugin, the target pool its DRA driver"
        );
    }
    for pl in &r.placement {
        let what = match pl.action {
            PlacementAction::AlreadyPlaced => "keeps to its backend already",
            PlacementAction::AddNodeAffinity => {
                "the operator adds this node affinity (placement: Managed); the template change restarts the DaemonSet's pod on every node once"
            }
            PlacementAction::AddByHand => "CHANGE it yourself",
            PlacementAction::SwitchByNodeLabel => {
                "the GPU Operator's; no DaemonSet is edited (placement: GpuOperator)"
            }
            PlacementAction::UseGpuOperatorPlacement => "REFUSED: set spec.placement: GpuOperator",
            PlacementAction::AddonManaged => "REFUSED: the cluster's addon manager keeps it",
            PlacementAction::Missing => "MISSING: the DaemonSet does not exist",
            PlacementAction::Removed => "removed, and no longer needed",
        };
        let _ = writeln!(out, "  {} DaemonSet {}: {what}", pl.role, pl.daemon_set);
        for line in pl.message.lines() {
            let _ = writeln!(out, "      {line}");
        }
        for line in pl.snippet.lines() {
            let _ = writeln!(out, "      {line}");
        }
    }
}
