"""``make rehearse``: the failure rehearsal at full size (every scenario; 20 SIGKILLs in ``kills`` and
``dagster_cli_kills``, 10 in ``cdc_kills``, 12 in ``consistent_cdc``), on a
lake of its own under ``$LAKE_HOME/rehearsal``. Prints a table of scenario, faults injected,
records produced, records in the table, records quarantined, duplicates, records lost, leaks
beyond the bound and seconds the final catch-up took;
exits 1 if any scenario failed. Options: ``--kills N``, ``--only kills,sink_outage,...``,
``--seed S`` (see :mod:`devtools.rehearsal.run`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.rehearsal.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
