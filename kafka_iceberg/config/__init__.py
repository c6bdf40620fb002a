"""Runtime settings from the process environment (the one place that reads it)."""
