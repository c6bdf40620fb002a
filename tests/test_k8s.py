"""The Kubernetes deployment, checked without a cluster.

* deploy/helm/values.yaml (values of the official ``dagster/dagster-user-deployments`` chart: one code
  location added to an existing Dagster) validates against that chart's values.schema.json, vendored
  under deploy/helm/vendor/. The schema's Kubernetes object types ``$ref`` kubernetesjsonschema.dev;
  with no network here those resolve to an accept-all schema (the chart's own structure and types
  are checked, not the inside of Kubernetes objects).
* The run pod the instance's K8sRunLauncher builds for this location carries the location's env
  sources, env (SPARK_LOCAL_IP from the pod IP) and volumes (dagster-k8s's own job builder).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes
import pytest
import yaml
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from kafka_iceberg.config.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
HELM = DEPLOY / "helm"
VENDOR = HELM / "vendor"


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def values() -> dict:
    return load_yaml(HELM / "values.yaml")


def user_deployments_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((VENDOR / "dagster-user-deployments" / "values.schema.json").read_text())
    # Kubernetes object types $ref a remote document's #/definitions/<type>: with no network here,
    # an offline stand-in document gives every name the schema points at an accept-all schema
    names = {
        d["$ref"].split("#/definitions/")[1].split("/")[0]
        for d in schema["$defs"].values()
        if d.get("$ref", "").startswith("https://")
    }
    stand_in = {
        "definitions": {n: {"properties": {"annotations": {}, "nodeSelector": {}, "tolerations": {}}} for n in names}
    }

    def retrieve(uri: str) -> Resource:
        assert uri.startswith("https://kubernetesjsonschema.dev/"), f"unexpected remote $ref {uri}"
        return Resource.from_contents(stand_in, default_specification=DRAFT202012)

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema, registry=Registry(retrieve=retrieve))


def test_values_validate_against_the_user_deployments_chart_schema(values):
    errors = sorted(user_deployments_validator().iter_errors(values), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_the_schema_rejects_a_wrong_value(values):
    """The validation is not vacuous: local $refs resolve and the chart's own types are enforced."""
    broken = json.loads(json.dumps(values))
    broken["deployments"][0]["port"] = "3030"
    del broken["deployments"][0]["image"]["pullPolicy"]
    broken["deployments"][0]["includeConfigInLaunchedRuns"] = {}
    messages = [e.message for e in user_deployments_validator().iter_errors(broken)]
    assert len(messages) >= 3, messages


