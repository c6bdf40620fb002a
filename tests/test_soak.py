"""devtools/bench/soak.py: which samples its fits use (no deployment, no Spark; the figures are a 120-minute
soak's second half, each with the JVM count a handover gives)."""

from __future__ import annotations

from devtools.bench.soak import COLUMNS, steady, verdicts

# min, procs, RSS MiB, threads, fds, heap MiB, snap max, snap mean, meta max, meta mean, cat rows, dagster MiB,
# events (the soak's table, COLUMNS) and the sample's JVMs
SECOND_HALF = [
    (64.1, 9, 1347, 131, 373, 76, 58, 56.4, 51, 51.0, 200, 75.0, 7453, 1),
    (69.6, 11, 1954, 305, 655, 115, 60, 58.5, 51, 51.0, 200, 80.1, 7903, 1),  # successor up, its JVM not yet
    (75.0, 9, 2028, 378, 404, 277, 63, 58.5, 51, 51.0, 200, 83.5, 8299, 1),
    (80.4, 15, 3186, 441, 734, 504, 64, 57.7, 51, 51.0, 200, 86.3, 8600, 2),
    (85.7, 9, 1751, 376, 379, 106, 66, 53.8, 51, 51.0, 200, 92.5, 9230, 1),
    (91.0, 16, 3344, 685, 716, 396, 71, 50.3, 51, 51.0, 200, 100.8, 9972, 2),
    (96.1, 10, 2569, 397, 392, 425, 77, 38.3, 51, 51.0, 200, 109.5, 10844, 1),
    (101.2, 10, 1889, 360, 372, 129, 45, 32.7, 51, 51.0, 200, 117.9, 11574, 1),
    (106.4, 10, 1896, 360, 385, 268, 53, 40.7, 51, 51.0, 200, 126.4, 12387, 1),
    (111.6, 10, 2005, 362, 374, 250, 60, 47.2, 51, 51.0, 200, 134.4, 13084, 1),
    (116.7, 16, 2592, 460, 717, 325, 61, 46.2, 51, 51.0, 200, 143.3, 14006, 2),
    (120.2, 16, 3607, 697, 732, 605, 62, 45.5, 51, 51.0, 200, 149.1, 14485, 1),  # predecessor exiting, its JVM gone
]
ONE_WORKER = [64.1, 75.0, 85.7, 96.1, 101.2, 106.4, 111.6]


def _samples(rows=SECOND_HALF) -> list[dict]:
    return [{**dict(zip([key for _, key, _ in COLUMNS], r[:-1])), "jvms": r[-1]} for r in rows]


def test_samples_with_a_second_worker_run_are_left_out():
    samples = _samples()
    assert [s["minutes"] for s in steady(samples, workers=1)] == ONE_WORKER
    assert [s["minutes"] for s in steady(samples)] == ONE_WORKER, "the most common JVM count when unknown"
    # handovers in most samples: the JVM count of the deployment's worker runs still names the steady ones
    busy = _samples([r[:-1] + (2,) if r[0] in (64.1, 75.0, 85.7, 96.1, 101.2) else r for r in SECOND_HALF])
    assert [s["minutes"] for s in steady(busy, workers=1)] == [106.4, 111.6], "69.6 and 120.2 stay out"
    # a run between its start and its Spark session (fewer JVMs) is no steady sample either
    assert [s["minutes"] for s in steady(_samples([r[:-1] + (0,) for r in SECOND_HALF[:3]]), workers=1)] == []


def test_the_fits_use_the_steady_samples_only():
    checks = {c["figure"]: c for c in verdicts(_samples(), 100, workers=1)}
    assert checks["fds"]["points"] == len(ONE_WORKER)
    assert abs(checks["fds"]["slope_h"]) < 20, "one worker's fds are flat (~370-404) over the second half"
    alone = {c["figure"]: c for c in verdicts(_samples([r[:-1] + (5,) for r in SECOND_HALF]), 100, workers=1)}
    assert alone["fds"]["verdict"] == "too few samples" and alone["fds"]["points"] == 0
