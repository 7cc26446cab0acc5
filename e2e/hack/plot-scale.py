#!/usr/bin/env python3
"""Plots the per-node figures of `bench-scale --json` runs against pool size, as an SVG.

Usage: e2e/hack/plot-scale.py RESULTS.jsonl OUT.svg

Five panels share the x axis (pool size, log scale), one point per run of the wide migration
(Switchyard at maxUnavailable 10%): CPU seconds per migrated node, operator API requests per
migrated node, reconcile duration p50 and p99, the same divided by the nodes in flight
(`maxUnavailable`: one reconcile steps all of them), and the operator's RSS once its caches
synced and at the end. Flat lines are what the scale goal asks for in the first two and the
fourth; the third and the last show how time and memory grow with the pool. A partial run
(`--wide-deadline-s`) is marked with a star. Runs from before the bench recorded `in_flight`
are taken at its default of 10% of the pool.
Standard library only.
"""
import json
import math
import sys


def load(path):
    runs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            run = json.loads(line)
            wide = [m for m in run["migrations"] if m.get("cpu_s") is not None][-1]
            in_flight = wide.get("in_flight") or max(1, run["nodes"] // 10)
            runs.append({
                "nodes": run["nodes"],
                "cpu": wide["cpu_s"] / wide["nodes"],
                "requests": wide["requests"] / wide["nodes"],
                "p50": (wide["reconcile_p50_s"] or 0) * 1000,
                "p99": (wide["reconcile_p99_s"] or 0) * 1000,
                "p50_per": (wide["reconcile_p50_s"] or 0) * 1000 / in_flight,
                "p99_per": (wide["reconcile_p99_s"] or 0) * 1000 / in_flight,
                "rss_synced": run["rss_synced_kib"] / 1024,
                "rss_end": run["rss_end_kib"] / 1024,
                "partial": bool(run.get("partial")),
            })
    runs.sort(key=lambda r: r["nodes"])
    return runs


def panel(x0, y0, w, h, runs, series, title, unit):
    xs = [math.log10(r["nodes"]) for r in runs]
    lo, hi = min(xs), max(xs)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5
    ymax = max(max(r[k] for r in runs) for k, _ in series) * 1.2 or 1.0
    px = lambda x: x0 + (x - lo) / (hi - lo) * w
    py = lambda y: y0 + h - y / ymax * h
    out = [f'<text x="{x0}" y="{y0 - 8}" font-size="13" font-weight="bold">{title}</text>',
           f'<line x1="{x0}" y1="{y0 + h}" x2="{x0 + w}" y2="{y0 + h}" stroke="#444"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + h}" stroke="#444"/>']
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<text x="{x0 - 6}" y="{py(v) + 4:.1f}" font-size="10" text-anchor="end">{v:.3g}</text>')
        out.append(f'<line x1="{x0}" y1="{py(v):.1f}" x2="{x0 + w}" y2="{py(v):.1f}" stroke="#ddd"/>')
    for r in runs:
        x = px(math.log10(r["nodes"]))
        star = "*" if r["partial"] else ""
        out.append(f'<text x="{x:.1f}" y="{y0 + h + 14}" font-size="10" text-anchor="middle">{r["nodes"]}{star}</text>')
    for (key, color) in series:
        pts = " ".join(f'{px(math.log10(r["nodes"])):.1f},{py(r[key]):.1f}' for r in runs)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for r in runs:
            cx, cy = px(math.log10(r["nodes"])), py(r[key])
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{color}"/>')
            out.append(f'<text x="{cx + 5:.1f}" y="{cy - 5:.1f}" font-size="10" fill="{color}">{r[key]:.3g}</text>')
    out.append(f'<text x="{x0 + w}" y="{y0 + h + 28}" font-size="10" text-anchor="end">pool nodes (log); {unit}</text>')
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    runs = load(sys.argv[1])
    if not runs:
        sys.exit("no runs in " + sys.argv[1])
    w, h = 260, 160
    body = []
    body += panel(60, 40, w, h, runs, [("cpu", "#1f77b4")], "CPU s per migrated node", "seconds")
    body += panel(60 + w + 80, 40, w, h, runs, [("requests", "#d62728")], "API requests per migrated node", "requests")
    body += panel(60 + 2 * (w + 80), 40, w, h, runs, [("p50", "#2ca02c"), ("p99", "#ff7f0e")],
                  "reconcile p50 (green), p99 (orange)", "ms")
    body += panel(60 + 3 * (w + 80), 40, w, h, runs, [("p50_per", "#2ca02c"), ("p99_per", "#ff7f0e")],
                  "the same per node in flight", "ms")
    body += panel(60 + 4 * (w + 80), 40, w, h, runs, [("rss_synced", "#9467bd"), ("rss_end", "#8c564b")],
                  "operator RSS synced (purple), end (brown)", "MiB")
    width = 60 + 5 * (w + 80)
    if any(r["partial"] for r in runs):
        body.append(f'<text x="60" y="{h + 84}" font-size="10">* partial run (--wide-deadline-s): per node migrated '
                    'by the deadline; "end" RSS is mid-migration</text>')
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + 100}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>'] + body + ['</svg>']
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
