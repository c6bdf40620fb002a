"""The Iceberg catalog: its configuration for Spark and pyiceberg, table creation and metadata reads."""
