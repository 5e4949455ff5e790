"""Batch inference: the runtime's reference scorer for xgboost models
(``zipline_runtime.score``), which reads this trainer's ``model.json`` and report.

``python -m trainer.score --input-table ns.name --ds D --model-dir URI --output-table
ns.name --warehouse URI``; the platform runs it for the model's scores table.
"""

import sys

from zipline_runtime.score import main

if __name__ == "__main__":
    sys.exit(main())
