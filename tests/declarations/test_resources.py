"""A model's memory budget (``ResourceConfig.memory_per_replica``) and a scores table's
batch size (``ModelTransforms.batch_rows``): checked at load, passed to the job, and
versioned only when they change what is trained."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.scoring import transforms_for
from tests.support.training import make_model
from zipline_dagster import ModelSpecError, ResourceConfig
from zipline_dagster.declarations.versions import model_code_version, scores_code_version
from zipline_dagster.jobs.request import training_invocation


def with_memory(memory: int | None, replicas: int = 0) -> object:
    model = make_model("0123456789ab", "file:///tmp/x")
    conf = dataclasses.replace(
        model.training_conf,
        resource_config=ResourceConfig(min_replica_count=replicas, memory_per_replica=memory),
    )
    return dataclasses.replace(model, training_conf=conf)


@pytest.mark.parametrize("value", [10, 2.5e9, True, "4GiB", -1])
def test_a_memory_budget_that_is_not_bytes_is_refused_naming_it(value: object) -> None:
    with pytest.raises(ModelSpecError) as err:
        ResourceConfig(memory_per_replica=value)  # type: ignore[arg-type]
    assert f"ResourceConfig.memory_per_replica={value!r} is invalid" in str(err.value)
    assert "whole number >= 67108864 (64 MiB), or None" in str(err.value)


def test_the_budget_reaches_the_trainer_and_the_job_and_versions_the_model() -> None:
    plain, budgeted = with_memory(None), with_memory(2**30)
    flags = training_invocation(
        budgeted, start_ds="2026-07-07", end_ds="2026-07-10", warehouse="file:///w",
        model_dir="file:///m",
    ).to_flags()  # fmt: skip
    assert "--memory-budget=1073741824" in flags
    assert not any(
        f.startswith("--memory-budget")
        for f in training_invocation(
            plain, start_ds="2026-07-07", end_ds="2026-07-10", warehouse="file:///w",
            model_dir="file:///m",
        ).to_flags()
    )  # fmt: skip
    # a budget picks the training matrix: a model that sets one is another version; a
    # model that sets none keeps the version it had
    assert model_code_version(budgeted) != model_code_version(plain)
    assert model_code_version(plain) == model_code_version(
        make_model("0123456789ab", "file:///tmp/x")
    )


def test_a_scores_batch_size_is_checked_and_shapes_files_not_versions() -> None:
    model = make_model("0123456789ab", "file:///tmp/x")
    with pytest.raises(ModelSpecError, match=r"batch_rows=-5 is invalid; expected a whole number"):
        transforms_for(model, batch_rows=-5)
    assert scores_code_version(transforms_for(model, batch_rows=1000)) == scores_code_version(
        transforms_for(model)
    )


def test_a_job_gives_its_trainer_the_threads_of_the_cpus_it_holds() -> None:
    """A trainer's default threads are its job's CPUs: a job's entrypoint gets
    ``OMP_NUM_THREADS`` of the CPUs its driver holds (Ray sets it for tasks only), and a
    job whose driver holds none (Ray Train workers do) sets nothing."""
    from zipline_dagster.jobs.launchers.ray_job import RayJobRunner
    from zipline_dagster.jobs.request import build_training_request

    runner = RayJobRunner(address="http://127.0.0.1:1")  # never contacted
    one = build_training_request(
        make_model("a" * 12, "file:///w"), "2026-07-10", warehouse="file:///t"
    )
    assert one.threads_env == {"OMP_NUM_THREADS": "1"}
    assert runner.runtime_env(one, [])["env_vars"]["OMP_NUM_THREADS"] == "1"
    workers = build_training_request(
        make_model("a" * 12, "file:///w", replicas=2), "2026-07-10", warehouse="file:///t"
    )
    assert (
        workers.threads_env == {}
        and "OMP_NUM_THREADS" not in runner.runtime_env(workers, [])["env_vars"]
    )
