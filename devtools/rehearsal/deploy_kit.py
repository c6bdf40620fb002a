"""The deployment kit of deploy/ rendered for the deployment rehearsal (:mod:`devtools.rehearsal.deploy`):
the image tree, the image's config, the code server's pod as the ``dagster-user-deployments`` chart
renders it from deploy/helm/values.yaml, the instance's dagster.yaml as the ``dagster`` chart renders it,
and the ConfigMaps and Secrets the README creates.

Everything is read from the kit's own files; what this machine needs instead of a cluster (local
addresses, the stand-in kubeconfig, a free port) is passed in and listed by :func:`local_overrides`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import yaml

from kafka_iceberg.config.settings import CHECKOUT

DEPLOY = CHECKOUT / "deploy"
SYSTEM_PYTHON = "/usr/bin/python3.11"
RELEASE = "lake"  # helm release of the user deployments (deploy/README.md step 3)
CHART = "dagster-user-deployments"
FULLNAME = f"{RELEASE}-{CHART}"
NAMESPACE = "data-platform"
INSTANCE_CONFIG_MAP = "dagster-instance"  # what the `dagster` release (named dagster) creates
PIPELINE_ENV_CONFIG_MAP = "dagster-pipeline-env"
TABLES_PATH = "/opt/lake-tables/tables.yaml"  # the derived image's declarations file
IMAGE_USER = "lake"  # build-image.sh: useradd --uid 10001 ... lake
IMAGE_DEPS = "opt/deps"  # where the image tree holds this virtualenv's packages (_image_deps)


def values() -> dict:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())


def deployment() -> dict:
    (one,) = values()["deployments"]
    return one


# -- the image ----------------------------------------------------------------------------------------
def dockerfile_config() -> tuple[dict[str, str], str, int]:
    """(ENV, WORKDIR, USER) of deploy/Dockerfile."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    env: dict[str, str] = {}
    workdir, user = "/", 0
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(part.split("=", 1) for part in shlex.split(line[4:]) if "=" in part)
        elif line.startswith("WORKDIR "):
            workdir = line.split()[1]
        elif line.startswith("USER "):
            user = int(line.split()[1])
    return env, workdir, user


def image_env() -> dict[str, str]:
    """The image's environment: the base image's PATH with the image's Python (``/opt/venv/bin`` here,
    ``/usr/local/bin`` in python:3.11-slim) first, the user's HOME, and the Dockerfile's ENV."""
    env, _, _ = dockerfile_config()
    return {"PATH": "/opt/venv/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/lake", **env}


def build_image_tree(root: Path, timeout_s: float = 600) -> Path:
    """deploy/build-image.sh run into ``root`` (also by tests/test_image.py): first a virtualenv of the
    system's python3.11 at ``/opt/venv`` whose dependencies are this checkout's virtualenv's packages,
    linked into the tree (:func:`_image_deps`, a ``.pth`` instead of the download of
    requirements-runtime.lock). Returns that virtualenv's python.

    Raises:
        RuntimeError: build-image.sh failed (its output's tail).
        subprocess.TimeoutExpired: it ran longer than ``timeout_s`` seconds.
    """
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    venv = root / "opt" / "venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "lake-deps.pth").write_text(f"{_image_deps(root)}\n")
    env = {**os.environ, "PYTHON": str(python), "LAKE_IMAGE_LOCK": "", "LAKE_IMAGE_BUILD_ISOLATION": "0"}
    out = subprocess.run(
        ["sh", str(DEPLOY / "build-image.sh"), str(root)], env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if out.returncode != 0:
        raise RuntimeError(f"build-image.sh failed: {out.stderr[-3000:]}")
    return python


def _image_deps(root: Path) -> Path:
    """This virtualenv's packages at ``root/opt/deps``, the image tree's own: hard links (``cp -al``: 50,000
    files in seconds, no bytes copied) or, across filesystems, a copy. The image's user (uid 10001) reads
    them wherever the checkout is, also under a directory closed to other users such as ``/root``.

    Raises:
        OSError: neither linking nor copying worked.
    """
    purelib, deps = sysconfig.get_path("purelib"), root / IMAGE_DEPS
    deps.parent.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["cp", "-al", purelib, str(deps)], capture_output=True).returncode != 0:
        shutil.rmtree(deps, ignore_errors=True)
        shutil.copytree(purelib, deps, symlinks=True)
    return deps


