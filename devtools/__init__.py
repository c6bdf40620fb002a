"""Development tooling (dev broker, dev databases, demo data, rehearsal, crash points); not
installed with the product."""
