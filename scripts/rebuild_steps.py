"""Rebuild decode_context, prefill_sq, host_gap_s and rebuilt_exact in recorded steps tables.

    python scripts/rebuild_steps.py traces/lmsys.parquet ...            (writes NAME.steps.rebuilt.parquet)
    python scripts/rebuild_steps.py --replace traces/lmsys.parquet ...  (rewrites NAME.steps.parquet)

The logic and its documentation live in ``experiments/steps_rebuild.py``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.steps_rebuild import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