def in_image_deps(root: Path, path: str) -> str:
    """``path``, a file of this virtualenv's packages, where the image tree at ``root`` holds it
    (:func:`_image_deps`): a path the image's user can read."""
    return str(root / IMAGE_DEPS / Path(path).relative_to(sysconfig.get_path("purelib")))


def build_image(root: Path, tables_yaml: str) -> None:
    """The image tree at ``root`` (:func:`build_image_tree`), then what the Dockerfile and the base image
    add besides: the ``dagster`` console script, ``/usr/lib/jvm/default-java``, the user's home; and, as a
    derived image would, the tables' declarations at :data:`TABLES_PATH`.

    Raises:
        RuntimeError: build-image.sh failed (its output's tail).
    """
    python = build_image_tree(root)
    venv = python.parent.parent
    script = venv / "bin" / "dagster"  # pip installs it with dagster from the lock in the real image
    # pip's console-script wrapper: the __main__ guard matters, the multiprocess executor's spawned
    # step processes import this file again
    script.write_text(
        f"#!{python}\nimport sys\nfrom dagster._cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n"
    )
    script.chmod(0o755)
    java = Path(os.path.realpath(shutil.which("java") or "/usr/bin/java")).parent.parent
    jvm = root / "usr" / "lib" / "jvm"
    jvm.mkdir(parents=True)
    (jvm / "default-java").symlink_to(java)
    _, _, uid = dockerfile_config()
    home = root / "home" / "lake"
    home.mkdir(parents=True)
    tables = root / TABLES_PATH.lstrip("/")
    tables.parent.mkdir(parents=True)
    tables.write_text(tables_yaml)
    if os.geteuid() == 0:
        os.chown(home, uid, uid)


# -- the code server's pod -------------------------------------------------------------------------------
def container_context() -> dict:
    """``DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT`` as the chart's ``k8sContainerContext`` helper renders it
    (includeConfigInLaunchedRuns): what K8sRunLauncher merges into every run's Job."""
    d, v = deployment(), values()
    k8s = {
        "image_pull_policy": d["image"]["pullPolicy"],
        "env_config_maps": [f"{FULLNAME}-{d['name']}-user-env", *(c["name"] for c in d.get("envConfigMaps", []))],
        "namespace": NAMESPACE,
        "service_account_name": v["global"].get("serviceAccountName") or v["serviceAccount"]["name"],
    }
    if d.get("envSecrets"):
        k8s["env_secrets"] = [s["name"] for s in d["envSecrets"]]
    for key, name in (("volumeMounts", "volume_mounts"), ("volumes", "volumes"), ("labels", "labels")):
        if d.get(key):
            k8s[name] = d[key]
    if d.get("resources"):
        k8s["resources"] = d["resources"]
    if isinstance(d.get("env"), list) and d["env"]:
        k8s["env"] = d["env"]
    return {"k8s": k8s}


