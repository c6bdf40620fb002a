"""The table declaration: ``tables.yaml`` (or a Dagster Component's attributes) validated by pydantic
models (:mod:`.models`) into :class:`~kafka_iceberg.declaration.models.spec.TableSpec` values."""
