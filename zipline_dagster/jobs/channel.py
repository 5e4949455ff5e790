"""The platform's half of the channel with a job: what the step does with the driver's
reports (``zipline_runtime.driver``, which every job runs under).

The step learns the job is ending from whichever it sees first, the driver's end marker
on storage (``DoneWatcher``) or its last line in the log stream, and only then polls
Ray's status tightly. A range job's command is logged short (``loggable_command``).
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable


def loggable_command(command: str) -> str:
    """``command`` as the step logs it: a range job's ``--partitions`` (every partition's
    flags, some 400 characters a partition: kilobytes for a month of days) is shown as
    the number of partitions and their days. The Ray dashboard's job page keeps the whole
    command; anything else is logged as it is."""
    try:
        words = shlex.split(command)
    except ValueError:  # not a shell command line (unbalanced quotes): as it is
        return command
    for i, word in enumerate(words):
        if not word.startswith("--partitions="):
            continue
        try:
            spec = json.loads(word.partition("=")[2])
        except ValueError:
            return command
        if not isinstance(spec, dict) or len(spec) < 2:
            return command
        days = sorted(spec)
        shown = (
            f"--partitions=<{len(days)} partitions, {days[0]}..{days[-1]}, each with its "
            "own flags: the job's page in the Ray dashboard shows them>"
        )
        return " ".join([*map(shlex.quote, words[:i]), shown, *map(shlex.quote, words[i + 1 :])])
    return command


class DoneWatcher:
    """Sets ``event`` once the driver's marker exists (``exists``: asks storage whether it
    does; an error counts as no).

    Cheap where it is: a local ``stat`` every 50 ms (``local``). On an object store a
    look costs requests (on S3 a GET of one byte; on GCS and Azure the SDK's lookup of
    the object), so the wait between looks is ``SHARE`` of the job's time so far (from
    ``job_start``, its own clock), 0.5 s at least and 5 s at most: the end of a short job
    is seen within 0.5 s, of any job within about 5% of its time, and an hour's job costs
    about 770 looks where a look every 0.5 s would be 7,200. The log line and the status
    polls still end the wait: the watcher only ever makes the step learn sooner.
    """

    SHARE = 0.05
    MIN_S, MAX_S = 0.5, 5.0

    def __init__(
        self,
        exists: Callable[[], bool],
        event: threading.Event,
        job_start: float | None = None,
        *,
        local: bool = False,
    ) -> None:
        self.exists, self.event, self.local = exists, event, local
        self.job_start = time.time() if job_start is None else job_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="done-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def interval(self) -> float:
        if self.local:
            return 0.05
        return min(max(self.MIN_S, (time.time() - self.job_start) * self.SHARE), self.MAX_S)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.event.is_set():
            try:
                seen = self.exists()
            except Exception:
                seen = False
            if seen:
                self.event.set()
                return
            self._stop.wait(self.interval())
