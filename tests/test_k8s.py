"""The Kubernetes deployment, checked with dagster-k8s's own code (no cluster here).

deploy/helm/values.yaml is translated into the ``run_launcher`` block the official chart writes
into the instance's dagster.yaml (the K8sRunLauncher config); that block is validated against
``K8sRunLauncher``'s config schema, and the run's Kubernetes Job is built from it with
``dagster_k8s.job.construct_dagster_k8s_job``, exactly as ``K8sRunLauncher.launch_run`` does.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes
import pytest
import yaml
from dagster._config import validate_config
from dagster._core.instance.config import dagster_instance_config
from dagster_k8s import K8sRunLauncher
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
RELEASE = "lake"


@pytest.fixture(scope="module")
def values() -> dict:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())


def chart_run_launcher_config(values: dict) -> dict:
    """The K8sRunLauncher config the chart renders from ``runLauncher.config.k8sRunLauncher``
    (camelCase chart keys to the launcher's snake_case fields)."""
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    run_k8s = launcher.get("runK8sConfig", {})
    snake = {
        "containerConfig": "container_config",
        "podSpecConfig": "pod_spec_config",
        "podTemplateSpecMetadata": "pod_template_spec_metadata",
        "jobSpecConfig": "job_spec_config",
        "jobMetadata": "job_metadata",
    }
    return {
        "instance_config_map": f"{RELEASE}-dagster-instance",
        "dagster_home": values["dagsterHome"],
        "postgres_password_secret": values["global"]["postgresqlSecretName"],
        "service_account_name": values["global"]["serviceAccountName"],
        "image_pull_policy": launcher["imagePullPolicy"],
        "load_incluster_config": launcher["loadInclusterConfig"],
        "env_config_maps": [c["name"] for c in launcher["envConfigMaps"]],
        "env_secrets": [s["name"] for s in launcher["envSecrets"]],
        "labels": launcher["labels"],
        "resources": launcher["resources"],
        "security_context": launcher["securityContext"],
        "run_k8s_config": {snake[k]: v for k, v in run_k8s.items()},
        "fail_pod_on_run_failure": launcher["failPodOnRunFailure"],
    }


def chart_instance_config(values: dict) -> dict:
    """The instance ``dagster.yaml`` the chart renders into its ``<release>-dagster-instance`` ConfigMap
    (storage, run coordinator, run launcher, concurrency, run monitoring)."""
    pg = values["postgresql"]
    daemon = values["dagsterDaemon"]
    concurrency = values["concurrency"]
    return {
        "storage": {
            "postgres": {
                "postgres_db": {
                    "username": pg["postgresqlUsername"],
                    "password": {"env": "DAGSTER_PG_PASSWORD"},
                    "hostname": pg["postgresqlHost"],
                    "db_name": pg["postgresqlDatabase"],
                    "port": pg["service"]["port"],
                    "params": pg["postgresqlParams"],
                    "scheme": pg["postgresqlScheme"],
                }
            }
        },
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": daemon["runCoordinator"]["type"],
            "config": daemon["runCoordinator"]["config"]["queuedRunCoordinator"],
        },
        "run_launcher": {
            "module": "dagster_k8s",
            "class": "K8sRunLauncher",
            "config": chart_run_launcher_config(values),
        },
        "concurrency": {
            "pools": {"default_limit": concurrency["pools"]["defaultLimit"]},
            "runs": {"max_concurrent_runs": concurrency["runs"]["maxConcurrentRuns"]},
        },
        "run_monitoring": {
            "enabled": daemon["runMonitoring"]["enabled"],
            "free_slots_after_run_end_seconds": daemon["runMonitoring"]["freeSlotsAfterRunEndSeconds"],
        },
        "telemetry": {"enabled": False},
    }


