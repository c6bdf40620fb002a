"""A stand-in for a Kubernetes API server that runs each Job's pod as a local process.

No Kubernetes runs on the development machine. dagster-k8s's ``K8sRunLauncher`` (unchanged, configured
through a kubeconfig that points at this server) creates its Jobs here, reads their status back for run
monitoring, lists their pods and deletes them; each Job's pod runs as a process of this machine.

What the API serves (JSON over HTTP, the paths of the ``kubernetes`` client; nothing else):

* ``POST/GET/DELETE /apis/batch/v1/namespaces/<ns>/jobs[/<name>[/status]]``: a created Job starts one pod
  at once (no scheduler, no image pull); its ``status`` is ``active`` while the pod's process lives, then
  ``succeeded`` or ``failed`` by its exit code, with the ``Complete``/``Failed`` condition. A failed pod
  is replaced up to ``spec.backoffLimit`` times. DELETE stops the pod (SIGTERM, then SIGKILL after its
  ``terminationGracePeriodSeconds``).
* ``GET/DELETE /api/v1/namespaces/<ns>/pods[/<name>[/log]]`` (``labelSelector`` ``k=v,...`` and
  ``fieldSelector=metadata.name=<pod>``), ``GET .../events`` (always empty).
* ConfigMaps and Secrets are put in with :meth:`K8sStandIn.apply` (the manifests ``kubectl apply`` would
  take); ``POST /api/v1/namespaces/<ns>/configmaps|secrets`` does the same.

How a pod's container becomes a process (:class:`PodProcess`):

* **filesystem**: the container sees the image's tree (``image_root``, e.g. built by deploy/build-image.sh)
  under its own paths, without a chroot: a container path is translated to a host path, first by the pod's
  volume mounts (``emptyDir``: a new directory per pod, owned by the pod's user and ``fsGroup``;
  ``configMap``/``secret``: their keys as files; ``subPath`` honoured), then into ``image_root`` when the
  image holds that path, else the host's own path (``/usr/bin``, the JVM, ...). A directory of the image
  that holds a mount becomes a per-pod directory of links. Translated: the working directory, the
  command, and every environment value that is an absolute path (``PATH``-style lists entry by entry);
* **environment**: the image's ``ENV``, then ``envFrom`` (``configMapRef``, ``secretRef``), then ``env``
  (``value``; ``valueFrom`` ``configMapKeyRef``, ``secretKeyRef``, ``fieldRef`` ``status.podIP`` =
  127.0.0.1, ``metadata.name``, ``metadata.namespace``). A missing ConfigMap, Secret or key that is not
  ``optional`` fails the pod before it starts (Kubernetes' ``CreateContainerConfigError``);
* **command**: ``command`` (else the image's entrypoint, none here) followed by ``args``; its first word
  is looked up on the translated ``PATH``. **working directory**: ``workingDir``, else the image's;
* **user**: ``runAsUser``/``runAsGroup`` of the container's, else the pod's ``securityContext``, else the
  image's ``USER``; applied with ``setpriv`` (no capabilities) when this process is root, else ignored.
  The image's /etc/passwd is not the host's: for a uid the host does not know, the pod runs in a mount
  namespace of its own whose /etc/passwd and /etc/group also hold the image's user (Java and Hadoop
  look the uid up);
* **network**: none of its own (the pod shares the host's; a pod's IP is 127.0.0.1). Resources, probes,
  the service account, image pull settings and node scheduling are accepted and ignored.

Each pod runs in its own process session (``kill_pod`` SIGKILLs the whole group: the run worker, its
Spark JVM and Python workers), its output goes to ``<pods_dir>/<pod>/log``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

POD_IP = "127.0.0.1"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config gives a container besides its tree: ``env`` (``ENV``), ``workdir``
    (``WORKDIR``), ``user`` (``USER``, a uid), ``entrypoint`` (``ENTRYPOINT``, empty: none) and
    ``user_name`` (the user's name in the image's /etc/passwd)."""

    env: dict[str, str]
    workdir: str = "/"
    user: int | None = None
    entrypoint: tuple[str, ...] = ()
    user_name: str = "app"  # the image's /etc/passwd name of ``user``


class PodFailedToStart(RuntimeError):
    """A pod's container could not be created (a missing ConfigMap, Secret or key, no such command)."""


