"""The dev broker (devtools/services/devbroker.py, noida-db): a second checkout must not silently use a broker
another checkout started on the same port (its topics would mix into this lake)."""

from __future__ import annotations

import pytest

from devtools.services import devbroker
from kafka_iceberg.errors import BrokerUnavailableError


def test_start_refuses_a_port_served_by_another_data_dir(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    port = devbroker.free_port()
    bootstrap = devbroker.start(theirs, port)
    try:
        assert devbroker.start(theirs, port) == bootstrap, "the same data dir reuses its running broker"
        with pytest.raises(BrokerUnavailableError, match="another checkout"):
            devbroker.start(ours, port)
    finally:
        devbroker.stop(theirs)
