"""The phases of a micro-batch, each a small function over frozen values (docs/architecture.md).

:mod:`~kafka_iceberg.batch.context` (the connections and shared table operations),
:mod:`~kafka_iceberg.batch.recover`, :mod:`~kafka_iceberg.batch.plan`,
:mod:`~kafka_iceberg.batch.read`, :mod:`~kafka_iceberg.batch.write`,
:mod:`~kafka_iceberg.batch.publish`; the values in :mod:`~kafka_iceberg.batch.types`.
:mod:`kafka_iceberg.batch.pipeline` runs them in order.
"""
