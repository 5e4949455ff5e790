"""A Dagster deployment, through its public GraphQL API: launch an asset backfill of a
plan and follow it until the deployment's daemon has run it.

The webserver's ``/graphql`` endpoint is Dagster's public interface to a deployment (the
UI uses it, and so does ``dagster-graphql``'s client, which has no backfill method): the
``launchPartitionBackfill`` mutation with ``partitionsByAssets`` submits exactly the
plan's partitions, which the daemon launches as runs through the deployment's run
queue and launcher, and ``partitionBackfillOrError`` tells how it stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from zipline_dagster.lineage.backfill import Plan, contiguous_runs, plan_done
from zipline_dagster.lineage.freshness import BackfillError

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""

STATUS = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill {
      status
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            numPartitionsTargeted numPartitionsInProgress numPartitionsMaterialized
            numPartitionsFailed
          }
          ... on UnpartitionedAssetStatus { inProgress materialized failed }
        }
      }
    }
    ... on Error { message }
  }
}
"""

#: a page of a backfill's runs, newest first (``PartitionBackfill.runs`` has a limit and
#: no cursor); ``%s``: the fields read of each run besides its id
RUNS = """
query Runs($filter: RunsFilter!, $cursor: String, $limit: Int!) {
  runsOrError(filter: $filter, cursor: $cursor, limit: $limit) {
    __typename
    ... on Runs { results { runId %s } }
    ... on Error { message }
  }
}
"""

#: a backfill in one of these has ended
ENDED = frozenset({"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"})