def test_chart_instance_config_is_a_valid_dagster_yaml(values, tmp_path):
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(chart_instance_config(values)))
    config, _ = dagster_instance_config(str(tmp_path))  # raises DagsterInvalidConfigError when invalid
    assert config["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert config["concurrency"]["pools"]["default_limit"] == 1


def render_run_job(values: dict, run_id: str = "0f1e2d3c") -> dict:
    """The run worker's Kubernetes Job as K8sRunLauncher builds it, as a plain dict (API spelling)."""
    config = chart_run_launcher_config(values)
    deployment = values["dagster-user-deployments"]["deployments"][0]
    image = f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    launcher_context = K8sContainerContext(
        image_pull_policy=config["image_pull_policy"],
        service_account_name=config["service_account_name"],
        env_config_maps=config["env_config_maps"],
        env_secrets=config["env_secrets"],
        labels=config["labels"],
        resources=config["resources"],
        security_context=config["security_context"],
        run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(config["run_k8s_config"]),
    )
    # includeConfigInLaunchedRuns: the code server passes its own env sources to its runs
    code_location_context = K8sContainerContext(
        env_config_maps=[c["name"] for c in deployment["envConfigMaps"]],
        env_secrets=[s["name"] for s in deployment["envSecrets"]],
    )
    context = launcher_context.merge(code_location_context)
    job_config = DagsterK8sJobConfig(
        job_image=image,
        dagster_home=config["dagster_home"],
        instance_config_map=config["instance_config_map"],
        postgres_password_secret=config["postgres_password_secret"],
    )
    job = construct_dagster_k8s_job(
        job_config=job_config,
        args=["dagster", "api", "execute_run", "{}"],
        job_name=f"dagster-run-{run_id}",
        pod_name=f"dagster-run-{run_id}",
        component="run_worker",
        user_defined_k8s_config=context.run_k8s_config,
        labels={"dagster/job": "ingest_all", "dagster/run-id": run_id, "dagster/code-location": deployment["name"]},
        env_vars=[{"name": "DAGSTER_RUN_JOB_NAME", "value": "ingest_all"}],
    )
    return kubernetes.client.ApiClient().sanitize_for_serialization(job)


def test_chart_run_launcher_config_is_valid_for_k8s_run_launcher(values):
    result = validate_config(K8sRunLauncher.config_type(), chart_run_launcher_config(values))
    assert result.success, [e.message for e in result.errors]


def test_run_job_image_env_resources_and_labels(values):
    job = render_run_job(values)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/data-platform/kafka-iceberg-lake:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    env_from = container["envFrom"]
    assert {"configMapRef": {"name": "lake-env"}} in env_from
    assert {"secretRef": {"name": "lake-secrets"}} in env_from
    assert len(env_from) == 2, env_from  # the code location's sources merge with the launcher's, no duplicates
    # the instance database password comes from its Secret, never a literal
    pg = next(e for e in container["env"] if e["name"] == "DAGSTER_PG_PASSWORD")
    assert pg["valueFrom"]["secretKeyRef"] == {"name": "dagster-postgresql-secret", "key": "postgresql-password"}
    assert all("value" not in e or e["name"] in ("DAGSTER_HOME", "DAGSTER_RUN_JOB_NAME") for e in container["env"])
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"},
        "limits": {"cpu": "4", "memory": "4Gi"},
    }
    assert container["securityContext"]["runAsNonRoot"] is True
    assert {"name": "spark-scratch", "mountPath": "/opt/dagster/lake"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == "dagster"
    assert pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["app.kubernetes.io/part-of"] == "kafka-iceberg-lake"
        assert labels["app.kubernetes.io/component"] == "run_worker"
        assert labels["dagster/run-id"] == "0f1e2d3c"
        assert labels["dagster/code-location"] == "lake"


def test_values_hold_no_secret_literal(values):
    """Credentials reach pods only through Secrets: no password, token or key value in the file."""

    def walk(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from walk(v, f"{path}[{i}]")
        else:
            yield path, node

    suspicious = [
        p
        for p, v in walk(values)
        if isinstance(v, str)
        and any(w in p.lower() for w in ("password", "token", "secretkey", "accesskey"))
        and not p.lower().endswith("secretname")
    ]
    assert suspicious == []
    assert values["postgresql"]["enabled"] is False and values["generatePostgresqlPasswordSecret"] is False
    deployment = values["dagster-user-deployments"]["deployments"][0]
    assert deployment["dagsterApiGrpcArgs"] == ["--module-name", "kafka_iceberg.lake_assets.definitions"]
    configmap = yaml.safe_load((DEPLOY / "k8s" / "lake-env.configmap.yaml").read_text())
    assert not any(w in k for k in configmap["data"] for w in ("PASSWORD", "TOKEN", "SECRET"))


def test_dockerfile_is_non_root_java17_and_pinned():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "openjdk-17-jre-headless" in text
    assert "libpostgresql-jdbc-java" in text
    assert "\nUSER 10001" in text
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    assert '"dagster-k8s==' in pyproject and '"dagster-postgres==' in pyproject
