"""Dev tooling: bench."""
