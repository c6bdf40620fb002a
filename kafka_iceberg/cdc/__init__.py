"""Change data capture: change events reduced by key and applied with ``MERGE INTO`` (``mode: upsert``)."""