class Deployment:
    """The Dagster deployment whose webserver answers at ``url`` (``http://host:3000``).

    Args:
        url: the webserver's address, as a browser opens the UI.
        timeout_s: longest wait for one answer.
        tolerance_s: how long ``wait`` goes on asking a webserver that does not answer
            (restarted, or its database is).
        page: runs read per request.
    """

    def __init__(
        self, url: str, *, timeout_s: float = 30.0, tolerance_s: float = 120.0, page: int = 1000
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise BackfillError(
                f"--url={url!r} is not a Dagster webserver address; expected http(s)://host:port"
            )
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.tolerance_s = tolerance_s
        self.page = page
        #: what a backfill's ended runs materialized, by the runs' statuses when read
        self._made: dict[str, tuple[list[str], set[tuple[dg.AssetKey, str | None]]]] = {}

    def query(self, text: str, variables: dict[str, Any]) -> dict[str, Any]:
        """The ``data`` of one GraphQL request.

        Raises:
            BackfillError: the webserver cannot be reached, or answered with errors.
        """
        import requests

        try:
            answer = requests.post(
                f"{self.url}/graphql",
                json={"query": text, "variables": variables},
                timeout=self.timeout_s,
            )
            answer.raise_for_status()
            body = answer.json()
        except (requests.RequestException, ValueError) as exc:
            raise BackfillError(
                f"the Dagster webserver at {self.url} did not answer ({type(exc).__name__}: "
                f"{exc}); is it running (`dagster-webserver`, `make dev`)?"
            ) from exc
        if body.get("errors"):
            messages = "; ".join(str(e.get("message")) for e in body["errors"])
            raise BackfillError(f"the Dagster webserver at {self.url} refused: {messages}")
        return dict(body["data"])

    def runs(self, backfill_id: str, fields: str) -> list[dict[str, Any]]:
        """Every run of the backfill, newest first, with ``fields`` (GraphQL) of each."""
        tags = [{"key": "dagster/backfill", "value": backfill_id}]
        found: list[dict[str, Any]] = []
        while True:
            variables = {"filter": {"tags": tags}, "limit": self.page}
            if found:
                variables["cursor"] = found[-1]["runId"]
            answer = self.query(RUNS % fields, variables)["runsOrError"]
            if answer["__typename"] != "Runs":
                raise BackfillError(f"backfill {backfill_id}'s runs: {answer.get('message')}")
            found += answer["results"]
            if len(answer["results"]) < self.page:
                return found

    def launch(self, plan: Plan, *, title: str, also: Sequence[dg.AssetKey] = ()) -> str:
        """Submit the plan's partitions (and the unpartitioned assets ``also``, run once
        their parents in the backfill are done) as one asset backfill; its id."""
        selectors: list[dict[str, Any]] = [
            {
                "assetKey": {"path": key.path},
                "partitions": {
                    "ranges": [
                        {"start": run[0], "end": run[-1]}
                        for run in contiguous_runs([parts], len(parts))
                    ]
                },
            }
            for key, parts in plan.steps
        ]
        selectors += [{"assetKey": {"path": key.path}, "partitions": None} for key in also]
        params = {
            "partitionsByAssets": selectors,
            "title": title,
            "description": plan.describe(),
            "tags": [{"key": "zipline/backfill", "value": title}],
        }
        found = self.query(LAUNCH, {"params": params})["launchPartitionBackfill"]
        if found["__typename"] != "LaunchBackfillSuccess":
            raise BackfillError(
                f"the deployment at {self.url} refused the backfill ({found['__typename']}: "
                f"{found.get('message', '')})"
            )
        return str(found["backfillId"])

    def status(
        self, backfill_id: str, targets: set[tuple[dg.AssetKey, str | None]] | None = None
    ) -> tuple[str, list[str]]:
        """The backfill's status and its runs' statuses. A backfill whose every targeted
        partition has been requested and whose runs have all succeeded is
        ``COMPLETED_SUCCESS`` already: the daemon marks it so only at its next pass (every
        30 s), and records a run's partitions in the counts only then too; a run's
        partitions are counted as requested only once the run exists. So is one whose
        every target (``targets``: each asset partition it holds) a run of it has
        materialized, with none of its runs still going (a failed one retried, say)."""
        found = self.query(STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        if found["__typename"] != "PartitionBackfill":
            raise BackfillError(
                f"backfill {backfill_id}: {found['__typename']}: {found.get('message', '')}"
            )
        runs = [str(r["status"]) for r in self.runs(backfill_id, "status")]
        assets = (found.get("assetBackfillData") or {}).get("assetBackfillStatuses") or []
        requested = all(
            a.get("inProgress") or a.get("materialized")
            if "numPartitionsTargeted" not in a
            else a["numPartitionsFailed"] == 0
            and a["numPartitionsInProgress"] + a["numPartitionsMaterialized"]
            == a["numPartitionsTargeted"]
            for a in assets
        )

        def made() -> set[tuple[dg.AssetKey, str | None]]:
            # ended runs made what they made: read again only when a run was added (a
            # retry), not at every poll until the daemon marks a failed backfill
            if self._made.get(backfill_id, ([], set()))[0] != runs:
                fields = "assetMaterializations { assetKey { path } partition }"
                read = {
                    (dg.AssetKey(m["assetKey"]["path"]), m["partition"])
                    for run in self.runs(backfill_id, fields)
                    for m in run["assetMaterializations"]
                }
                self._made[backfill_id] = (runs, read)
            return self._made[backfill_id][1]

        done = bool(assets and runs) and requested and set(runs) == {"SUCCESS"}
        done = done or plan_done(targets, runs, made)
        return ("COMPLETED_SUCCESS" if done else str(found["status"])), runs

    def wait(
        self,
        backfill_id: str,
        *,
        timeout_s: float = 3600,
        poll_s: float = 2.0,
        log: Callable[[str], None] = print,
        targets: set[tuple[dg.AssetKey, str | None]] | None = None,
    ) -> str:
        """Follow the backfill until it ends (its final status), logging each change;
        ``targets``: as for ``status``.

        Raises:
            BackfillError: it has not ended after ``timeout_s`` (it keeps running), or the
                webserver has not answered for ``tolerance_s``.
        """
        deadline = time.monotonic() + timeout_s
        last, failing_since = "", None
        while True:
            try:
                status, runs = self.status(backfill_id, targets)
                failing_since = None
            except BackfillError as exc:  # a restarted webserver or database: ask again
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > self.tolerance_s:
                    raise
                log(f"no answer ({exc}); asking again")
                time.sleep(poll_s)
                continue
            summary = f"{status}: {len(runs)} runs " + ", ".join(
                f"{runs.count(s)} {s.lower()}" for s in sorted(set(runs))
            )
            if summary != last:
                log(summary.rstrip())
                last = summary
            if status in ENDED:
                return status
            if time.monotonic() > deadline:
                raise BackfillError(
                    f"backfill {backfill_id} still running after {timeout_s:.0f}s; it goes on "
                    f"in the deployment ({self.url}/runs/b/{backfill_id})"
                )
            time.sleep(poll_s)
