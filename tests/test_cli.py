"""The CLI end to end, as a user runs it (a real subprocess)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BIN, run_cli
from zipline_dagster.jobs.archive import build_trainer_archive
from zipline_dagster.storage.blobs import blob_store


def _kv(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def test_build_then_verify_file(trainer_copy: Path, file_base: str) -> None:
    res = run_cli(
        "build-trainer", str(trainer_copy), "--model-name", "listing_ctr_model", "--base", file_base
    )
    assert res.returncode == 0, res.stderr
    out = _kv(res.stdout)
    expected = build_trainer_archive(trainer_copy).version
    assert out["version"] == expected
    assert out["uri"] == f"{file_base}/builds/listing_ctr_model-{expected}.zip"
    assert blob_store(out["uri"]).exists(out["uri"])

    res = run_cli(
        "verify-trainer",
        "--model-name",
        "listing_ctr_model",
        "--version",
        expected,
        "--base",
        file_base,
    )
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout

    blob_store(out["uri"]).write_bytes(out["uri"], b"PK not the archive")
    res = run_cli(
        "verify-trainer",
        "--model-name",
        "listing_ctr_model",
        "--version",
        expected,
        "--base",
        file_base,
    )
    assert res.returncode == 1
    assert out["uri"] in res.stderr and "does not match" in res.stderr


def test_build_then_verify_s3(trainer_copy: Path, s3_bucket: str, s3_env: dict[str, str]) -> None:
    base = f"{s3_bucket}/wh"
    res = run_cli(
        "build-trainer", str(trainer_copy), "--model-name", "m1", "--base", base, env=s3_env
    )
    assert res.returncode == 0, res.stderr
    version = _kv(res.stdout)["version"]
    res = run_cli(
        "verify-trainer", "--model-name", "m1", "--version", version, "--base", base, env=s3_env
    )
    assert res.returncode == 0, res.stderr


def test_verify_missing_archive_fails_with_path(file_base: str) -> None:
    res = run_cli(
        "verify-trainer", "--model-name", "m", "--version", "abcdefabcdef", "--base", file_base
    )
    assert res.returncode == 1
    assert f"{file_base}/builds/m-abcdefabcdef.zip" in res.stderr


def test_verify_refuses_a_name_or_version_that_cannot_name_an_archive(file_base: str) -> None:
    """Both make the archive's path: a value that is not one is named, with what is
    accepted, before any path is made from it."""
    for name, version, said in [
        ("m", "../../etc", "version '../../etc' is not a trainer archive's content address"),
        ("m", "latest", "expected 12 to 64 lowercase hex characters"),
        ("../x", "abcdefabcdef", "model name '../x' is invalid"),
    ]:
        res = run_cli(
            "verify-trainer", "--model-name", name, "--version", version, "--base", file_base
        )
        assert res.returncode == 1 and said in res.stderr, res.stderr
        assert "builds/" not in res.stderr  # no path was made


def test_build_refuses_escaping_symlink(trainer_copy: Path, tmp_path: Path, file_base: str) -> None:
    (tmp_path / "secret").write_text("x")
    (trainer_copy / "link").symlink_to(tmp_path / "secret")
    res = run_cli("build-trainer", str(trainer_copy), "--model-name", "m", "--base", file_base)
    assert res.returncode == 1
    assert "outside the package" in res.stderr
    assert blob_store(file_base).list(file_base) == []  # nothing half-written


def test_build_refuses_bad_model_name(trainer_copy: Path, file_base: str) -> None:
    res = run_cli("build-trainer", str(trainer_copy), "--model-name", "../x", "--base", file_base)
    assert res.returncode == 1
    assert "'../x'" in res.stderr


def _clean_error(res: Any, *fragments: str) -> None:
    """One `error:` line (plus causes), the fragments, and no Python traceback."""
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stderr.count("error: ") == 1, res.stderr
    for f in fragments:
        assert f in res.stderr, res.stderr


BACKFILL = ("backfill", "listing_ctr_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-11")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("new-model", "Churn"), "new-model 'Churn': expected a safe path segment"),
        (("new-model", "churn", "--label", "price", "--features", "price"), "--label=price"),
        (("new-model", "churn"), "no Dagster project around"),
        (BACKFILL, "no Dagster project around"),
    ],
)
def test_what_was_typed_is_refused_before_dagster_loads(
    tmp_path: Path, args: tuple[str, ...], fragment: str
) -> None:
    """A refused name, flag or place is said in one line at once: the process imports
    no Dagster (some 3 CPU-seconds), not even to know which errors it may catch."""
    res = subprocess.run(
        [str(BIN / "python"), "-X", "importtime", str(BIN / "zipline-dagster"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # no project here
    )
    assert res.returncode == 1
    said = [line for line in res.stderr.splitlines() if not line.startswith("import time:")]
    assert len(said) == 1 and said[0].startswith("error: ") and fragment in said[0], said
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in res.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "zipline_dagster.cli" in imported and "dagster" not in imported


def test_every_user_error_is_named_where_it_is_defined() -> None:
    """The CLI catches a user error by its defining module (``USER_ERRORS``); a class
    moved or renamed would go uncaught, a traceback instead of one line."""
    import importlib

    from zipline_dagster.cli import USER_ERRORS, user_errors

    for module, name in USER_ERRORS:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, Exception) and cls.__module__ == module, (module, name)
    assert len(user_errors()) == len(USER_ERRORS)  # all imported here: all caught


def test_backfill_without_dagster_home_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    res = subprocess.run(
        [str(BIN / "zipline-dagster"), *BACKFILL], capture_output=True, text=True, env=env
    )
    _clean_error(res, "DAGSTER_HOME is not set", "export DAGSTER_HOME=")


@pytest.mark.parametrize(
    "args", [BACKFILL, ("promote", "listing_ctr_model", "--ds", "2026-07-11")], ids=lambda a: a[0]
)
def test_a_dagster_home_that_is_no_folder_is_named(args: tuple[str, ...], tmp_path: Path) -> None:
    """Dagster's own error is a traceback; the CLI names the value and what to do."""
    missing = tmp_path / "no_such_home"
    res = subprocess.run(
        [str(BIN / "zipline-dagster"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DAGSTER_HOME": str(missing), "ZIPLINE_HOME": str(tmp_path / "z")},
    )
    _clean_error(res, f"DAGSTER_HOME='{missing}' is not a directory", "unset DAGSTER_HOME")


@pytest.mark.parametrize(
    ("module", "fragment"),
    [
        ("no_such_code_location", "--module='no_such_code_location': no such module"),
        ("json", "--module='json' defines no `defs` Definitions object (found nothing)"),
    ],
)
def test_backfill_with_a_bad_module_says_so(tmp_path: Path, module: str, fragment: str) -> None:
    res = run_cli(*BACKFILL, "--module", module, env={"DAGSTER_HOME": str(tmp_path)})
    _clean_error(res, fragment)


def test_backfill_of_a_code_location_with_an_invalid_model_says_which(tmp_path: Path) -> None:
    (tmp_path / "bad_location.py").write_text(
        "from zipline_dagster import EventSource, InferenceSpec, Model, TrainingSpec, Window\n"
        "Model(version='latest', model_artifact_base_uri='file:///tmp/w',\n"
        "      inference_spec=InferenceSpec(model_backend_params={'model_name': 'm1'}),\n"
        "      training_conf=TrainingSpec(training_data_source=EventSource(table='a.b'),\n"
        "                                 training_data_window=Window(length=2)))\n"
    )
    res = run_cli(
        *BACKFILL,
        "--module",
        "bad_location",
        env={"DAGSTER_HOME": str(tmp_path), "PYTHONPATH": str(tmp_path)},
    )
    _clean_error(res, "Model 'm1': version='latest' is invalid")


def test_ray_up_with_an_unusable_state_folder_says_so(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    res = run_cli("ray", "up", "--state-dir", str(tmp_path / "a_file" / "ray"))
    _clean_error(res, "cannot use", "state folder", "NotADirectoryError", "RAY_ADDRESS")


def test_backfill_wait_refuses_a_workspace_that_is_not_there(tmp_path: Path) -> None:
    """``--wait`` runs the backfill's runs from the workspace file: one that is not there
    is named before anything is planned or launched (no backfill left for nobody)."""
    import dagster as dg

    home = tmp_path / "dagster"
    home.mkdir()
    missing = tmp_path / "nowhere.yaml"
    res = run_cli(
        *("backfill", "listing_ctr_model", "--start-ds", "2026-07-11", "--end-ds", "2026-07-11"),
        *("--wait", "--workspace", str(missing)),
        env={"DAGSTER_HOME": str(home), "ZIPLINE_HOME": str(tmp_path / "zipline")},
    )
    assert res.returncode == 1
    assert f"--workspace={missing} is not a file" in res.stderr, res.stderr
    assert "backfill_id" not in res.stdout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_backfills() == []


TINY_LOCATION = """
import dagster as dg

@dg.asset(key_prefix="tiny", partitions_def=dg.DailyPartitionsDefinition(start_date="2026-07-01"))
def numbers(context):
    context.log.info("computing the numbers of " + context.partition_key)
    if context.partition_key == "2026-07-12":
        raise dg.Failure("no numbers arrived for this day")

defs = dg.Definitions(assets=[numbers])
"""


def _tiny_project(tmp_path: Path, module: str, source: str) -> tuple[Path, Path]:
    """A code location ``module`` (``source``) with its workspace file, and a Dagster
    instance folder whose runs Dagster's default launcher runs in their own processes."""
    (tmp_path / f"{module}.py").write_text(source)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        f"load_from:\n  - python_module:\n      module_name: {module}\n"
        f"      working_directory: {tmp_path}\n"
    )
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # its SQLite storage is created here, before a daemon and this test open it at once:
    # two processes creating a fresh instance can stamp its schema twice, and every later
    # open then fails ("alembic_version has more than one head present", seen in CI)
    import dagster as dg

    dg.DagsterInstance.from_config(str(home)).dispose()
    return workspace, home


def test_backfill_wait_shows_progress_keeps_the_runs_output_and_names_what_failed(
    tmp_path: Path,
) -> None:
    """``--wait`` runs the backfill here: stderr holds the plan and its progress, not
    every run's log (kept in a file it names), and a failed run is named with why."""
    from tests.helpers import in_process_dagster_home

    workspace, _ = _tiny_project(tmp_path, "tiny_location", TINY_LOCATION)
    home = in_process_dagster_home(tmp_path)
    env = {"DAGSTER_HOME": str(home), "PYTHONPATH": str(tmp_path)}
    # a backfill launched without --wait, left requested on the instance (no daemon)
    left = run_cli(
        *("backfill", "tiny/numbers", "--start-ds", "2026-07-10", "--end-ds", "2026-07-10"),
        *("--module", "tiny_location"),
        env=env,
    )
    assert left.returncode == 0 and "no dagster-daemon is running" in left.stderr, left.stderr
    res = run_cli(
        *("backfill", "tiny/numbers", "--start-ds", "2026-07-11", "--end-ds", "2026-07-12"),
        *("--wait", "--workspace", str(workspace), "--module", "tiny_location"),
        env=env,
    )
    assert res.returncode == 1, res.stderr
    assert [line.partition("=")[0] for line in res.stdout.splitlines()] == [
        "backfill_id",
        "status",
    ], res.stdout
    assert "status=COMPLETED_FAILED" in res.stdout
    assert "computing the numbers of" not in res.stderr  # the runs' log is not streamed
    output = home / "logs" / f"backfill-{res.stdout.split()[0].split('=')[1]}.log"
    assert f"the runs' output: {output}" in res.stderr
    assert "computing the numbers of 2026-07-11" in output.read_text()
    assert "2 runs 1 failure, 1 success" in res.stderr, res.stderr
    failed = [line for line in res.stderr.splitlines() if "failed:" in line]
    assert len(failed) == 1 and "no numbers arrived for this day" in failed[0], res.stderr
    # --wait ran its own backfill only: the one left requested was not its to run
    import dagster as dg

    left_id = left.stdout.split("backfill_id=", 1)[1].split()[0]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_backfill(left_id).status.value == "REQUESTED"  # type: ignore[union-attr]
        assert instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": left_id})) == []


def test_backfill_wait_follows_the_instances_daemon_instead_of_racing_it(
    tmp_path: Path,
) -> None:
    """With a dagster-daemon running for the instance (a real one, as `make dev` starts),
    ``--wait`` follows the backfill the daemon runs rather than driving it a second time
    (one daemon per instance): it needs no workspace of its own, it keeps following
    through a restart of the daemon, one run trains the one partition, and it ends once
    that partition is materialized."""
    import time

    import dagster as dg

    from zipline_dagster.lineage.internals import daemon_running

    workspace, home = _tiny_project(tmp_path, "tiny_location", TINY_LOCATION)
    env = {"DAGSTER_HOME": str(home), "PYTHONPATH": str(tmp_path)}

    def start_daemon() -> subprocess.Popen[bytes]:
        with (tmp_path / "daemon.log").open("a") as log:
            return subprocess.Popen(
                [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)],
                cwd=tmp_path,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its code server and runs: one group, stopped here
            )

    daemon = start_daemon()
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            deadline = time.monotonic() + 90
            while not daemon_running(instance):
                assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()
                assert time.monotonic() < deadline, "the daemon never heartbeat"
                time.sleep(0.5)
            args = [str(BIN / "zipline-dagster"), "backfill", "tiny/numbers"]
            args += ["--start-ds", "2026-07-11", "--end-ds", "2026-07-11"]
            args += ["--module", "tiny_location", "--wait"]
            args += ["--workspace", str(tmp_path / "not-needed.yaml")]
            cli = subprocess.Popen(
                args,
                env={**os.environ, **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert cli.stderr is not None
            seen = []
            for line in cli.stderr:
                seen.append(line)
                if "following it" in line:
                    break
            # `make dev` restarted: the new daemon's first pass (at its start, not 30 s
            # after the old one's) launches the run, and the command follows it still
            _stop_group(daemon)
            daemon = start_daemon()
            out, err = cli.communicate(timeout=120)
            err = "".join(seen) + err
            assert cli.returncode == 0, err
            assert "a dagster-daemon runs this instance's backfills: following it" in err
            assert "running the backfill here" not in err and "the runs' output" not in err
            assert "status=COMPLETED_SUCCESS" in out
            # it ends once the partition is materialized, not at the daemon's next pass
            assert "COMPLETED_SUCCESS: every partition materialized" in err
            backfill_id = out.split("backfill_id=", 1)[1].split()[0]
            runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
            assert [r.dagster_run.status.value for r in runs] == ["SUCCESS"]
    finally:
        _stop_group(daemon)


def _stop_group(leader: subprocess.Popen[bytes]) -> None:
    """Stop ``leader``'s process group (started here: its processes only) and reap it."""
    import contextlib

    from zipline_dagster.processes import ProcessIdentity, terminate

    with contextlib.suppress(ProcessLookupError):  # ended already
        terminate(ProcessIdentity.of(leader.pid), group=True, timeout=30)
    leader.wait()


HELD_LOCATION = """
import os, time
import dagster as dg

@dg.asset(key_prefix="tiny", partitions_def=dg.DailyPartitionsDefinition(start_date="2026-07-01"))
def numbers(context):
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.2)

defs = dg.Definitions(assets=[numbers])
"""


def test_backfill_wait_interrupted_says_what_goes_on_and_leaves_the_backfill(
    tmp_path: Path,
) -> None:
    """Ctrl-C on ``--wait`` stops waiting, not the backfill: it says so (the backfill's
    id, that its launched runs finish and a daemon launches the rest, where to cancel
    it), with no traceback, and the instance still holds the backfill as requested.
    Real processes: the CLI, its code server and a run worker (Dagster's default
    launcher); the test waits for each of them to end."""
    import signal
    import time

    import dagster as dg

    from zipline_dagster.processes import descendants

    workspace, home = _tiny_project(tmp_path, "held_location", HELD_LOCATION)
    release = tmp_path / "release"
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(tmp_path)}
    env["RELEASE"] = str(release)
    args = [str(BIN / "zipline-dagster"), "backfill", "tiny/numbers"]
    args += ["--start-ds", "2026-07-12", "--end-ds", "2026-07-12", "--wait"]
    args += ["--workspace", str(workspace), "--module", "held_location"]
    cli = subprocess.Popen(
        args,
        # a shell's background job ignores SIGINT; a user's Ctrl-C is delivered
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    started: set[int] = set()
    try:
        assert cli.stderr is not None
        for line in cli.stderr:  # the plan, then the progress: wait for the run to start
            seen.append(line)
            if "1 started" in line:
                break
        started = {p.pid for p in descendants(cli.pid)}  # its code server, the run's worker
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=60)
    finally:
        release.touch()  # the run ends; then its worker and the code server do
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        deadline = time.monotonic() + 90
        while any(Path(f"/proc/{pid}").exists() for pid in started):
            assert time.monotonic() < deadline, f"processes the CLI started still run: {started}"
            time.sleep(0.5)
    err = "".join(seen) + err
    assert cli.returncode == 130, err
    assert seen[-1].strip().endswith("1 started (tiny/numbers 2026-07-12)"), err  # what runs
    backfill_id = out.split("backfill_id=", 1)[1].split()[0]
    assert f"interrupted: stopped waiting. Backfill {backfill_id} goes on" in err, err
    assert "cancel it in the Dagster UI" in err and "Traceback" not in err, err
    with dg.DagsterInstance.from_config(str(home)) as instance:
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None and backfill.status.value == "REQUESTED"
        runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert [r.dagster_run.status.value for r in runs] == ["SUCCESS"]  # it went on


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("localhost:3000", "--url='localhost:3000' is not a Dagster webserver address"),
        (
            "http://127.0.0.1:{port}",
            "the Dagster webserver at http://127.0.0.1:{port} did not answer",
        ),
    ],
)
def test_backfill_through_a_webserver_that_is_not_there_says_so(
    tmp_path: Path, url: str, fragment: str
) -> None:
    """``--url`` launches the backfill through the deployment's GraphQL API: an address
    that is not one, or a webserver that does not answer, is named, and nothing is left
    launched in the instance."""
    import dagster as dg

    from tests.conftest import free_port

    port = free_port()  # nothing listens there
    home = tmp_path / "dagster"
    home.mkdir()
    res = run_cli(
        *BACKFILL,
        *("--url", url.format(port=port)),
        env={"DAGSTER_HOME": str(home), "ZIPLINE_HOME": str(tmp_path / "zipline")},
    )
    _clean_error(res, fragment.format(port=port))
    assert "backfill_id" not in res.stdout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_backfills() == []
