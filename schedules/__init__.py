"""Schedules. Table maintenance schedules (rewrite_data_files, expire_snapshots,
remove_orphan_files) are tracked in their own issue; until they land there are none."""

from __future__ import annotations


def all_schedules(specs) -> list:
    """Schedules for the declared tables (none yet)."""
    return []
