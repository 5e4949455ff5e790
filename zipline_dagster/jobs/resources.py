"""Dagster resources that pick the launcher a model partition trains with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dagster as dg
from pydantic import Field

from zipline_dagster.jobs.launchers.ray_client import REQUEST_TIMEOUT_S
from zipline_dagster.jobs.request import (
    TrainingRunner,
)
from zipline_dagster.settings import StorageOptions, settings
from zipline_dagster.storage.blobs import BlobStore


class JobLauncher(dg.ConfigurableResource):
    """Runs a model partition's trainer: as a Ray Job, or locally for development.

    Both run the same archive with the same flags, paths and report.
    """

    timeout_s: float = Field(
        default=6 * 3600, description="Stop the trainer and fail the step after this many seconds."
    )

    def runner(self, log: Any, store: Callable[[str], BlobStore] | None = None) -> TrainingRunner:
        """The runner of one step (``log``: the step's; ``store``: how the step opens
        storage, ``WarehouseResource.store``)."""
        raise NotImplementedError

    @property
    def runs_ranges_in_one_job(self) -> bool:
        """Whether a range of partitions (or of scoring days) runs as one job, one task
        each, through the archive's platform driver; False: one job after another."""
        return False

    def archive_problem(self, uri: str, options: StorageOptions) -> str | None:
        """Why this launcher cannot run a trainer archive stored at ``uri``; None if it can.

        The local launcher reads archives through the platform's storage layer: any
        scheme it accepts works.
        """
        return None


class LocalLauncherResource(JobLauncher):
    """Runs the trainer as a subprocess of the step, in this environment (no cluster).

    Example:
        .. code-block:: python

            import dagster as dg
            from zipline_dagster.jobs.resources import LocalLauncherResource

            defs = dg.Definitions(assets=[...], resources={"launcher": LocalLauncherResource(timeout_s=600)})
    """

    def runner(self, log: Any, store: Callable[[str], BlobStore] | None = None) -> TrainingRunner:
        from zipline_dagster.jobs.launchers.local import LocalRunner

        return LocalRunner(timeout_s=self.timeout_s, log=log)


class RayJobsResource(JobLauncher):
    """Submits training as Ray Jobs.

    The cluster is, in order: ``address`` if set, else ``RAY_ADDRESS``, else the embedded
    default: a local head on loopback that the platform starts once and reuses
    (``zipline-dagster ray up | down | status``).

    Example:
        .. code-block:: python

            import dagster as dg
            from zipline_dagster.jobs.resources import RayJobsResource

            defs = dg.Definitions(
                assets=[...],
                resources={
                    "launcher": RayJobsResource(
                        address="http://raycluster-head-svc:8265",
                        auth_mode="token",  # the token from RAY_AUTH_TOKEN, never config
                    )
                },
            )
    """

    address: str | None = Field(
        default=None,
        description="Dashboard address of the Ray cluster, e.g. http://raycluster-head-svc:8265. "
        "Unset: RAY_ADDRESS, else the embedded local head.",
    )
    auth_mode: str | None = Field(
        default=None,
        description="RAY_AUTH_MODE for the client: 'disabled' or 'token' (the token comes from "
        "RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH in the environment, never from config). "
        "Unset: RAY_AUTH_MODE, else 'disabled' for the embedded head.",
    )
    timeout_s: float = Field(
        default=6 * 3600, description="Stop the Ray job and fail the step after this many seconds."
    )
    poll_max_s: float = Field(default=2.0, description="Longest wait between job status checks.")
    unreachable_tolerance_s: float = Field(
        default=120.0,
        description="How long the Ray dashboard may stay unreachable (connection errors, 5xx) "
        "while a job is followed; the job keeps running meanwhile, and past this the step fails "
        "(a retry re-attaches to the job).",
    )
    request_timeout_s: float = Field(
        default=REQUEST_TIMEOUT_S,
        description="Longest wait for the Ray dashboard's answer to one request; a request "
        "without an answer counts as the dashboard being unreachable (a hung dashboard "
        "cannot hold the step past unreachable_tolerance_s).",
    )
    install_requirements: bool | None = Field(
        default=None,
        description="Install the trainer's install_requires into the job (Ray pip runtime env, "
        "cached per set). Unset: ZIPLINE_RAY_INSTALL_REQUIREMENTS (true/false), else true; false "
        "where the cluster's image already holds them.",
    )
    entrypoint_resources: dict[str, float] | None = Field(
        default=None,
        description='Custom Ray resources each job\'s driver asks for, e.g. {"worker": 0.001} '
        "(a sliver of a resource only worker nodes have, to keep drivers off the head). Unset: "
        "ZIPLINE_RAY_ENTRYPOINT_RESOURCES (JSON), else none.",
    )
    embedded_state_dir: str | None = Field(
        default=None, description="State folder of the embedded head (default $ZIPLINE_HOME/ray)."
    )

    @property
    def runs_ranges_in_one_job(self) -> bool:
        return True

    def resolved_address(self) -> tuple[str, str | None]:
        """(dashboard address, auth mode), starting the embedded head when nothing is configured."""
        env = settings()
        address = self.address or env.ray_address
        auth = self.auth_mode or env.ray_auth_mode
        if address:
            return address, auth
        from zipline_dagster.jobs.launchers.ray_head import EMBEDDED_AUTH_MODE, LocalRayHead

        head = LocalRayHead(self.embedded_state_dir).ensure_running()
        return head.dashboard_url, EMBEDDED_AUTH_MODE

    def archive_problem(self, uri: str, options: StorageOptions) -> str | None:
        """Ray downloads the archive itself (as the job's working_dir)."""
        from zipline_dagster.jobs.launchers.working_dir import working_dir_problem

        return working_dir_problem(uri, options)

    def runner(self, log: Any, store: Callable[[str], BlobStore] | None = None) -> TrainingRunner:
        from zipline_dagster.jobs.launchers.ray_job import RayJobRunner

        address, auth = self.resolved_address()
        return RayJobRunner(
            address=address,
            auth_mode=auth,
            timeout_s=self.timeout_s,
            poll_max_s=self.poll_max_s,
            unreachable_tolerance_s=self.unreachable_tolerance_s,
            request_timeout_s=self.request_timeout_s,
            install_requirements=(
                self.install_requirements
                if self.install_requirements is not None
                else settings().ray_install_requirements
            ),
            entrypoint_resources=(
                self.entrypoint_resources
                if self.entrypoint_resources is not None
                else settings().ray_entrypoint_resources
            ),
            log=log,
            store=store,
        )
