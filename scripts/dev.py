"""``make dev``: ``dagster dev`` on this checkout's workspace, with what ``make demo`` left behind.

The demo's tables read Avro through a Schema Registry (``${LAKE_SCHEMA_REGISTRY_URL}`` in
kafka_iceberg/defs/nyc/defs.yaml). When ``LAKE_SCHEMA_REGISTRY_URL`` is unset, this starts (or finds running) the
stand-in registry under ``$LAKE_HOME/registry`` on port ``LAKE_DEV_REGISTRY_PORT`` (18081) and
exports its URL; when ``KAFKA_BOOTSTRAP_SERVERS`` is unset it starts (or finds running) the dev
broker. Then it replaces itself with ``dagster dev -w workspace.yaml -h HOST -p PORT``
(``LAKE_DEV_HOST``/``LAKE_DEV_PORT``, default 127.0.0.1:3000). Both servers keep running after
``dagster dev`` stops; ``make clean`` stops both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from devtools.services import devbroker  # noqa: E402
from devtools.services import registry as dev_registry  # noqa: E402
from kafka_iceberg.config.settings import DEV_BROKER_PORT, load_settings  # noqa: E402


def main() -> None:
    """Start what the demo's tables need, then exec ``dagster dev`` (never returns)."""
    settings = load_settings()
    if settings.use_dev_broker:
        print(f"dev broker (noida-db) on {devbroker.start(settings.broker_data_dir, DEV_BROKER_PORT)}")
    if not os.environ.get("LAKE_SCHEMA_REGISTRY_URL"):
        url = dev_registry.start(settings.lake_home / "registry", dev_registry.DEV_PORT)
        os.environ["LAKE_SCHEMA_REGISTRY_URL"] = url
        print(f"schema registry (stand-in): {url}")
    dagster = str(Path(sys.executable).with_name("dagster"))
    host, port = os.environ.get("LAKE_DEV_HOST", "127.0.0.1"), os.environ.get("LAKE_DEV_PORT", "3000")
    os.chdir(CHECKOUT)
    os.execv(dagster, [dagster, "dev", "-w", "workspace.yaml", "-h", host, "-p", port])


if __name__ == "__main__":
    main()