@dataclass
class PodProcess:
    """One pod: its manifest (``pod``: apiVersion v1 Pod as a dict), its directory, its process."""

    pod: dict
    directory: Path
    proc: subprocess.Popen | None = None
    reason: str = ""  # why it failed to start (empty: it started)
    finished_at: str | None = None

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    def exit_code(self) -> int | None:
        """The process's exit code (negative: killed by that signal); ``None`` while it runs; 128 when
        it never started."""
        if self.proc is None:
            return 128
        return self.proc.poll()

    def phase(self) -> str:
        code = self.exit_code()
        return "Running" if code is None else ("Succeeded" if code == 0 else "Failed")

    def manifest(self) -> dict:
        """The pod with its status as the API reports it."""
        code = self.exit_code()
        (container,) = self.pod["spec"]["containers"][:1]
        if code is None:
            state = {"running": {"startedAt": self.pod["status"]["startTime"]}}
        else:
            reason = self.reason or ("Completed" if code == 0 else ("Error" if code > 0 else "OOMKilled?"))
            if code < 0:
                reason = f"killed by signal {-code}"
            state = {
                "terminated": {
                    "exitCode": 128 - code if code < 0 else code,
                    "reason": reason,
                    "finishedAt": self.finished_at or _now(),
                }
            }
        status = {
            **self.pod["status"],
            "phase": self.phase(),
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": code is None,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        return {**self.pod, "status": status}


class K8sStandIn:
    """The API server stand-in (module docstring). ``url`` is its base URL once :meth:`start` ran;
    :meth:`write_kubeconfig` writes a kubeconfig for it. ``image_root`` and ``image`` describe the one
    image every container runs (the image name in a spec is not looked at)."""

    def __init__(self, image_root: Path, image: ImageConfig, pods_dir: Path):
        self.image_root, self.image, self.pods_dir = Path(image_root), image, Path(pods_dir)
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.objects: dict[tuple[str, str, str], dict] = {}  # (kind, namespace, name) -> manifest
        self.jobs: dict[tuple[str, str], dict] = {}  # (namespace, name) -> Job manifest (no status)
        self.pods: dict[tuple[str, str], PodProcess] = {}
        self.job_pods: dict[tuple[str, str], list[str]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) of every API request
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    # -- objects ------------------------------------------------------------------------------------
    def apply(self, manifest: dict, namespace: str = "default") -> None:
        """Store a ConfigMap or Secret manifest (a Secret's ``stringData`` or base64 ``data``)."""
        kind = manifest["kind"]
        if kind not in ("ConfigMap", "Secret"):
            raise ValueError(f"the stand-in stores ConfigMaps and Secrets, not {kind}")
        meta = manifest["metadata"]
        ns = meta.get("namespace", namespace)
        with self._lock:
            self.objects[(kind, ns, meta["name"])] = manifest

    def _data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        import base64

        manifest = self.objects.get((kind, namespace, name))
        if manifest is None:
            return None
        data = dict(manifest.get("data") or {})
        if kind == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            data.update(manifest.get("stringData") or {})
        return {k: str(v) for k, v in data.items()}

    # -- the container as a process -------------------------------------------------------------------
    def _volume_dir(self, pod: PodProcess, volume: dict, namespace: str, uid: int | None, gid: int | None) -> Path:
        target = pod.directory / "volumes" / volume["name"]
        if target.exists():
            return target
        target.mkdir(parents=True)
        source = volume.get("configMap") or volume.get("secret")
        if "emptyDir" in volume:
            if os.geteuid() == 0 and uid is not None:
                os.chown(target, uid, gid if gid is not None else uid)
        elif source is not None:
            kind = "ConfigMap" if "configMap" in volume else "Secret"
            name = source.get("name") or source.get("secretName")
            data = self._data(kind, namespace, name)
            if data is None:
                if source.get("optional"):
                    return target
                raise PodFailedToStart(f'{kind.lower()} "{name}" not found (volume {volume["name"]})')
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (target / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (target / item["path"]).write_text(data[item["key"]])
                (target / item["path"]).chmod(0o644)
            target.chmod(0o755)
        else:
            raise PodFailedToStart(f"volume {volume['name']}: only emptyDir, configMap and secret are stood in")
        return target

    def _mounts(self, pod: PodProcess, spec: dict, container: dict, ns: str, uid, gid) -> dict[str, Path]:
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise PodFailedToStart(f"volume mount {mount['name']}: no such volume")
            base = self._volume_dir(pod, volume, ns, uid, gid)
            mounts[mount["mountPath"].rstrip("/") or "/"] = base / mount["subPath"] if mount.get("subPath") else base
        return mounts

    def _translate(self, pod: PodProcess, mounts: dict[str, Path], path: str) -> str:
        """The host path of container path ``path`` (module docstring: mounts, then the image, then the host)."""
        if not path.startswith("/"):
            return path
        clean = os.path.normpath(path)
        for mount in sorted(mounts, key=len, reverse=True):
            if clean == mount or clean.startswith(mount + "/"):
                return str(mounts[mount]) + clean[len(mount) :]
        if any(m.startswith(clean.rstrip("/") + "/") for m in mounts):
            return str(self._view(pod, mounts, clean))
        image_path = self.image_root / clean.lstrip("/")
        return str(image_path) if os.path.lexists(image_path) else path

    def _view(self, pod: PodProcess, mounts: dict[str, Path], directory: str) -> Path:
        """A per-pod directory standing for image directory ``directory`` that holds a mount: links to the
        image's entries, the mounts in it, and views of its subdirectories that hold mounts."""
        view = pod.directory / "fs" / directory.lstrip("/")
        view.mkdir(parents=True, exist_ok=True)
        image_dir = self.image_root / directory.lstrip("/")
        names = set(os.listdir(image_dir)) if image_dir.is_dir() else set()
        prefix = directory.rstrip("/") + "/"
        names |= {m[len(prefix) :].split("/")[0] for m in mounts if m.startswith(prefix)}
        for name in names:
            entry = view / name
            if os.path.lexists(entry):
                continue
            inner = prefix + name
            if inner in mounts:
                entry.symlink_to(mounts[inner])
            elif any(m.startswith(inner + "/") for m in mounts):
                self._view(pod, mounts, inner)
            else:
                entry.symlink_to(image_dir / name)
        view.chmod(0o755)
        return view

    def _env(self, pod: PodProcess, container: dict, ns: str) -> dict[str, str]:
        env = dict(self.image.env)
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef") or source.get("secretRef")
            kind = "ConfigMap" if "configMapRef" in source else "Secret"
            data = self._data(kind, ns, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise PodFailedToStart(f'{kind.lower()} "{ref["name"]}" not found')
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for var in container.get("env") or []:
            env_value = self._env_value(pod, var, ns)
            if env_value is not None:
                env[var["name"]] = env_value
        return env

    def _env_value(self, pod: PodProcess, var: dict, ns: str) -> str | None:
        if "valueFrom" not in var:
            return str(var.get("value", ""))
        source = var["valueFrom"]
        if "fieldRef" in source:
            field_path = source["fieldRef"]["fieldPath"]
            fields = {"status.podIP": POD_IP, "metadata.name": pod.name, "metadata.namespace": ns}
            if field_path not in fields:
                raise PodFailedToStart(f"env {var['name']}: fieldRef {field_path} is not stood in")
            return fields[field_path]
        ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
        kind = "ConfigMap" if "configMapKeyRef" in source else "Secret"
        data = self._data(kind, ns, ref["name"])
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise PodFailedToStart(f'env {var["name"]}: {kind.lower()} "{ref["name"]}" key {ref["key"]} not found')
        return data[ref["key"]]

    def _user(self, spec: dict, container: dict) -> tuple[int | None, int | None, int | None]:
        pod_ctx, ctx = spec.get("securityContext") or {}, container.get("securityContext") or {}
        uid = ctx.get("runAsUser", pod_ctx.get("runAsUser", self.image.user))
        gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup", uid))
        return uid, gid, pod_ctx.get("fsGroup")

    def _command(self, container: dict, env: dict[str, str]) -> list[str]:
        argv = list(container.get("command") or self.image.entrypoint) + list(container.get("args") or [])
        if not argv:
            raise PodFailedToStart("no command: the container has neither command nor args, the image no entrypoint")
        if "/" not in argv[0]:
            for entry in env.get("PATH", "").split(":"):
                candidate = Path(entry) / argv[0]
                if candidate.is_file() and os.access(candidate, os.X_OK):
                    return [str(candidate), *argv[1:]]
            raise PodFailedToStart(f'exec: "{argv[0]}": executable file not found in $PATH')
        return argv

    def _start(self, pod: PodProcess, namespace: str) -> None:
        spec = pod.pod["spec"]
        container = spec["containers"][0]
        uid, gid, fs_group = self._user(spec, container)
        mounts = self._mounts(pod, spec, container, namespace, uid, fs_group if fs_group is not None else gid)
        env = self._env(pod, container, namespace)
        for key, value in list(env.items()):
            if value.startswith("/"):
                sep = ":" if key.endswith("PATH") else None
                parts = value.split(sep) if sep else [value]
                env[key] = (sep or "").join(self._translate(pod, mounts, p) for p in parts)
        argv = self._command(container, env)
        argv[0] = self._translate(pod, mounts, argv[0])
        cwd = self._translate(pod, mounts, container.get("workingDir") or self.image.workdir)
        if os.geteuid() == 0 and uid is not None:
            argv = as_user(argv, uid, gid if gid is not None else uid, fs_group)
            if not _has_passwd_entry(uid):
                argv = self._with_image_user(pod, uid, gid if gid is not None else uid, env.get("HOME", "/"), argv)
        argv = with_default_signals(argv)
        (pod.directory / "argv.json").write_text(json.dumps({"argv": argv, "cwd": cwd}, indent=1))
        with open(pod.directory / "log", "ab") as out:
            pod.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _with_image_user(self, pod: PodProcess, uid: int, gid: int, home: str, argv: list[str]) -> list[str]:
        """``argv`` in a mount namespace of its own whose /etc/passwd and /etc/group are the host's plus
        the image's user (``useradd`` in the image; Java and Hadoop look the uid up, and fail without)."""
        passwd, group = pod.directory / "passwd", pod.directory / "group"
        passwd.write_text(
            Path("/etc/passwd").read_text() + f"{self.image.user_name}:x:{uid}:{gid}::{home}:/usr/sbin/nologin\n"
        )
        group.write_text(Path("/etc/group").read_text() + f"{self.image.user_name}:x:{gid}:\n")
        for f in (passwd, group):
            f.chmod(0o644)
        script = 'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "pod",
            str(passwd),
            str(group),
            *argv,
        ]

    def run_pod(self, manifest: dict, namespace: str = "default") -> PodProcess:
        """Create the pod ``manifest`` (a v1 Pod as a dict, ``metadata.name`` set) and start its first
        container as a process. A pod that cannot start is kept, failed, with its reason."""
        name = manifest["metadata"]["name"]
        directory = self.pods_dir / name
        directory.mkdir(parents=True)
        directory.chmod(0o755)
        pod = PodProcess(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                **manifest,
                "metadata": {**manifest["metadata"], "namespace": namespace, "uid": secrets.token_hex(8)},
                "status": {"podIP": POD_IP, "hostIP": POD_IP, "startTime": _now()},
            },
            directory,
        )
        try:
            self._start(pod, namespace)
        except (PodFailedToStart, OSError) as exc:
            pod.reason = f"CreateContainerConfigError: {exc}"
            pod.finished_at = _now()
            (directory / "log").write_text(pod.reason + "\n")
        with self._lock:
            self.pods[(namespace, name)] = pod
        return pod

    # -- jobs ---------------------------------------------------------------------------------------
    def create_job(self, job: dict, namespace: str) -> dict:
        """Store ``job`` and start its first pod (the template's metadata and spec, labelled with
        ``job-name``). Raises KeyError (409) when a Job of that name exists."""
        name = job["metadata"]["name"]
        with self._lock:
            if (namespace, name) in self.jobs:
                raise KeyError(name)
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                **job,
                "metadata": {**job["metadata"], "namespace": namespace, "uid": secrets.token_hex(8)},
            }
            self.jobs[(namespace, name)] = job
            self.job_pods[(namespace, name)] = []
        self._start_job_pod(namespace, name)
        return self.job_manifest(namespace, name)

    def _start_job_pod(self, namespace: str, job_name: str) -> None:
        job = self.jobs[(namespace, job_name)]
        template = job["spec"]["template"]
        pod_name = f"{job_name}-{secrets.token_hex(3)}"[:63]
        labels = {**(template.get("metadata") or {}).get("labels", {}), "job-name": job_name}
        meta = {**(template.get("metadata") or {}), "name": pod_name, "labels": labels}
        self.run_pod({"metadata": meta, "spec": template["spec"]}, namespace)
        with self._lock:
            self.job_pods[(namespace, job_name)].append(pod_name)

    def job_status(self, namespace: str, name: str) -> dict:
        """The Job's status (``active``, ``succeeded``, ``failed`` counts and conditions); starts the next
        pod when one failed and ``spec.backoffLimit`` allows."""
        with self._lock:
            job = self.jobs[(namespace, name)]
            pods = [self.pods[(namespace, p)] for p in self.job_pods[(namespace, name)]]
        phases = [p.phase() for p in pods]
        failed, succeeded, active = phases.count("Failed"), phases.count("Succeeded"), phases.count("Running")
        if not active and not succeeded and 0 < failed <= job["spec"].get("backoffLimit", 6):
            self._start_job_pod(namespace, name)
            return self.job_status(namespace, name)
        status: dict = {"startTime": pods[0].pod["status"]["startTime"] if pods else _now()}
        status.update({k: v for k, v in (("active", active), ("succeeded", succeeded), ("failed", failed)) if v})
        if succeeded or (failed and not active):
            kind = "Complete" if succeeded else "Failed"
            status["conditions"] = [{"type": kind, "status": "True", "lastTransitionTime": _now()}]
            if succeeded:
                status["completionTime"] = _now()
        return status

    def job_manifest(self, namespace: str, name: str) -> dict:
        return {**self.jobs[(namespace, name)], "status": self.job_status(namespace, name)}

    def stop_pod(self, namespace: str, name: str, sig: int = signal.SIGTERM) -> bool:
        """Stop a pod: ``sig`` to its process group; SIGTERM is followed by SIGKILL after the pod's
        ``terminationGracePeriodSeconds`` (default 30). Returns whether its process was alive."""
        pod = self.pods.get((namespace, name))
        if pod is None or pod.proc is None or pod.proc.poll() is not None:
            return False
        try:
            os.killpg(pod.proc.pid, sig)
        except ProcessLookupError:
            return False
        grace = pod.pod["spec"].get("terminationGracePeriodSeconds", 30) if sig == signal.SIGTERM else 30
        try:
            pod.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(pod.proc.pid, signal.SIGKILL)
            pod.proc.wait(30)
        try:  # whatever the pod started and left behind in its session (a pod's processes die with it)
            os.killpg(pod.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        pod.finished_at = _now()
        return True

    def kill_pod(self, name: str, namespace: str = "default") -> bool:
        """SIGKILL the pod's whole process group (a node losing the pod); see :meth:`stop_pod`."""
        return self.stop_pod(namespace, name, signal.SIGKILL)

    def delete_job(self, namespace: str, name: str) -> None:
        """Stop the Job's pods and forget it (KeyError: no such Job)."""
        with self._lock:
            self.jobs.pop((namespace, name))
            pods = self.job_pods.pop((namespace, name))
        for pod in pods:
            self.stop_pod(namespace, pod)

    def pods_of_job(self, job_name: str, namespace: str = "default") -> list[PodProcess]:
        with self._lock:
            return [self.pods[(namespace, p)] for p in self.job_pods.get((namespace, job_name), [])]

    def select_pods(self, namespace: str, labels: dict[str, str], name: str | None = None) -> list[dict]:
        with self._lock:
            pods = [p for (ns, _), p in self.pods.items() if ns == namespace]
        return [
            p.manifest()
            for p in pods
            if (name is None or p.name == name)
            and all(p.pod["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())
        ]

    # -- HTTP -----------------------------------------------------------------------------------------
    def start(self) -> str:
        """Serve the API on a free 127.0.0.1 port in a thread; returns its URL."""
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null") if length else None
                standin.requests.append((method, url.path))
                try:
                    status, reply = standin.handle(method, url.path.strip("/").split("/"), query, body)
                except KeyError as exc:
                    status, reply = 404, _status(404, "NotFound", f"{exc} not found")
                self._reply(status, reply)

            def do_GET(self):  # noqa: N802 - http.server's names
                self._handle("GET")

            def do_POST(self):  # noqa: N802
                self._handle("POST")

            def do_DELETE(self):  # noqa: N802
                self._handle("DELETE")

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def handle(self, method: str, parts: list[str], query: dict[str, str], body) -> tuple[int, dict]:
        """One API request: (HTTP status, JSON body). Raises KeyError for an unknown object (404)."""
        if parts[:3] == ["apis", "batch", "v1"] and parts[3:4] == ["namespaces"] and parts[5:6] == ["jobs"]:
            return self._jobs(method, parts[4], parts[6:], query, body)
        if parts[:2] == ["api", "v1"] and parts[2:3] == ["namespaces"] and len(parts) >= 5:
            ns, resource, rest = parts[3], parts[4], parts[5:]
            if resource == "pods":
                return self._pods(method, ns, rest, query)
            if resource == "events":
                return 200, {"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": []}
            if resource in ("configmaps", "secrets") and method == "POST":
                self.apply(body, ns)
                return 201, body
            if resource in ("configmaps", "secrets") and method == "GET" and rest:
                kind = "ConfigMap" if resource == "configmaps" else "Secret"
                return 200, self.objects[(kind, ns, rest[0])]
        return 404, _status(404, "NotFound", f"{method} /{'/'.join(parts)} is not stood in")

    def _jobs(self, method: str, ns: str, rest: list[str], query: dict[str, str], body) -> tuple[int, dict]:
        if method == "POST" and not rest:
            try:
                return 201, self.create_job(body, ns)
            except KeyError:
                return 409, _status(409, "AlreadyExists", f'jobs.batch "{body["metadata"]["name"]}" already exists')
        if method == "GET" and not rest:
            labels = _selector(query.get("labelSelector", ""))
            with self._lock:
                names = [n for (job_ns, n) in self.jobs if job_ns == ns]
            items = [self.job_manifest(ns, n) for n in names]
            items = [j for j in items if all(j["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())]
            return 200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {}, "items": items}
        if method == "GET":
            return 200, self.job_manifest(ns, rest[0])
        if method == "DELETE":
            self.delete_job(ns, rest[0])
            return 200, _status(200, "", "")
        return 405, _status(405, "MethodNotAllowed", method)

    def _pods(self, method: str, ns: str, rest: list[str], query: dict[str, str]) -> tuple[int, dict]:
        if not rest:
            name = query.get("fieldSelector", "").removeprefix("metadata.name=") or None
            items = self.select_pods(ns, _selector(query.get("labelSelector", "")), name)
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        pod = self.pods[(ns, rest[0])]
        if method == "DELETE":
            self.stop_pod(ns, rest[0])
            return 200, pod.manifest()
        if rest[1:] == ["log"]:
            lines = (pod.directory / "log").read_text(errors="replace").splitlines()
            tail = int(query.get("tailLines", 0) or 0)
            return 200, "\n".join(lines[-tail:] if tail else lines)  # the client reads a log as text
        return 200, pod.manifest()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig whose current context is this server (plain HTTP, no credentials); readable by all."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {}}],
            "contexts": [
                {"name": "standin", "context": {"cluster": "standin", "user": "standin", "namespace": namespace}}
            ],
            "current-context": "standin",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o644)
        return path

    def stop(self) -> None:
        """Stop every pod (SIGKILL of its process group) and the server."""
        with self._lock:
            keys = list(self.pods)
        for ns, name in keys:
            self.stop_pod(ns, name, signal.SIGKILL)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def as_user(argv: list[str], uid: int, gid: int, group: int | None = None) -> list[str]:
    """``argv`` run as ``uid``/``gid`` with no capabilities (``setpriv``; needs root), with ``group``
    (a pod's ``fsGroup``) as its only supplementary group, or none."""
    groups = ["--clear-groups"] if group is None else ["--groups", str(group)]
    return [
        "setpriv",
        "--reuid",
        str(uid),
        "--regid",
        str(gid),
        *groups,
        "--inh-caps=-all",
        "--bounding-set=-all",
        *argv,
    ]


def with_default_signals(argv: list[str]) -> list[str]:
    """``argv`` with every signal at its default, as a container starts (under ``nohup`` SIGINT is
    ignored, and ``dagster api grpc`` gives SIGTERM SIGINT's handler, so it would ignore SIGTERM too)."""
    return ["/usr/bin/env", "--default-signal", *argv]


def _has_passwd_entry(uid: int) -> bool:
    import pwd

    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _selector(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (equality selectors only) as a dict."""
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


def remove_tree(path: Path) -> None:
    """Delete a pod's directory (volumes included)."""
    shutil.rmtree(path, ignore_errors=True)


__all__ = ["POD_IP", "ImageConfig", "K8sStandIn", "PodFailedToStart", "PodProcess"]
