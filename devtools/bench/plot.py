"""Writes docs/benchmark-before-after.svg: throughput and freshness before and after, as plain SVG
bars (matplotlib is not installed). The figures are the ones quoted in docs/benchmark.md; edit
:data:`PANELS` when a new run replaces them, then run::

    .venv/bin/python -m devtools.bench.plot [--out docs/benchmark-before-after.svg]
"""

from __future__ import annotations

import argparse
from html import escape
from pathlib import Path

# (panel title, unit, [(bar label, value, note)])
PANELS = [
    (
        "(b)/(a): end to end / raw consume, N = 1,000,000, quiet machine, make bench",
        "ratio (goal 0.30)",
        [
            ("issue baseline", 0.118, "37,782 / 319,813 records/s"),
            ("before (ce5abf7)", 0.247, "2026-11-23 18:17"),
            ("after (e3afd9f), first batch", 0.274, "19:09"),
            ("after (e3afd9f), warm Spark session", 0.314, "19:09, same run"),
            ("arrow writer (ec2d917), first batch", 0.480, "22:09"),
            ("arrow writer (e0b82e5), first batch", 0.398, "23:45"),
            ("read-task slice (56ec855), first batch", 0.374, "2026-11-25 10:36; (a) read 469,905/s"),
            ("one publish commit (6e8297b), first batch", 0.340, "2026-11-25 14:29; (a) read 448,669/s"),
            ("commits on metadata in hand (c3a3b6a), first", 0.358, "2026-11-25 19:22; (a) read 419,355/s"),
        ],
    ),
    (
        "1,000-record micro-batch on a warm session, quiet machine",
        "seconds, median (goal 1.5)",
        [
            ("issue baseline (execute at 10 snapshots)", 2.65, ""),
            ("before (ce5abf7)", 2.58, "4 Spark jobs, right after warm-up"),
            ("after (e3afd9f)", 1.24, "3 Spark jobs, after (1b)"),
            ("arrow writer (e0b82e5)", 0.90, "2 Spark jobs, 23:45"),
            ("read-task slice (56ec855)", 0.61, "2 Spark jobs, 2026-11-25 10:36"),
            ("one publish commit (6e8297b)", 0.62, "2 Spark jobs, 2026-11-25 14:29"),
            ("commits on metadata in hand (c3a3b6a)", 0.69, "2 Spark jobs, 2026-11-25 19:22"),
        ],
    ),
    (
        "(4a) what 1,000 snapshots add to a 1,000-record micro-batch: its commits, median",
        "seconds, branch + publish at 1,000 minus at 10 snapshots",
        [
            ("three commits (Phase F, 56ec855)", 0.09, "0.08-0.10 s"),
            ("append and publish in one (Phase G, a74a2c9)", 0.07, "run 5"),
            ("same code, later run (a084fa7)", 0.08, "0.04 -> 0.12 s, 2026-11-25 17:47"),
            ("commits on metadata in hand (342ed8c)", 0.02, "0.03 -> 0.05 s, 17:51"),
            ("commits on metadata in hand (c3a3b6a)", 0.0, "0.04 -> 0.04 s, full run 19:22; 4a ratio 0.88"),
        ],
    ),
    (
        "Freshness p50 / p90 under 200 records/s for 8 min, quiet machine",
        "seconds (goal 10 / 20)",
        [
            ("issue baseline p50", 29.4, "one run per micro-batch"),
            ("issue baseline p90", 43.2, ""),
            ("streaming, budget 120 s: p50", 2.8, "ce5abf7, 18:22"),
            ("streaming, budget 120 s: p90", 18.4, ""),
            ("streaming, budget 300 s: p50", 1.4, "e3afd9f, 19:00"),
            ("streaming, budget 300 s: p90", 3.3, ""),
            ("arrow writer (e0b82e5): p50", 1.0, "23:50"),
            ("arrow writer (e0b82e5): p90", 2.2, ""),
            ("read-task slice (56ec855): p50", 0.6, "2026-11-25 10:40"),
            ("read-task slice (56ec855): p90", 1.1, "max 30.0 s at the run hand-over"),
            ("one publish commit (6e8297b): p50", 0.6, "2026-11-25 14:33"),
            ("one publish commit (6e8297b): p90", 1.0, "max 25.8 s at the run hand-over"),
            ("commits on metadata in hand (c3a3b6a): p50", 0.7, "2026-11-25 19:27"),
            ("commits on metadata in hand (c3a3b6a): p90", 1.3, "max 32.3 s at the run hand-over"),
        ],
    ),
]
COLORS = ("#7f8c8d", "#2e86c1", "#a04000", "#1e8449")


def panel_svg(y0: int, title: str, unit: str, bars: list, width: int) -> tuple[str, int]:
    """One panel of horizontal bars starting at ``y0``; returns (SVG text, height in px)."""
    label_w, bar_h, gap = 300, 22, 8
    top = max([v for _, v, _ in bars if v is not None] or [1.0])
    parts = [
        f'<text x="10" y="{y0 + 18}" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="10" y="{y0 + 36}" font-size="12" fill="#555">{escape(unit)}</text>',
    ]
    y = y0 + 48
    for i, (label, value, note) in enumerate(bars):
        parts.append(f'<text x="10" y="{y + 16}" font-size="12">{escape(label)}</text>')
        if value is None:
            parts.append(
                f'<text x="{label_w}" y="{y + 16}" font-size="12" fill="#999">not measured ({escape(note)})</text>'
            )
        else:
            w = max(1, int((width - label_w - 220) * value / top))
            parts.append(f'<rect x="{label_w}" y="{y}" width="{w}" height="{bar_h}" fill="{COLORS[i % len(COLORS)]}"/>')
            parts.append(
                f'<text x="{label_w + w + 6}" y="{y + 16}" font-size="12">{value:g}'
                f"{'  (' + escape(note) + ')' if note else ''}</text>"
            )
        y += bar_h + gap
    return "\n".join(parts), y - y0 + 12


def render(panels: list, width: int = 900) -> str:
    """The whole SVG document."""
    body, y = [], 10
    for title, unit, bars in panels:
        svg, h = panel_svg(y, title, unit, bars, width)
        body.append(svg)
        y += h
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" font-family="sans-serif">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "benchmark-before-after.svg"))
    args = ap.parse_args(argv)
    Path(args.out).write_text(render(PANELS))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
