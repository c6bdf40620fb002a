"""The deployment rehearsal (``make rehearse-deploy``; scenario ``deploy`` of ``make rehearse``): the kit of
deploy/ run as deployed, with a stand-in for the Kubernetes API server, then faults.

* **Image:** deploy/build-image.sh builds the image tree (:func:`devtools.rehearsal.deploy_kit.build_image`,
  the way tests/test_image.py does); every container runs in it as the image's user (uid 10001).
* **Cluster:** :class:`devtools.services.k8s_standin.K8sStandIn` serves the Kubernetes API: it holds the
  ConfigMaps and Secrets (the README's ``lake-env`` and ``lake-secrets``, the charts' own) and runs each
  pod as a process.
* **Code server:** the pod the ``dagster-user-deployments`` chart renders from deploy/helm/values.yaml
  (``dagster api grpc`` with ``dagsterApiGrpcArgs``, ``includeConfigInLaunchedRuns``), run by the stand-in.
* **Instance:** the ``dagster`` chart's dagster.yaml (PostgreSQL storage on :mod:`devtools.services.devpostgres`,
  dagster-k8s's ``K8sRunLauncher``, queued run coordinator, run monitoring and retries), the lake's pools
  at limit 1 (README step 4); ``dagster-daemon run``
  on it. The launcher is dagster-k8s's own, unchanged: it builds each run's Job and creates it through the
  stand-in's API, and run monitoring reads the Job's status back.
* **Data path:** the dev broker (noida-db) as Kafka, the Iceberg catalog on PostgreSQL, the warehouse on
  S3 (moto, :mod:`devtools.services.s3faults`), Slack a recording HTTP server.

What it shows, in order: producers write to two declared tables (and a third, ``audit``); the
``lake_workers`` sensor launches worker runs (nobody starts a run); a worker run's pod is SIGKILLed while
a micro-batch is in flight and the next run recovers; the code server's pod is deleted (its LAKE_HOME, an
emptyDir, goes with it) and created again; the producers stop and both tables are reconciled record by
record (:func:`devtools.rehearsal.run.reconcile`): 0 lost, 0 duplicated. Last, rows of ``audit`` are
written twice outside the write path; its full-scan ``duplicate_free`` check, which the worker run serving it
runs every minute by the table's ``maintenance.full_check`` cron, fails, and the Slack stand-in receives that
check's alert once, however often the check fails again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devtools.bench.freshness import stop_daemon
from devtools.demo.data import create_topic
from devtools.polling import wait_for
from devtools.rehearsal import deploy_kit as kit
from devtools.rehearsal.acl import SlackRecorder
from devtools.rehearsal.run import ScenarioResult, Tally, Traffic, reconcile, table_declaration
from devtools.services import devbroker, devpostgres
from devtools.services.k8s_standin import ImageConfig, K8sStandIn
from devtools.services.s3faults import KEY, REGION, SECRET, aws_sdk_jars, start_moto
from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.batch.recovery import commit_token, parse_attempt
from kafka_iceberg.catalog.config import catalog_config_from_env
from kafka_iceberg.catalog.tables import load_table, read_state
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.lake_assets.vocabulary import table_key

BIN = Path(sys.executable).parent
BUCKET = "lake-warehouse"
SLACK_TOKEN = "xoxb-rehearsal"
PG_PASSWORD = "lakepw"  # devpostgres's user lake


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Deployment:
    """The running deployment: services, the stand-in, the instance's home, the code server pod."""

    work: Path
    bootstrap: str
    specs: dict = field(default_factory=dict)  # name -> TableSpec
    started: list = field(default_factory=list)  # (what, stop callable), stopped in reverse
    code_port: int = 0
    code_pod: str = ""
    pods_made: int = 0
    lake_env: dict = field(default_factory=dict)
    daemon_env: dict = field(default_factory=dict)
    workspace: Path | None = None

    @property
    def image_root(self) -> Path:
        """The image tree (:func:`devtools.rehearsal.deploy_kit.build_image`) every pod runs from."""
        return self.work / "image"

    def stop(self) -> None:
        for what, stop in reversed(self.started):
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                say(f"   stopping {what}: {type(exc).__name__}: {exc}")


