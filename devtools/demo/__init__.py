"""Dev tooling: demo."""
