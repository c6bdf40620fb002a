"""When each table's maintenance jobs and full-scan ``duplicate_free`` check are due: the table's
``maintenance:`` crons, spread over time across all the tables of the location (:mod:`.spread`), so a
hundred tables never compact in the same minute. Plain Python, no Dagster.

The location has no Dagster schedule. The composition root hands these crons to the worker jobs, and the
worker run serving a table runs each job between its micro-batches once a tick of its cron passed
(:mod:`kafka_iceberg.ops.rota`), on its own warm Spark session: none of them queues for a commit pool or
starts a process and a JVM of its own.
"""
