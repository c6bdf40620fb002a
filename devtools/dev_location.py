"""The repository's development code location (``workspace.yaml``): the product's location
(:mod:`kafka_iceberg.lake_assets.definitions`) with the development defaults asked for (``LAKE_DEV=1``:
the dev broker, the SQLite catalog under ``LAKE_HOME``, the demo's tables), also in the runs launched
from it, which load this module again. An installed package never imports it."""

from __future__ import annotations

import os

os.environ.setdefault("LAKE_DEV", "1")

from kafka_iceberg.lake_assets.definitions import defs  # noqa: E402

__all__ = ["defs"]