def _tables(bootstrap: str) -> dict[str, dict]:
    """Three declarations (rehearsal.<name>): two tables ingested exactly once, and ``audit`` whose
    full-scan check runs every minute."""
    config = KafkaConfig(bootstrap, {}, 20.0)
    suffix = uuid.uuid4().hex[:6]
    out = {}
    for name in ("orders", "payments", "audit"):
        topic = f"deploy.{name}_{suffix}"
        create_topic(config, topic, 2, {"retention.ms": "-1"})
        decl = table_declaration(f"{name}_{suffix}", topic, 20_000)
        decl["lag"] = {"max_offset_lag": 200, "max_interval": "10s"}
        if name == "audit":
            decl["maintenance"] = {"full_check": "* * * * *"}
        out[name] = decl
    return out


def _catalog_properties(pg_port: int, s3_endpoint: str) -> dict[str, str]:
    return {
        "type": "sql",
        "uri": f"postgresql://lake@127.0.0.1:{pg_port}/iceberg",
        "warehouse": f"s3://{BUCKET}/prod",
        "s3.endpoint": s3_endpoint,
        "s3.region": REGION,
        "s3.path-style-access": "true",
    }


def _start_services(dep: Deployment, slack: SlackRecorder) -> tuple:
    """PostgreSQL (catalog database ``iceberg``, instance database ``dagster``) and moto; returns
    (postgres server, moto server, lake-env overrides, lake-secrets)."""
    pg = devpostgres.create(dep.work / "postgres")
    dep.started.append(("postgres", pg.destroy))
    createdb = [str(devpostgres.PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "lake", "dagster"]
    devpostgres.run_command(createdb, pg.log, env={**os.environ, "PGPASSWORD": PG_PASSWORD})
    s3 = start_moto(dep.work / "moto.log", devbroker.free_port())
    dep.started.append(("moto", s3.stop))
    s3.client().create_bucket(Bucket=BUCKET)
    overrides = {
        "KAFKA_BOOTSTRAP_SERVERS": dep.bootstrap,
        "LAKE_CATALOG_PROPERTIES": json.dumps(_catalog_properties(pg.port, s3.endpoint)),
        "LAKE_DEFS_MODULE": None,
        "LAKE_TABLES_FILE": kit.TABLES_PATH,  # the derived image's declarations file
        "SPARK_MASTER": "local[1]",
        # the AWS SDK jars stand in for WITH_S3=1's iceberg-aws-bundle
        "LAKE_SPARK_CONF": json.dumps(
            {
                "spark.driver.memory": "1g",
                "spark.jars": ",".join(kit.in_image_deps(dep.image_root, j) for j in aws_sdk_jars()),
            }
        ),
        "LAKE_WORKERS": "1",
        "LAKE_METRICS_PORT": "0",  # other processes of this machine may hold 9464
        "DAGSTER_UI_URL": "http://127.0.0.1:3000",
        "SLACK_API_BASE_URL": slack.base_url,
    }
    secrets = {
        "PYICEBERG_CATALOG__LAKE__PASSWORD": PG_PASSWORD,
        "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": KEY,
        "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": SECRET,
        "SLACK_BOT_TOKEN": SLACK_TOKEN,
    }
    return pg, s3, overrides, secrets


def _catalog(dep: Deployment):
    env = {k: v for k, v in dep.lake_env.items() if k.startswith("LAKE_CATALOG")}
    env.update(
        PYICEBERG_CATALOG__LAKE__PASSWORD=PG_PASSWORD,
        PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID=KEY,
        PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY=SECRET,
    )
    return catalog_config_from_env(env).load()


def _dagster(args: list[str], env: dict[str, str], log: Path, timeout_s: float = 300) -> None:
    with open(log, "ab") as out:
        done = subprocess.run(
            [str(BIN / args[0]), *args[1:]], env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (rc {done.returncode}); see {log}")


def start_code_server(dep: Deployment, standin: K8sStandIn) -> str:
    """Create the code server's pod (a new name: a new pod, a new emptyDir LAKE_HOME) and wait until it
    answers a health check. Raises RuntimeError when it exits or stays silent for 300 s."""
    dep.pods_made += 1
    name = f"{kit.FULLNAME}-lake-{dep.pods_made}"
    pod = standin.run_pod(kit.code_server_pod(name, dep.code_port), kit.NAMESPACE)
    health = [str(BIN / "dagster"), "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(dep.code_port)]
    ok = wait_for(
        lambda: pod.exit_code() is not None or subprocess.run(health, capture_output=True).returncode == 0, 300, 1.0
    )
    if not ok or pod.exit_code() is not None:
        tail = (pod.directory / "log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"code server pod {name} did not start: {pod.reason} {tail}")
    dep.code_pod = name
    return name


def deploy(dep: Deployment, slack: SlackRecorder) -> tuple[K8sStandIn, Path, object]:
    """Build the image, start the services, the stand-in, the code server and the daemon. Returns
    (stand-in, the instance's DAGSTER_HOME, the DagsterInstance the rehearsal inspects runs with)."""
    from dagster import DagsterInstance

    from kafka_iceberg.lake_assets.vocabulary import table_pool, worker_pool

    decls = _tables(dep.bootstrap)
    dep.specs = {k: parse_table_spec(d) for k, d in decls.items()}
    pg, _, overrides, secrets = _start_services(dep, slack)
    t0 = time.monotonic()
    root = dep.image_root
    kit.build_image(root, yaml.safe_dump({"tables": list(decls.values())}, sort_keys=False))
    say(f"   image tree built by deploy/build-image.sh in {time.monotonic() - t0:.0f} s: {root}")
    env, workdir, user = kit.dockerfile_config()
    standin = K8sStandIn(root, ImageConfig(kit.image_env(), workdir, user, user_name=kit.IMAGE_USER), dep.work / "pods")
    standin.start()
    dep.started.append(("the stand-in's pods", standin.stop))
    kubeconfig = standin.write_kubeconfig(dep.work / "kubeconfig", kit.NAMESPACE)
    lake_env = kit.lake_env(overrides)
    dep.lake_env = dict(lake_env["data"])
    instance = kit.instance_yaml(pg.port, kubeconfig)
    for manifest in kit.cluster_objects(instance, lake_env, secrets, PG_PASSWORD):
        standin.apply(manifest, kit.NAMESPACE)
    say(f"   lake-env: the kit's ConfigMap, set for this machine: {', '.join(kit.local_overrides(lake_env))}")
    home = dep.work / "dagster_home"
    home.mkdir()
    # the instance's local artifact storage is $DAGSTER_HOME/storage of the daemon, and run pods use the
    # same path (the step outputs of the fs io manager): in a cluster that is the image's DAGSTER_HOME,
    # which uid 10001 owns; here the daemon's directory on this host, so the image's user may write there
    (home / "storage").mkdir()
    (home / "storage").chmod(0o1777)
    (home / "dagster.yaml").write_text(instance)
    daemon_env = kit.daemon_env(home, PG_PASSWORD)
    os.environ["DAGSTER_PG_PASSWORD"] = PG_PASSWORD  # for this process's view of the instance
    _dagster(["dagster", "instance", "migrate"], daemon_env, dep.work / "instance.log")
    pools = [worker_pool(0), *(table_pool(s, False) for s in dep.specs.values())]
    for pool in pools:  # deploy/README.md step 4
        _dagster(["dagster", "instance", "concurrency", "set", pool, "1"], daemon_env, dep.work / "instance.log")
    say(f"   instance: dagster-postgres on 127.0.0.1:{pg.port}, K8sRunLauncher -> {standin.url}; pools {pools} at 1")
    dep.code_port = devbroker.free_port()
    start_code_server(dep, standin)
    say(f"   code server pod {dep.code_pod} answers on 127.0.0.1:{dep.code_port}")
    workspace = home / "workspace.yaml"
    entry = {"grpc_server": {"host": "127.0.0.1", "port": dep.code_port, "location_name": kit.deployment()["name"]}}
    workspace.write_text(yaml.safe_dump({"load_from": [entry]}))
    with open(dep.work / "daemon.log", "ab") as out:
        daemon = subprocess.Popen(
            [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)],
            env=daemon_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    dep.started.append(("dagster-daemon", lambda: stop_daemon(daemon, grace_s=30)))
    dep.daemon_env, dep.workspace = daemon_env, workspace
    return standin, home, DagsterInstance.from_config(str(home))


# -- inspection -------------------------------------------------------------------------------------
def worker_runs(instance, statuses=None) -> list:
    from dagster import RunsFilter

    flt = RunsFilter(statuses=statuses, tags={"dagster/sensor_name": "lake_workers"})
    return list(instance.get_runs(filters=flt))


def all_runs(instance) -> list:
    return list(instance.get_runs())


def lag(dep: Deployment, catalog, name: str) -> int:
    spec = dep.specs[name]
    kafka = KafkaMetadata(KafkaConfig(dep.bootstrap, {}, 20.0))
    return sum(offset_lag(kafka.watermarks(spec.topic), read_state(catalog, spec.identifier).offsets).values())


def in_flight(dep: Deployment, catalog, run_id: str) -> str | None:
    """The table on which run ``run_id`` has an attempt branch (a micro-batch in flight), else None."""
    token = commit_token(run_id)
    for name in ("orders", "payments"):
        table = load_table(catalog, dep.specs[name].identifier)
        for ref in table.metadata.refs if table is not None else {}:
            attempt = parse_attempt(ref)
            if attempt is not None and attempt.token == token:
                return name
    return None


def branches_left(dep: Deployment, catalog) -> list[str]:
    left = []
    for spec in dep.specs.values():
        for ident in (spec.identifier, spec.bad_records.dead_letter_identifier):
            table = load_table(catalog, ident)
            left += [f"{ident}@{r}" for r in (table.metadata.refs if table is not None else {}) if r != "main"]
    return left


def how_it_ended(instance, run_id: str) -> str:
    """The run's status and the last engine message saying why it failed (run monitoring or liveness)."""
    run = instance.get_run_by_id(run_id)
    messages = [
        e.message
        for e in instance.all_logs(run_id)
        if e.message and ("K8s job" in e.message or "worker" in e.message.lower() or "failed" in e.message.lower())
    ]
    return f"{run.status.value}: {messages[-1].splitlines()[0][:160] if messages else '-'}"


# -- the phases -------------------------------------------------------------------------------------------
def describe_job(standin: K8sStandIn, run_id: str) -> str:
    """One line on the Job K8sRunLauncher created for run ``run_id`` (as the stand-in received it)."""
    from dagster_k8s.job import get_job_name_from_run_id

    job = standin.jobs.get((kit.NAMESPACE, get_job_name_from_run_id(run_id)))
    if job is None:
        return f"no Job for run {run_id[:8]}"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    sources = [next(iter(s.values()))["name"] for s in container.get("envFrom", [])]
    mounts = [f"{m['name']}:{m['mountPath']}" for m in container.get("volumeMounts", [])]
    limits = (container.get("resources") or {}).get("limits", {})
    pods = standin.pods_of_job(job["metadata"]["name"], kit.NAMESPACE)
    argv = json.loads((pods[0].directory / "argv.json").read_text())["argv"] if pods else []
    uid = argv[argv.index("--reuid") + 1] if "--reuid" in argv else "this process's"
    return (
        f"Job {job['metadata']['name'][:21]}... (built by dagster-k8s): image {container['image']}, "
        f"args {' '.join(container['args'][:3])} ..., envFrom {sources}, mounts {mounts}, "
        f"memory limit {limits.get('memory')}, pod user {uid}"
    )


def phase_ingest(dep: Deployment, standin: K8sStandIn, instance, catalog, checks: dict) -> None:
    say("== runs launched by the lake_workers sensor (the daemon; no run started by hand)")
    run = wait_for(lambda: worker_runs(instance, _started()), 600, 2.0)
    checks["the sensor launched a worker run"] = bool(run)
    if not run:
        raise RuntimeError(f"no worker run started within 600 s; daemon log {dep.work / 'daemon.log'}")
    say(f"   {describe_job(standin, run[0].run_id)}")
    committed = wait_for(lambda: all(_committed(catalog, dep.specs[n]) for n in ("orders", "payments")), 600, 2.0)
    checks["its pod committed to both tables"] = bool(committed)
    say(f"   worker run {run[0].run_id[:8]} (pod of Job dagster-run-{run[0].run_id[:8]}...) committed to both tables")


def _started():
    from dagster import DagsterRunStatus

    return [DagsterRunStatus.STARTED]


def _committed(catalog, spec) -> bool:
    table = load_table(catalog, spec.identifier)
    return table is not None and table.current_snapshot() is not None


def phase_kill(dep: Deployment, standin: K8sStandIn, instance, catalog, checks: dict) -> str:
    """SIGKILL a worker run's pod while it has a micro-batch in flight; returns the killed run's id."""
    from dagster import DagsterRunStatus
    from dagster_k8s.job import get_job_name_from_run_id

    say("== a worker run's pod SIGKILLed mid-micro-batch")

    def target():
        for run in worker_runs(instance, _started()):
            table = in_flight(dep, catalog, run.run_id)
            if table:
                return run, table
        return None

    found = wait_for(target, 600, 0.2)
    checks["a micro-batch was in flight at the kill"] = bool(found)
    if not found:
        return ""
    run, table = found
    pods = [
        p for p in standin.pods_of_job(get_job_name_from_run_id(run.run_id), kit.NAMESPACE) if p.phase() == "Running"
    ]
    checks["the run's pod was running"] = bool(pods)
    if not pods:
        return ""
    pod = pods[0]
    standin.kill_pod(pod.name, kit.NAMESPACE)
    t_kill = time.monotonic()
    say(f"   SIGKILL pod {pod.name} of run {run.run_id[:8]} with an attempt branch open on {table}")
    ended = wait_for(lambda: instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE, 600, 2.0)
    checks["the killed run was marked failed"] = bool(ended)
    say(f"   run {run.run_id[:8]} {how_it_ended(instance, run.run_id)} ({time.monotonic() - t_kill:.0f} s after)")
    nxt = wait_for(lambda: [r for r in worker_runs(instance, _started()) if r.run_id != run.run_id], 900, 2.0)
    checks["a next worker run started"] = bool(nxt)
    recovered = wait_for(lambda: in_flight(dep, catalog, run.run_id) is None, 900, 2.0)
    checks["the next run recovered the killed attempt (its branch is gone)"] = bool(recovered)
    if nxt:
        say(f"   next run {nxt[0].run_id[:8]} started; the killed attempt's branch removed: {bool(recovered)}")
    return run.run_id


def phase_restart(dep: Deployment, standin: K8sStandIn, checks: dict) -> None:
    """Delete the code server's pod (its LAKE_HOME emptyDir with it) and create it again."""
    say("== code server pod restart (its LAKE_HOME, an emptyDir, wiped)")
    old = standin.pods[(kit.NAMESPACE, dep.code_pod)]
    lake_home = old.directory / "volumes" / "spark-scratch"
    standin.stop_pod(kit.NAMESPACE, dep.code_pod)
    shutil.rmtree(old.directory / "volumes")  # the kubelet deletes a deleted pod's emptyDir
    checks["the old pod's LAKE_HOME is gone"] = not lake_home.exists()
    t0 = time.monotonic()
    name = start_code_server(dep, standin)
    checks["the new code server pod serves"] = True
    say(f"   pod {old.name} deleted, {name} serving again after {time.monotonic() - t0:.0f} s")


def phase_reconcile(dep: Deployment, instance, catalog, traffic: dict, killed: str, checks: dict) -> list[Tally]:
    say("== producers stopped; the sensor-launched runs catch up; every record reconciled")
    for t in traffic.values():
        t.stop()
    caught = wait_for(lambda: all(lag(dep, catalog, n) == 0 for n in traffic), 1200, 3.0)
    checks["both tables caught up (lag 0) by sensor-launched runs"] = bool(caught)
    tallies = []
    for name in ("orders", "payments"):
        spec, t = dep.specs[name], traffic[name]
        tally = reconcile(catalog, spec, t.expected())
        tallies.append(tally)
        checks[f"{name}: exactly once"] = tally.clean and not t.errors
        say(
            f"   {spec.identifier}: produced {tally.produced}, rows {tally.in_table}, quarantined {tally.quarantined}, "
            f"lost {tally.lost}, duplicates {tally.duplicates}, mismatched {tally.mismatched}, unexpected {tally.unexpected}"
        )
    left = branches_left(dep, catalog)
    checks["no attempt branch left"] = not left
    from dagster import DagsterRunStatus

    failed = [r.run_id for r in all_runs(instance) if r.status == DagsterRunStatus.FAILURE and r.run_id != killed]
    checks["no run failed but the killed one"] = not failed
    for run_id in failed:
        say(f"   run {run_id[:8]} failed: {how_it_ended(instance, run_id)}")
    hand = [r.run_id[:8] for r in all_runs(instance) if not _launched_by_daemon(r)]
    checks["every run was launched by a sensor, a schedule or a retry"] = not hand
    runs = worker_runs(instance)
    say(f"   {len(runs)} worker runs launched by the sensor; runs not launched by the daemon: {hand or 'none'}")
    return tallies


def _launched_by_daemon(run) -> bool:
    tags = run.tags
    return any(k in tags for k in ("dagster/sensor_name", "dagster/schedule_name", "dagster/parent_run_id"))


def phase_check_alert(dep: Deployment, catalog, slack: SlackRecorder, instance, checks: dict) -> int:
    """Rows of ``audit`` written twice outside the write path; the full-scan check the worker runs on it every
    minute fails, and alerts once; no incremental pass of a later worker run posts a recovery. Returns the
    number of that check's failure alerts."""
    say("== a check failure reaches Slack once")
    spec = dep.specs["audit"]
    wait_for(lambda: lag(dep, catalog, "audit") == 0, 600, 3.0)
    table = load_table(catalog, spec.identifier)
    copies = table.scan(limit=5).to_arrow()
    since = time.time()
    table.append(copies)  # a writer outside the lake: 5 (partition, offset) records twice
    say(f"   {copies.num_rows} rows of {spec.identifier} appended again by a writer outside the lake")
    done = wait_for(lambda: len(full_scan_verdicts(instance, spec, since)) >= 2, 900, 5.0)
    verdicts = full_scan_verdicts(instance, spec, since)
    checks["two full-scan evaluations of the check failed"] = bool(done) and verdicts.count(False) >= 2
    ours = [m for m in slack.messages if spec.identifier in m and "duplicate_free" in m]
    failures = [m for m in ours if "passes again" not in m]
    checks["the check's failure reached Slack exactly once"] = len(failures) == 1
    checks["no 'passes again' while the duplicates stay"] = len(ours) == len(failures)
    say(f"   full-scan evaluations by the worker runs since the append (passed): {verdicts}")
    say(
        f"   Slack: {len(slack.messages)} messages in all, "
        f"{len(failures)} duplicate_free failure alert(s) for {spec.identifier}"
    )
    for m in slack.messages:
        say(f"     slack: {m.splitlines()[0][:150]}")
    return len(failures)


def full_scan_verdicts(instance, spec, since: float) -> list[bool]:
    """The ``passed`` of every full-scan ``duplicate_free`` evaluation of ``spec``'s table that a worker run
    logged after ``since`` (seconds since epoch), oldest first."""
    from dagster import DagsterEventType

    key = table_key(spec)
    out = []
    for run in worker_runs(instance):
        for entry in instance.all_logs(run.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = entry.dagster_event.event_specific_data
            scope = evaluation.metadata.get("scope")
            if evaluation.asset_key == key and scope is not None and scope.value == "full" and entry.timestamp > since:
                out.append((entry.timestamp, evaluation.passed))
    return [passed for _, passed in sorted(out)]


def rehearse(work: Path, bootstrap: str) -> tuple[dict[str, bool], list[Tally], str]:
    """The whole rehearsal in ``work`` on the broker at ``bootstrap``: (checks, the two tables' tallies, notes)."""
    dep = Deployment(work, bootstrap)
    slack = SlackRecorder()
    dep.started.append(("slack stand-in", slack.close))
    checks: dict[str, bool] = {}
    traffic: dict[str, Traffic] = {}
    try:
        standin, _, instance = deploy(dep, slack)
        catalog = _catalog(dep)
        config = KafkaConfig(bootstrap, {}, 20.0)
        for name, rate in (("orders", 80.0), ("payments", 40.0), ("audit", 5.0)):
            traffic[name] = Traffic(config, dep.specs[name].topic, rate)
            traffic[name].start()
        phase_ingest(dep, standin, instance, catalog, checks)
        killed = phase_kill(dep, standin, instance, catalog, checks)
        phase_restart(dep, standin, checks)
        time.sleep(20)  # the producers go on writing past the restart
        tallies = phase_reconcile(dep, instance, catalog, traffic, killed, checks)
        alerts = phase_check_alert(dep, catalog, slack, instance, checks)
        notes = (
            f"run {killed[:8]} killed mid-micro-batch and recovered; code server pod restarted; "
            f"{len(worker_runs(instance))} worker runs; {alerts} check alert(s) of {len(slack.messages)} Slack messages"
        )
        return checks, tallies, notes
    finally:
        for t in traffic.values():
            t.stop()
        dep.stop()


def scenario(r, args) -> ScenarioResult:
    """Scenario ``deploy`` of ``make rehearse`` on the rehearsal's broker."""
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lake-deploy-", dir="/tmp"))
    work.chmod(0o755)
    try:
        checks, tallies, notes = rehearse(work, r.lake.bootstrap)
    except Exception as exc:
        checks, tallies, notes = {"rehearsal ran to its end": False}, [], f"{type(exc).__name__}: {exc}"[:500]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = Tally.total(tallies)
    return ScenarioResult("deployment (K8sRunLauncher, stand-in API)", 2, total, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add scenario ``deploy`` to the rehearsal's registry."""
    scenarios["deploy"] = scenario


def main() -> int:
    """``python -m devtools.rehearsal.deploy [--keep]`` (``make rehearse-deploy``): the rehearsal on a dev
    broker of its own; prints each phase and the checks; exit 1 when one failed. ``--keep`` keeps the
    work directory (pods' logs, the daemon's log) for a look afterwards."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop what it started, then exit
    work = Path(tempfile.mkdtemp(prefix="lake-deploy-", dir="/tmp"))
    work.chmod(0o755)
    say(f"deployment rehearsal in {work} (commit {_commit()})")
    bootstrap = devbroker.start(work / "kafka", devbroker.free_port())
    t0 = time.monotonic()
    try:
        checks, _, notes = rehearse(work, bootstrap)
    finally:
        devbroker.stop(work / "kafka")
    say("\n== checks")
    for name, ok in checks.items():
        say(f"   {'PASS' if ok else 'FAIL'}  {name}")
    passed = all(checks.values())
    say(f"\n{notes}\n{'all passed' if passed else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    if "--keep" not in sys.argv[1:]:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if passed else 1


def _commit() -> str:
    from kafka_iceberg.config.settings import CHECKOUT

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=CHECKOUT, capture_output=True, text=True)
    return done.stdout.strip() or "?"


__all__ = ["Deployment", "deploy", "main", "register", "rehearse", "scenario", "start_code_server"]

if __name__ == "__main__":
    sys.exit(main())