def code_server_pod(name: str, port: int) -> dict:
    """The code server's pod as the chart's deployment-user.yaml renders it from values.yaml; the one
    change: it listens on 127.0.0.1:``port`` (the stand-in has no pod network) instead of 0.0.0.0:3030."""
    d, v = deployment(), values()
    image = f"{d['image']['repository']}:{d['image']['tag']}"
    env = [
        {"name": "DAGSTER_CURRENT_IMAGE", "value": image},
        {
            "name": "DAGSTER_PG_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": v["global"]["postgresqlSecretName"], "key": "postgresql-password"}},
        },
    ]
    if d.get("includeConfigInLaunchedRuns", {"enabled": True}).get("enabled"):
        env.append({"name": "DAGSTER_CLI_API_GRPC_CONTAINER_CONTEXT", "value": json.dumps(container_context())})
    env += d.get("env") or []
    env_from = [
        {"configMapRef": {"name": f"{FULLNAME}-user-deployments-shared-env"}},
        {"configMapRef": {"name": f"{FULLNAME}-{d['name']}-user-env"}},
        *({"configMapRef": c} for c in d.get("envConfigMaps", [])),
        *({"secretRef": s} for s in d.get("envSecrets", [])),
        {"secretRef": {"name": v["global"]["celeryConfigSecretName"], "optional": True}},
    ]
    container = {
        "name": CHART,
        "image": image,
        "imagePullPolicy": d["image"]["pullPolicy"],
        "args": ["dagster", "api", "grpc", "-h", "127.0.0.1", "-p", str(port), *d["dagsterApiGrpcArgs"]],
        "env": env,
        "envFrom": env_from,
        "securityContext": d.get("securityContext", {}),
        "resources": d.get("resources", {}),
        "volumeMounts": d.get("volumeMounts", []),
    }
    labels = {"component": "user-deployments", "deployment": d["name"], **d.get("labels", {})}
    spec = {
        "serviceAccountName": v["global"]["serviceAccountName"],
        "securityContext": d.get("podSecurityContext", {}),
        "containers": [container],
        "volumes": d.get("volumes", []),
    }
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


# -- the instance -------------------------------------------------------------------------------------
def instance_yaml(pg_port: int, kubeconfig: Path) -> str:
    """The dagster.yaml of the ``dagster`` chart's instance ConfigMap with its defaults (daemon scheduler,
    PostgreSQL storage, K8sRunLauncher, queued run coordinator, run monitoring and run retries on), the
    PostgreSQL at 127.0.0.1:``pg_port``. Differences from a cluster: the launcher reads
    ``kubeconfig`` (the stand-in) instead of the in-cluster config, and telemetry is off."""
    pg = {
        "postgres_db": {
            "username": "lake",
            "password": {"env": "DAGSTER_PG_PASSWORD"},
            "hostname": "127.0.0.1",
            "db_name": "dagster",
            "port": pg_port,
            "params": {},
            # no "scheme", as the chart renders it with postgresql.postgresqlScheme unset: a bare postgresql://,
            # which SQLAlchemy 2.0 (the lock pins <2.1) opens with psycopg2, the driver dagster-postgres installs
        }
    }
    launcher = {
        "load_incluster_config": False,
        "kubeconfig_file": str(kubeconfig),
        "job_namespace": NAMESPACE,
        "image_pull_policy": "Always",
        "service_account_name": values()["global"]["serviceAccountName"],
        "dagster_home": values()["dagsterHome"],  # the daemon pod's DAGSTER_HOME ({env: DAGSTER_HOME} in the chart)
        "instance_config_map": {"env": "DAGSTER_K8S_INSTANCE_CONFIG_MAP"},
        "postgres_password_secret": {"env": "DAGSTER_K8S_PG_PASSWORD_SECRET"},
        "env_config_maps": [{"env": "DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP"}],
    }
    doc = {
        "scheduler": {"module": "dagster.core.scheduler", "class": "DagsterDaemonScheduler"},
        "schedule_storage": {
            "module": "dagster_postgres.schedule_storage",
            "class": "PostgresScheduleStorage",
            "config": pg,
        },
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher},
        "run_storage": {"module": "dagster_postgres.run_storage", "class": "PostgresRunStorage", "config": pg},
        "event_log_storage": {"module": "dagster_postgres.event_log", "class": "PostgresEventLogStorage", "config": pg},
        "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator", "config": {}},
        "compute_logs": {"module": "dagster.core.storage.noop_compute_log_manager", "class": "NoOpComputeLogManager"},
        "run_monitoring": {"enabled": True, "start_timeout_seconds": 300, "poll_interval_seconds": 120},
        "run_retries": {"enabled": True},
        "sensors": {"use_threads": True, "num_workers": 4},
        "telemetry": {"enabled": False},
    }
    return yaml.safe_dump(doc, sort_keys=False)


# -- ConfigMaps and Secrets -----------------------------------------------------------------------------
def _secret(name: str, data: dict[str, str]) -> dict:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


