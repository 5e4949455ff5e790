"""The CLI end to end, as a user runs it (a real subprocess)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli
from zipline_dagster.archive import build_trainer_archive
from zipline_dagster.storage import blob_store


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
