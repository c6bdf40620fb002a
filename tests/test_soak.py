"""devtools/bench/soak.py: which samples its fits use (no deployment, no Spark; the figures are a 120-minute
soak's second half, each with the JVM count a handover gives)."""

from __future__ import annotations

from devtools.bench.soak import COLUMNS, steady, trend, verdicts

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


def _aged(minutes: float, ages_min: list[float], threads: int, events: int) -> dict:
    """A sample with the fields :func:`sample` writes: worker runs' ages, and the daemon and code server."""
    return {
        "minutes": minutes,
        "worker_ages_s": [a * 60 for a in ages_min],
        "jvms": len(ages_min),
        "threads": threads,
        "fds": 1200,
        "rss_native_mib": 1500.0,
        "heap_mib": 120.0,
        "by_name": {"dagster-daemon": [1, 210.0, 11, 3], "dagster api": [1, 410.0, 18, 20], "java": [1, 900, 300, 300]},
        "events": events,
        "dagster_mib": events / 100,
        "snapshots_max": 60,
        "snapshots_mean": 40.0,
        "metadata_files_max": 51,
        "metadata_files_mean": 51.0,
        "catalog_rows": 200,
    }


def test_worker_run_figures_use_warm_samples_and_the_rest_every_sample():
    # a run replaced at 60 min: its successor up at 58 (two runs), then young until 70; threads ramp after a start
    ages = {m: ([m - 30] if m < 58 else [m - 30, m - 58] if m < 61 else [m - 58]) for m in range(30, 121, 2)}
    samples = [_aged(m, a, 800 if min(a) >= 10 else 600 + 20 * min(a), 10_000 + 150 * m) for m, a in ages.items()]
    samples[-3]["jvms"] = 2  # a run up that has not tagged its pid yet
    kept = [s["minutes"] for s in steady(samples, workers=1)]
    assert kept == [*range(40, 57, 2), *range(68, 116, 2), 118, 120], "young runs and handovers are left out"
    checks = {c["figure"]: c for c in verdicts(samples, 100, workers=1)}
    # runs start at 30 and 58: a period of 28 min; each warm sample from 96 min on has one 28 min before it
    assert checks["threads"]["points"] == len([m for m in kept if m >= 96]) and checks["threads"]["verdict"] == "pass"
    assert checks["events"]["points"] == len([m for m in ages if m >= 60]), "events: every second-half sample"
    assert round(checks["events"]["slope_h"]) == 9000 and checks["events"]["verdict"] == "pass"
    assert checks["server_rss_mib"]["slope_h"] == 0 and checks["server_rss_mib"]["verdict"] == "pass"
    assert {c["figure"]: c for c in verdicts(samples, 100, workers=2)}["threads"]["verdict"] == "too few samples"


def test_a_growing_code_server_fails_and_a_short_run_still_judges_its_events():
    growing = [_aged(m, [m], 800, 100 * m) for m in range(0, 121, 2)]
    for s in growing:
        s["by_name"]["dagster api"][1] += 0.5 * s["minutes"]  # 30 MiB/h
    checks = {c["figure"]: c for c in verdicts(growing, 100, workers=1)}
    assert checks["server_rss_mib"]["verdict"] == "FAIL" and round(checks["server_rss_mib"]["slope_h"]) == 30
    short = [_aged(m, [m], 800, 250 * m) for m in range(0, 7)]  # 6 minutes: no warm worker sample at all
    checks = {c["figure"]: c for c in verdicts(short, 100, workers=1)}
    assert checks["threads"]["verdict"] == "too few samples"
    assert round(checks["events"]["slope_h"]) == 15_000 and checks["events"]["verdict"] == "pass"


def test_rejudge_reads_a_finished_soak_again(tmp_path):
    import json
    from argparse import Namespace

    from devtools.bench.soak import rejudge

    samples = [_aged(m, [m % 30 + 30], 800, 100 * m) for m in range(0, 121, 2)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    args = Namespace(minutes=120, sample_s=120, tables=100, rate=200, max_snapshots=60, commit="abc1234")
    tallies = {f"lake.t{i}": [5, 5, 5] for i in range(99)} | {"lake.t99": [6, 5, 5]}
    old = {"args": vars(args), "workers": 1, "tallies": tallies, "ok": True, "commit": "abc1234"}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    summary = rejudge(tmp_path)
    assert summary["exact"] == 99 and summary["ok"] is False, "a duplicated record fails the soak"
    assert summary["commit"] == "abc1234" and summary["judged_by"]
    assert json.loads((tmp_path / "summary.json").read_text())["ok"] is False


def test_the_trend_shrugs_off_outliers_and_sees_a_leak():
    flat = [(m / 60, 1850.0 + (700 if m in (72, 76, 100) else 0) + (m % 3) * 10) for m in range(60, 121)]
    k, low, high = trend(flat)
    assert abs(k) < 5 and low <= 0 <= high and high < 64, "three samples with a Spark job's workers up"
    leak = [(x, y + 100 * x) for x, y in flat]  # 100 MiB/h on top
    k, low, high = trend(leak)
    assert 90 < k < 110 and low > 64
    assert trend(flat[:2]) == (0.0, 0.0, 0.0)


def test_a_sawtooth_passes_and_a_level_that_climbs_run_by_run_fails():
    def samples(per_run_mib: float) -> list[dict]:
        out = []
        for m in range(0, 121):
            age, run = m % 30 + 0.5, m // 30
            s = _aged(m, [age], 800, 100 * m)
            s["by_name"]["python (multiprocessing)"] = [2, 500 + 4 * age + per_run_mib * run, 400, 800]
            out.append(s)
        return out

    sawtooth = {c["figure"]: c for c in verdicts(samples(0), 100, workers=1)}["python_rss_mib"]
    assert sawtooth["verdict"] == "pass" and sawtooth["slope_h"] == 0, "each run grows 80 MiB, the next starts over"
    assert sawtooth["points"] >= 15
    climbing = {c["figure"]: c for c in verdicts(samples(50), 100, workers=1)}["python_rss_mib"]
    assert climbing["verdict"] == "FAIL" and round(climbing["slope_h"]) == 100, "50 MiB more each 30 min run"


def test_transients_do_not_tilt_the_run_by_run_figures_and_a_rising_floor_fails():
    """A micro-batch in flight raises the JVM's live heap for a sample (on 7334ec0: 117-527 MiB a minute apart); a
    leak raises every sample. The run-by-run comparison reads each sample's floor over the last FLOOR_S."""

    import random

    def samples(per_run_mib: float) -> list[dict]:
        out, rng = [], random.Random(43)
        for m in range(0, 121):
            age, run = m % 30 + 0.5, m // 30
            s = _aged(m, [age], 800, 100 * m)
            in_flight = rng.choice([0.0, 0.0, 100.0, 400.0])  # a batch in flight in half the samples
            s["heap_mib"] = 120.0 + in_flight + per_run_mib * run
            out.append(s)
        return out

    spiky = {c["figure"]: c for c in verdicts(samples(0), 100, workers=1)}["heap_mib"]
    assert spiky["verdict"] == "pass" and spiky["slope_h"] == 0 and spiky["points"] >= 15, spiky
    leak = {c["figure"]: c for c in verdicts(samples(50), 100, workers=1)}["heap_mib"]
    assert leak["verdict"] == "FAIL" and round(leak["slope_h"]) == 100, leak
