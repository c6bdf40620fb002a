"""The Kubernetes API stand-in of the deployment rehearsal (devtools/services/k8s_standin.py) runs the Job
dagster-k8s builds, created through dagster-k8s's own client, as a local process, and reports its status
back the way K8sRunLauncher's run monitoring reads it. Fast: no Spark, no Kafka."""

from __future__ import annotations

import base64
import json

import pytest
from dagster_k8s.client import DagsterKubernetesClient
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig, construct_dagster_k8s_job
from dagster_k8s.utils import load_kubernetes_config

from devtools.polling import wait_for
from devtools.services.k8s_standin import ImageConfig, K8sStandIn

PROBE = (
    "import json, os, sys; "
    "print(json.dumps({'cwd': os.getcwd(), 'uid': os.getuid(), 'env': dict(os.environ), "
    "'mounted': open(os.environ['DAGSTER_HOME'] + '/from_cm').read()})); "
    "sys.exit(int(os.environ.get('EXIT_CODE', '0')))"
)


@pytest.fixture
def standin(tmp_path):
    root = tmp_path / "image"
    (root / "opt" / "app").mkdir(parents=True)
    (root / "opt" / "dagster" / "dagster_home").mkdir(parents=True)
    image = ImageConfig(env={"PATH": "/usr/bin:/bin", "IMAGE_ONLY": "yes"}, workdir="/opt/app")
    server = K8sStandIn(root, image, tmp_path / "pods")
    server.start()
    server.apply({"kind": "ConfigMap", "metadata": {"name": "app-env"}, "data": {"FROM_CONFIGMAP": "cm"}}, "lake")
    secret = {"postgresql-password": base64.b64encode(b"pgpw").decode(), "TOKEN": base64.b64encode(b"tok").decode()}
    server.apply({"kind": "Secret", "metadata": {"name": "pg"}, "data": secret}, "lake")
    load_kubernetes_config(load_incluster_config=False, kubeconfig_file=str(server.write_kubeconfig(tmp_path / "kc")))
    yield server
    server.stop()


def _job(name: str, exit_code: int, config_maps: list[str]) -> object:
    config = DagsterK8sJobConfig(
        job_image="app:1",
        dagster_home="/opt/dagster/dagster_home",
        instance_config_map="dagster-instance",  # dagster-k8s passes the instance in the args
        postgres_password_secret="pg",
        env_config_maps=config_maps,
        env_secrets=["pg"],
        volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "cm", "configMap": {"name": "app-env"}}],
        volume_mounts=[
            {"name": "scratch", "mountPath": "/opt/scratch"},
            # a file mounted into a directory of the image
            {"name": "cm", "mountPath": "/opt/dagster/dagster_home/from_cm", "subPath": "FROM_CONFIGMAP"},
        ],
    )
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env.append({"name": "EXIT_CODE", "value": str(exit_code)})
    return construct_dagster_k8s_job(
        job_config=config,
        args=["python3", "-c", PROBE],
        job_name=name,
        component="run_worker",
        user_defined_k8s_config=UserDefinedDagsterK8sConfig(container_config={"env": env}),
    )


def _finished(client: DagsterKubernetesClient, name: str):
    status = client.get_job_status(name, "lake")
    return status if status is not None and (status.succeeded or status.failed) else None


def test_a_dagster_k8s_job_runs_as_a_process_with_its_environment_and_status(standin, tmp_path):
    client = DagsterKubernetesClient.production_client()
    client.create_namespaced_job_with_retries(_job("dagster-run-ok", 0, ["app-env"]), "lake")
    status = wait_for(lambda: _finished(client, "dagster-run-ok"), 60)
    assert status is not None and status.succeeded == 1 and not status.failed and not status.active
    (pod,) = standin.pods_of_job("dagster-run-ok", "lake")
    seen = json.loads((pod.directory / "log").read_text().splitlines()[-1])
    env = seen["env"]
    assert seen["cwd"] == str(tmp_path / "image" / "opt" / "app")  # the image's WORKDIR, in its tree
    assert env["FROM_CONFIGMAP"] == "cm" and env["TOKEN"] == "tok" and env["IMAGE_ONLY"] == "yes"
    assert env["DAGSTER_PG_PASSWORD"] == "pgpw" and env["POD_IP"] == "127.0.0.1"
    assert seen["mounted"] == "cm"  # a ConfigMap key mounted (subPath) into an image directory
    assert env["DAGSTER_HOME"].startswith(str(pod.directory))  # the per-pod view of the image directory
    assert client.get_pod_names_in_job("dagster-run-ok", "lake") == [pod.name]


def test_a_failing_pod_fails_its_job_and_a_missing_configmap_never_starts(standin):
    client = DagsterKubernetesClient.production_client()
    client.create_namespaced_job_with_retries(_job("dagster-run-bad", 3, ["app-env"]), "lake")
    status = wait_for(lambda: _finished(client, "dagster-run-bad"), 60)
    assert status.failed == 1 and not status.succeeded and not status.active  # backoffLimit 0: no new pod
    client.create_namespaced_job_with_retries(_job("dagster-run-nocm", 0, ["missing"]), "lake")
    status = wait_for(lambda: _finished(client, "dagster-run-nocm"), 30)
    (pod,) = standin.pods_of_job("dagster-run-nocm", "lake")
    assert status.failed == 1 and 'configmap "missing" not found' in pod.reason
    assert client.delete_job("dagster-run-bad", "lake") is True
    assert client.get_job_status("dagster-run-bad", "lake") is None