def _config_map(name: str, data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def lake_env(overrides: dict[str, str | None]) -> dict:
    """deploy/k8s/lake-env.configmap.yaml with ``overrides`` (a ``None`` value removes the key)."""
    manifest = yaml.safe_load((DEPLOY / "k8s" / "lake-env.configmap.yaml").read_text())
    for key, value in overrides.items():
        if value is None:
            manifest["data"].pop(key, None)
        else:
            manifest["data"][key] = value
    return manifest


def local_overrides(manifest: dict) -> list[str]:
    """The keys of lake-env that differ from the kit's file, for the report."""
    kit = yaml.safe_load((DEPLOY / "k8s" / "lake-env.configmap.yaml").read_text())["data"]
    data = manifest["data"]
    changed = sorted(k for k in data if kit.get(k) != data[k])
    return changed + [f"-{k}" for k in sorted(set(kit) - set(data))]


def cluster_objects(instance: str, lake_env_manifest: dict, secrets: dict[str, str], pg_password: str) -> list[dict]:
    """What the cluster holds before the lake runs: the ``dagster`` release's instance ConfigMap, run env
    ConfigMap and PostgreSQL Secret; the user deployments chart's two env ConfigMaps; the README's
    ConfigMap ``lake-env`` and Secret ``lake-secrets`` (``secrets``)."""
    d, v = deployment(), values()
    dagster_home = v["dagsterHome"]
    pipeline_env = {
        "DAGSTER_HOME": dagster_home,
        "DAGSTER_K8S_PG_PASSWORD_SECRET": v["global"]["postgresqlSecretName"],
        "DAGSTER_K8S_INSTANCE_CONFIG_MAP": INSTANCE_CONFIG_MAP,
        "DAGSTER_K8S_PIPELINE_RUN_NAMESPACE": NAMESPACE,
        "DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP": PIPELINE_ENV_CONFIG_MAP,
    }
    shared = {
        "DAGSTER_HOME": dagster_home,
        "DAGSTER_K8S_PIPELINE_RUN_NAMESPACE": NAMESPACE,
        "DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP": f"{FULLNAME}-pipeline-env",
    }
    (secret_ref,) = d["envSecrets"]
    return [
        _config_map(INSTANCE_CONFIG_MAP, {"dagster.yaml": instance}),
        _config_map(PIPELINE_ENV_CONFIG_MAP, pipeline_env),
        _secret(v["global"]["postgresqlSecretName"], {"postgresql-password": pg_password}),
        _config_map(f"{FULLNAME}-user-deployments-shared-env", shared),
        _config_map(f"{FULLNAME}-{d['name']}-user-env", {}),
        lake_env_manifest,
        _secret(secret_ref["name"], secrets),
    ]


def daemon_env(home: Path, pg_password: str) -> dict[str, str]:
    """The ``dagster`` release's daemon environment: its instance and the launcher's ``env`` settings;
    none of the lake's settings (the team's daemon knows nothing of the lake)."""
    v = values()
    env = {k: v_ for k, v_ in os.environ.items() if not k.startswith(("LAKE_", "DAGSTER_", "KAFKA_", "SPARK_"))}
    env.update(
        DAGSTER_HOME=str(home),
        DAGSTER_PG_PASSWORD=pg_password,
        DAGSTER_K8S_INSTANCE_CONFIG_MAP=INSTANCE_CONFIG_MAP,
        DAGSTER_K8S_PG_PASSWORD_SECRET=v["global"]["postgresqlSecretName"],
        DAGSTER_K8S_PIPELINE_RUN_ENV_CONFIGMAP=PIPELINE_ENV_CONFIG_MAP,
        DAGSTER_K8S_PIPELINE_RUN_NAMESPACE=NAMESPACE,
    )
    return env


__all__ = [
    "NAMESPACE",
    "TABLES_PATH",
    "build_image",
    "cluster_objects",
    "code_server_pod",
    "container_context",
    "daemon_env",
    "dockerfile_config",
    "image_env",
    "instance_yaml",
    "lake_env",
    "local_overrides",
]
