"""Dev tooling: rehearsal."""
