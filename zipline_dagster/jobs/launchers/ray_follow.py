"""Following a Ray job's end from the step: its log stream, forwarded line by line
(``LogFollower``), and the marker file its driver writes just before it exits
(``done_watcher``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from zipline_runtime.driver import is_done_line

from zipline_dagster.jobs.channel import DoneWatcher, loggable_command


class LogFollower:
    """Follows a job's logs incrementally through the dashboard's log stream.

    ``tail_job_logs`` streams the log from its start; after a reconnect the part already
    forwarded is skipped, so nothing is re-downloaded on a healthy connection and nothing
    is forwarded twice. The step never waits for the stream to close (3-5 s after the
    job ends): ``finish`` takes what is left from one final read of the logs.
    """

    def __init__(self, client: Callable[[], Any], log: Any, submission_id: str) -> None:
        self.client, self.log = client, log
        self.sid = submission_id
        self.text: list[str] = []
        self._delivered = 0  # characters of the log forwarded so far
        self._partial = ""  # a line not yet ended
        self._lock = threading.Lock()
        self._done = threading.Event()
        #: set when the platform's driver printed its last line (the job is ending)
        self.ended = threading.Event()
        #: set by that line or by the driver's marker file appearing on storage
        self.ending = threading.Event()
        self._loop: Any = None
        self._task: Any = None
        self._thread = threading.Thread(target=self._run, name=f"logs-{submission_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _offer(self, offset: int, chunk: str) -> None:
        """Forward the part of ``chunk`` (starting at log ``offset``) not forwarded yet."""
        with self._lock:
            if self._done.is_set():
                return
            end = offset + len(chunk)
            if end <= self._delivered:
                return
            new = chunk[max(0, self._delivered - offset) :]
            self._delivered = end
            self.text.append(new)
            lines = (self._partial + new).split("\n")
            self._partial = lines.pop()
            for line in lines:
                if is_done_line(line):
                    self.ended.set()
                    self.ending.set()
                if line.strip():
                    self.log.info(f"[{self.sid}] {self._shown(line)}")

    def _shown(self, line: str) -> str:
        """Ray's own line naming the job's command, with the command as the step's
        "submitted" line shows it; any other line as it is."""
        head, sep, command = line.partition(f"Running entrypoint for job {self.sid}: ")
        return head + sep + loggable_command(command) if sep else line

    def _run(self) -> None:
        import asyncio

        async def follow() -> None:
            client = self.client()
            while not self._done.is_set():
                offset = 0
                try:
                    async for chunk in client.tail_job_logs(self.sid):
                        self._offer(offset, chunk)
                        offset += len(chunk)
                    return  # the stream ended with the job
                except asyncio.CancelledError:
                    return
                except Exception:  # dashboard blip: reconnect and skip what was seen
                    await asyncio.sleep(1.0)

        self._loop = asyncio.new_event_loop()
        try:
            self._task = self._loop.create_task(follow())
            self._loop.run_until_complete(self._task)
        except BaseException:
            pass
        finally:
            self._loop.close()

    def finish(self, full_logs: str | None) -> str:
        """Forward what the stream has not delivered yet and stop following."""
        if full_logs is not None:
            self._offer(0, full_logs)
        with self._lock:
            if self._partial.strip():
                self.log.info(f"[{self.sid}] {self._shown(self._partial)}")
            self._partial = ""
            self._done.set()
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(task.cancel)
        return "".join(self.text)


def done_watcher(
    uri: str,
    event: threading.Event,
    job_start: float | None = None,
    opener: Callable[[str], Any] | None = None,
) -> DoneWatcher:
    """A ``DoneWatcher`` of the marker at ``uri``, looking through the platform's storage
    (``opener``: how the step opens it, ``WarehouseResource.store``; default: as the
    settings say)."""
    from zipline_dagster.storage.blobs import BlobStore, blob_store

    store: BlobStore | None = None

    def exists() -> bool:
        nonlocal store
        store = store or (opener or blob_store)(uri)
        return store.exists(uri)

    return DoneWatcher(exists, event, job_start, local=uri.startswith("file://"))