def test_code_location_module_env_and_spark_local_ip(values):
    (deployment,) = values["deployments"]
    assert deployment["name"] == "lake"
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "kafka_iceberg.lake_assets.definitions"]
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}
    assert {"name": "lake-env"} in deployment["envConfigMaps"]
    assert {"name": "lake-secrets"} in deployment["envSecrets"]
    spark_ip = next(e for e in deployment["env"] if e["name"] == "SPARK_LOCAL_IP")
    assert spark_ip == {"name": "SPARK_LOCAL_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert set(deployment["resources"]) == {"requests", "limits"}
    assert values["global"]["dagsterHome"] == values["dagsterHome"]
    assert values["global"]["postgresqlSecretName"] == values["postgresqlSecretName"]


def test_values_hold_no_secret_literal(values):
    """Credentials reach pods only through Secrets: no password, token or key value in the files."""

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
    configmap = load_yaml(DEPLOY / "k8s" / "lake-env.configmap.yaml")
    assert not any(w in k for k in configmap["data"] for w in ("PASSWORD", "TOKEN", "SECRET"))
    assert "SPARK_LOCAL_IP" not in configmap["data"]  # the pod sets it from its own IP


def test_the_lakes_pools_and_run_tags_are_its_own():
    from types import SimpleNamespace

    from kafka_iceberg.lake_assets import vocabulary

    spec = SimpleNamespace(identifier="shop.orders")  # table_pool reads the identifier only
    pools = [vocabulary.table_pool(spec, False), vocabulary.table_pool(spec, True), vocabulary.worker_pool(0)]
    assert pools == ["lake/table/shop_orders", "lake/sqlite_catalog", "lake/worker/0"]
    assert vocabulary.RUN_RETRY_TAGS["dagster/max_retries"] == "2"
    # the dev instance's run_retries: the same retries, there for every run
    assert load_yaml(ROOT / "dagster.yaml")["run_retries"]["max_retries"] == 2


def test_run_pod_carries_the_location_config(values):
    """includeConfigInLaunchedRuns: the run Job K8sRunLauncher builds carries the location's config."""
    (deployment,) = values["deployments"]
    job_config = DagsterK8sJobConfig(
        job_image=f"{deployment['image']['repository']}:{deployment['image']['tag']}",
        dagster_home=values["dagsterHome"],
        instance_config_map="dagster-instance",
        postgres_password_secret=values["postgresqlSecretName"],
        env_config_maps=[c["name"] for c in deployment["envConfigMaps"]],
        env_secrets=[s["name"] for s in deployment["envSecrets"]],
        volumes=deployment["volumes"],
        volume_mounts=deployment["volumeMounts"],
        labels=deployment["labels"],
        service_account_name=values["global"]["serviceAccountName"],
    )
    job = construct_dagster_k8s_job(
        job_config=job_config,
        args=["dagster", "api", "execute_run", "{}"],
        job_name="dagster-run-0f1e2d3c",
        pod_name="dagster-run-0f1e2d3c",
        component="run_worker",
        # a location's env entries with valueFrom reach the run container as container config
        user_defined_k8s_config=UserDefinedDagsterK8sConfig(container_config={"env": deployment["env"]}),
        labels={"dagster/run-id": "0f1e2d3c", "dagster/code-location": deployment["name"]},
    )
    job = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/data-platform/kafka-iceberg-lake:0.1.0"
    assert {"configMapRef": {"name": "lake-env"}} in container["envFrom"]
    assert {"secretRef": {"name": "lake-secrets"}} in container["envFrom"]
    spark_ip = next(e for e in container["env"] if e["name"] == "SPARK_LOCAL_IP")
    assert spark_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    pg = next(e for e in container["env"] if e["name"] == "DAGSTER_PG_PASSWORD")
    assert pg["valueFrom"]["secretKeyRef"] == {"name": "dagster-postgresql-secret", "key": "postgresql-password"}
    assert {"name": "spark-scratch", "mountPath": "/opt/dagster/lake"} in container["volumeMounts"]
    assert pod["serviceAccountName"] == "dagster"
    assert job["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kafka-iceberg-lake"


def test_dockerfile_installs_the_lock_and_bakes_no_spark_local_ip():
    text = (DEPLOY / "Dockerfile").read_text()
    script = (DEPLOY / "build-image.sh").read_text()  # the image's steps (tests/test_image.py runs it)
    assert 'LOCK="${LAKE_IMAGE_LOCK-requirements-runtime.lock}"' in script and "--require-hashes" in script
    assert "--no-deps" in script
    assert "SPARK_LOCAL_IP=" not in text
    assert "ARG WITH_S3" in text and "iceberg-aws-bundle-${ICEBERG_VERSION}.jar" in script
    assert "openjdk-17-jre-headless" in text and "libpostgresql-jdbc-java" in text
    assert "/usr/lib/jvm/java-17-openjdk-amd64" not in text  # JAVA_HOME portable across arm64/amd64
    assert "\nUSER 10001" in text
    assert "kafka_iceberg.lake_assets.definitions" in text


def _pod_environment(tmp_path: Path, drop: tuple[str, ...] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """The environment of a pod with the documented ConfigMap and Secret (deploy/README.md): the
    ConfigMap's data without ``drop``, the Secret's keys with stand-in values; no LAKE_DEV."""
    data = load_yaml(DEPLOY / "k8s" / "lake-env.configmap.yaml")["data"]
    secrets = {key: f"secret-value-{i}" for i, key in enumerate(documented_secret_keys())}
    env = {k: v for k, v in data.items() if k not in drop}
    env.update(secrets, PATH=os.environ["PATH"], HOME=str(tmp_path), LAKE_HOME=str(tmp_path / "lake"))
    env["DAGSTER_HOME"] = str(tmp_path / "dagster")
    return env, secrets


def documented_secret_keys() -> list[str]:
    """The keys deploy/README.md puts into the Secret ``lake-secrets`` (``--from-literal=KEY=...``)."""
    readme = (DEPLOY / "README.md").read_text()
    return re.findall(r"--from-literal=([A-Z0-9_]+)=", readme)


def test_the_documented_configmap_and_secret_name_the_catalog_and_keep_credentials_out(tmp_path):
    env, secrets = _pod_environment(tmp_path)
    assert "PYICEBERG_CATALOG__LAKE__PASSWORD" in secrets and "SLACK_BOT_TOKEN" in secrets
    settings = load_settings(env=env)
    assert settings.catalog.jdbc_password == secrets["PYICEBERG_CATALOG__LAKE__PASSWORD"]
    assert settings.catalog.warehouse.startswith("s3://") and not settings.catalog.is_sqlite
    assert settings.slack.token.get_secret_value() == secrets["SLACK_BOT_TOKEN"]
    assert not any(v in repr(settings) for v in secrets.values()), "a credential is never printed"


@pytest.mark.parametrize(
    "entry",
    [
        ["-m", "kafka_iceberg.lake_assets.cli", "status"],
        ["-c", "import kafka_iceberg.lake_assets.definitions"],
    ],
)
def test_without_a_catalog_the_installed_package_refuses_to_load(tmp_path, entry):
    """The documented ConfigMap and Secret without the catalog: loading exits non-zero naming the
    catalog setting; no SQLite file appears and no demo table is served."""
    env, secrets = _pod_environment(tmp_path, drop=("LAKE_CATALOG_PROPERTIES",))
    out = subprocess.run([sys.executable, *entry], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "LAKE_CATALOG_PROPERTIES (or LAKE_CATALOG_URI) is not set" in out.stderr, out.stderr[-2000:]
    if entry[1].endswith("cli"):
        assert out.stderr.strip().count("\n") == 0, f"one line: {out.stderr}"
    printed = out.stdout + out.stderr
    assert not any(v in printed for v in secrets.values()), "a credential is never printed"
    assert not list(tmp_path.rglob("*.db")), "no SQLite catalog appears"
    assert "nyc" not in printed


def test_without_tables_the_location_serves_no_demo_table(tmp_path):
    env, _ = _pod_environment(tmp_path, drop=("LAKE_DEFS_MODULE",))
    probe = "import kafka_iceberg.lake_assets.definitions as d; print(sorted(s.identifier for s in d.specs))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0 and "LAKE_TABLES_FILE (or LAKE_DEFS_MODULE) is not set" in out.stderr, out.stderr
    assert "nyc." not in out.stdout


def test_run_pods_get_the_spark_drivers_resources_not_the_code_servers(values, tmp_path):
    """The lake's runs carry a dagster-k8s/config tag sized from the ConfigMap's Spark settings; merged
    after the location's container context (includeConfigInLaunchedRuns), it replaces the code server's
    resources in the Job dagster-k8s builds."""
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import get_user_defined_k8s_config

    from kafka_iceberg.config.run_pods import memory_mib, run_pod_tags

    (deployment,) = values["deployments"]
    env, _ = _pod_environment(tmp_path)
    tags = run_pod_tags(load_settings(env=env))
    location = K8sContainerContext(resources=deployment["resources"], env_config_maps=["lake-env"])
    context = location.merge(K8sContainerContext(run_k8s_config=get_user_defined_k8s_config(tags)))
    job = construct_dagster_k8s_job(
        job_config=DagsterK8sJobConfig(job_image="lake:0.1.0", dagster_home=values["dagsterHome"]),
        args=["dagster", "api", "execute_run", "{}"],
        job_name="dagster-run-1",
        user_defined_k8s_config=context.run_k8s_config,
        component="run_worker",
    )
    (container,) = kubernetes.client.ApiClient().sanitize_for_serialization(job)["spec"]["template"]["spec"][
        "containers"
    ]
    run_memory = container["resources"]["limits"]["memory"]
    driver = json.loads(load_yaml(DEPLOY / "k8s" / "lake-env.configmap.yaml")["data"]["LAKE_SPARK_CONF"])[
        "spark.driver.memory"
    ]
    assert run_memory != deployment["resources"]["limits"]["memory"]
    assert memory_mib(run_memory.removesuffix("i")) >= memory_mib(driver) + 384 + 1024  # heap + overhead + Python
    assert container["resources"]["requests"]["cpu"] == "2"  # SPARK_MASTER local[2]
    assert memory_mib("512m") == 512 and memory_mib("2g") == 2048 and memory_mib(str(2**30)) == 1024


def _settings_variables() -> set[str]:
    from kafka_iceberg.config import models

    groups = [g for g in vars(models).values() if isinstance(g, type) and issubclass(g, models.EnvGroup)]
    return {f.validation_alias for g in groups for f in g.model_fields.values() if f.validation_alias}


def test_the_names_shared_by_the_kit_agree(values):
    """Dockerfile, build script, Helm values, ConfigMap, Secret, docs and settings name the same things."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    script = (DEPLOY / "build-image.sh").read_text()
    readme = (DEPLOY / "README.md").read_text()
    reasons = (ROOT / "docs" / "deployment.md").read_text()
    configmap = load_yaml(DEPLOY / "k8s" / "lake-env.configmap.yaml")
    (deployment,) = values["deployments"]
    env = dict(re.findall(r"(\w+)=(/\S+)", dockerfile.split("ENV ", 1)[1].split("\n\n", 1)[0]))
    # the image's layout: Dockerfile, build script and values
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, re.M)[1]
    assert f"WORKDIR={workdir}" in script and workdir in readme and workdir in reasons
    assert env["DAGSTER_HOME"] == values["dagsterHome"] == values["global"]["dagsterHome"]
    assert f"DAGSTER_HOME_DIR={env['DAGSTER_HOME']}" in script and f"LAKE_HOME_DIR={env['LAKE_HOME']}" in script
    assert {"name": "spark-scratch", "mountPath": env["LAKE_HOME"]} in deployment["volumeMounts"]
    uid = int(re.search(r"^USER (\d+)", dockerfile, re.M)[1])
    assert f"IMAGE_UID={uid}" in script and deployment["podSecurityContext"]["runAsUser"] == uid
    assert f"uid {uid}" in readme
    # the code location: module and port
    module = deployment["dagsterApiGrpcArgs"][deployment["dagsterApiGrpcArgs"].index("-m") + 1]
    assert module == "kafka_iceberg.lake_assets.definitions" and f'"-m", "{module}"' in dockerfile
    assert f"EXPOSE {deployment['port']}" in dockerfile and f"port: {deployment['port']}" in readme
    # ConfigMap and Secret: the names the values use, the README creates, the settings read
    assert deployment["envConfigMaps"] == [{"name": configmap["metadata"]["name"]}]
    assert f"-f deploy/k8s/{'lake-env.configmap.yaml'}" in readme and configmap["metadata"]["name"] in readme
    (secret,) = deployment["envSecrets"]
    assert f"create secret generic {secret['name']}" in readme
    known = _settings_variables()
    assert set(configmap["data"]) <= known, set(configmap["data"]) - known
    for key in documented_secret_keys():
        assert key in known or key.startswith(f"PYICEBERG_CATALOG__{configmap['data']['LAKE_CATALOG_NAME'].upper()}__")
    # the chart version the README installs is the Dagster the lock pins
    (chart,) = set(re.findall(r"--version (\S+)", readme + (HELM / "values.yaml").read_text()))
    lock = (ROOT / "requirements-runtime.lock").read_text()
    assert f"dagster=={chart}" in lock
