"""Development tooling (dev broker, dev databases, change sources, demo data): not installed with the product."""
