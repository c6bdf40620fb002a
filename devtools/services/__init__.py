"""Dev tooling: services."""
