"""zipline-runtime: what a job on the cluster imports from the platform.

A small distribution of its own, as ``dagster-pipes`` is for Dagster: trainers import it
(``from zipline_runtime import trainer_io as tio``), and every job the platform submits
runs under its driver (``python -m zipline_runtime.driver``). A project pins one build of
it (``trainers.lock``); the platform ships that build beside each trainer archive, so a
trainer's content address covers the trainer's own code only, and upgrading the platform
re-versions no trainer.

* ``trainer_io``: the platform flags, the window at its snapshot, writing artifacts;
* ``tables`` and ``stats``: its storage and numbers halves (re-exported by ``trainer_io``);
* ``driver``: the driver every job runs under, and the lines it reports back.

Standard library, numpy, pyarrow, pyiceberg and fsspec; Ray in a range job. Never Dagster
nor ``zipline_dagster``.
"""

#: This distribution's version (its ``pyproject.toml`` says the same).
__version__ = "0.2.0"

#: The protocol between a job and the platform that follows it: the flags a job is given,
#: the lines and files it reports back. Raised whenever either side would read the other
#: differently; the platform refuses a runtime whose protocol it does not speak.
PROTOCOL_VERSION = 1
