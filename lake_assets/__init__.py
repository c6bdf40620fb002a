"""Dagster assets: Kafka topics (external), Iceberg tables (one per declared table), derived tables."""
