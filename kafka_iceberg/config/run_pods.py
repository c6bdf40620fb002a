"""The Kubernetes resources of the lake's run pods, as the ``dagster-k8s/config`` run tag that
dagster-k8s's ``K8sRunLauncher`` reads (other run launchers ignore it).

A run pod holds the Spark driver (with ``SPARK_MASTER=local[N]`` its executors too) and the run's
Python process, so it is sized from the settings, not from the code server: without this tag the
chart's ``includeConfigInLaunchedRuns`` hands every run the code server's own resources. The tag's
``container_config.resources`` replaces those (the run's tags are merged last).
"""

from __future__ import annotations

import json
import math
import re

from kafka_iceberg.config.settings import Settings, load_settings

RUN_POD_TAG = "dagster-k8s/config"
"""The run tag dagster-k8s reads a run pod's container and pod configuration from."""

SPARK_MIN_OVERHEAD_MIB = 384
SPARK_OVERHEAD_FACTOR = 0.10
"""Spark's own driver memory overhead rule (``spark.driver.memoryOverheadFactor``, at least 384 MiB)."""

RUN_PROCESS_MIB = 1024
"""The run's Python process beside the JVM: Dagster, pyarrow buffers, the read tasks' Python workers."""

_UNITS = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def memory_mib(spark_memory: str) -> int:
    """MiB of a Spark memory string (``2g``, ``1536m``, ``512M``; a bare number is bytes).

    Raises:
        ValueError: not a Spark memory string.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]?)[bB]?\s*", spark_memory)
    if not m:
        raise ValueError(f"not a Spark memory size: {spark_memory!r}")
    unit = m[2].lower()
    return math.ceil(int(m[1]) * _UNITS[unit]) if unit else math.ceil(int(m[1]) / 2**20)


def run_pod_resources(settings: Settings) -> dict[str, dict[str, str]]:
    """``requests``/``limits`` of a run pod: memory = Spark driver memory (``spark.driver.memory`` of ``LAKE_SPARK_CONF``)
    + Spark's overhead + :data:`RUN_PROCESS_MIB`, rounded up to 256 MiB; CPU = N of ``local[N]``
    (else 1). No CPU limit (Spark's bursts are throttled, not killed)."""
    heap = memory_mib(settings.spark_driver_memory)
    total = heap + max(SPARK_MIN_OVERHEAD_MIB, math.ceil(heap * SPARK_OVERHEAD_FACTOR)) + RUN_PROCESS_MIB
    memory = f"{math.ceil(total / 256) * 256}Mi"
    cores = re.fullmatch(r"local\[(\d+)\]", settings.spark_master.strip())
    cpu = cores[1] if cores else "1"
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}


def run_pod_tags(settings: Settings | None = None) -> dict[str, str]:
    """The run tags that give the lake's run pods :func:`run_pod_resources` (of ``settings``, default
    :func:`~kafka_iceberg.config.settings.load_settings`: the code location's, read when it loads).

    Raises:
        ConfigError: see :func:`~kafka_iceberg.config.settings.load_settings`.
        ValueError: ``spark.driver.memory`` is not a Spark memory size.
    """
    settings = settings or load_settings()
    return {RUN_POD_TAG: json.dumps({"container_config": {"resources": run_pod_resources(settings)}})}
