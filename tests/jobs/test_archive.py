from __future__ import annotations

import io
import os
import random
import shutil
import zipfile
from pathlib import Path

import pytest

from zipline_dagster.jobs.archive import (
    FIXED_DATE_TIME,
    TrainerArchiveError,
    build_trainer_archive,
    content_version,
)


def _copy_shuffled(src: Path, dst: Path, seed: int) -> None:
    """Copy a tree creating files in a random order with random mtimes and modes."""
    rng = random.Random(seed)
    files = [p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    rng.shuffle(files)
    for f in files:
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.read_bytes())
        t = rng.randint(0, 2_000_000_000)
        os.utime(target, (t, t))
        os.chmod(target, rng.choice([0o600, 0o640, 0o644, 0o664]))


def test_same_source_same_bytes_regardless_of_mtime_order_and_umask(
    trainer_copy: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a" / "listing_ctr_model", tmp_path / "b" / "listing_ctr_model"
    old = os.umask(0o022)
    try:
        _copy_shuffled(trainer_copy, a, seed=1)
        os.umask(0o077)
        _copy_shuffled(trainer_copy, b, seed=2)
    finally:
        os.umask(old)
    # caches and VCS folders that differ between machines must not change the bytes
    (b / "trainer" / "__pycache__").mkdir()
    (b / "trainer" / "__pycache__" / "train.cpython-311.pyc").write_bytes(os.urandom(64))
    (b / ".git").mkdir()
    (b / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (b / "build" / "lib").mkdir(parents=True)
    (b / "build" / "lib" / "x.py").write_text("x = 1\n")
    (b / "listing_ctr_model.egg-info").mkdir()
    (b / "listing_ctr_model.egg-info" / "PKG-INFO").write_text("Name: x\n")

    ra, rb = build_trainer_archive(a), build_trainer_archive(b)
    assert ra.data == rb.data
    assert ra.version == rb.version == content_version(ra.data)
    assert len(ra.version) == 12 and ra.sha256.startswith(ra.version)


def test_any_source_change_changes_the_version(trainer_copy: Path) -> None:
    before = build_trainer_archive(trainer_copy).version
    setup = trainer_copy / "setup.py"
    setup.write_text(
        setup.read_text().replace('name="listing_ctr_model"', 'name="listing_ctr_model2"')
    )
    assert build_trainer_archive(trainer_copy).version != before


def test_exactly_one_top_level_folder_with_the_package_inside(trainer_copy: Path) -> None:
    archive = build_trainer_archive(trainer_copy)
    with zipfile.ZipFile(io.BytesIO(archive.data)) as zf:
        names = zf.namelist()
        infos = zf.infolist()
    # the setup.py name, not the folder's
    assert {n.split("/", 1)[0] for n in names} == {"listing_ctr_model"}
    # After Ray strips the top folder, `python -m trainer.train` must resolve.
    stripped = {n.split("/", 1)[1] for n in names}
    assert {"setup.py", "trainer/__init__.py", "trainer/train.py", "trainer/cli.py"} <= stripped
    assert names == sorted(names)
    assert all(i.date_time == FIXED_DATE_TIME for i in infos)
    assert {(i.external_attr >> 16) & 0o777 for i in infos} == {0o644}
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_executable_bit_is_kept_and_normalised(trainer_copy: Path) -> None:
    script = trainer_copy / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o700)
    with zipfile.ZipFile(io.BytesIO(build_trainer_archive(trainer_copy).data)) as zf:
        mode = (zf.getinfo("listing_ctr_model/run.sh").external_attr >> 16) & 0o777
    assert mode == 0o755


def test_symlink_outside_package_refused(trainer_copy: Path, tmp_path: Path) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("not part of the trainer")
    (trainer_copy / "trainer" / "leak.txt").symlink_to(secret)
    with pytest.raises(TrainerArchiveError) as exc:
        build_trainer_archive(trainer_copy)
    assert "trainer/leak.txt" in str(exc.value) and "outside the package" in str(exc.value)


def test_symlink_to_parent_folder_refused(trainer_copy: Path) -> None:
    (trainer_copy / "up").symlink_to("..")
    with pytest.raises(TrainerArchiveError, match="outside the package"):
        build_trainer_archive(trainer_copy)


def test_symlink_inside_package_is_archived_as_its_content(trainer_copy: Path) -> None:
    (trainer_copy / "trainer" / "alias.py").symlink_to("cli.py")
    archive = build_trainer_archive(trainer_copy)
    with zipfile.ZipFile(io.BytesIO(archive.data)) as zf:
        assert (
            zf.read("listing_ctr_model/trainer/alias.py")
            == (trainer_copy / "trainer" / "cli.py").read_bytes()
        )


def test_folder_without_setup_py_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    with pytest.raises(TrainerArchiveError, match="no setup.py"):
        build_trainer_archive(tmp_path / "pkg")


def test_missing_folder_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainerArchiveError, match="does not exist"):
        build_trainer_archive(tmp_path / "nope")


def test_checked_in_reference_trainer_is_deterministic(tmp_path: Path) -> None:
    from tests.conftest import TRAINERS

    dst = tmp_path / "listing_ctr_model"
    shutil.copytree(
        TRAINERS / "listing_ctr_model", dst, ignore=shutil.ignore_patterns("__pycache__")
    )
    assert (
        build_trainer_archive(dst).data
        == build_trainer_archive(TRAINERS / "listing_ctr_model").data
    )


def test_version_does_not_depend_on_the_folder_it_is_built_from(
    trainer_copy: Path, tmp_path: Path
) -> None:
    """The same files under another folder name (another checkout) give the same bytes."""
    elsewhere = tmp_path / "some-checkout" / "renamed_folder"
    shutil.copytree(trainer_copy, elsewhere)
    a, b = build_trainer_archive(trainer_copy), build_trainer_archive(elsewhere)
    assert a.data == b.data and a.version == b.version
    with zipfile.ZipFile(io.BytesIO(b.data)) as zf:
        assert {n.split("/", 1)[0] for n in zf.namelist()} == {"listing_ctr_model"}


@pytest.mark.parametrize(
    ("setup_py", "fragment"),
    [
        (
            "from setuptools import setup\nREQS = ['pandas']\nsetup(name='t', install_requires=REQS)\n",
            "install_requires=REQS is not a literal",
        ),
        (
            "from setuptools import setup\nsetup(name='t', install_requires=open('r.txt').read().split())\n",
            "is not a literal",
        ),
        ("from setuptools import setup\nsetup(name=NAME)\n", "name=NAME is not a literal"),
        ("from setuptools import setup\nsetup(name='a/b')\n", "name='a/b' is invalid"),
        ("from setuptools import setup\nsetup(install_requires=[])\n", "sets no name"),
        ("from setuptools import setup\nsetup(name='t', install_requires=[1])\n", "list of"),
        ("setup(name='t'\n", "is not valid Python"),
    ],
)
def test_setup_py_keywords_must_be_literals(
    trainer_copy: Path, setup_py: str, fragment: str
) -> None:
    (trainer_copy / "setup.py").write_text(setup_py)
    with pytest.raises(TrainerArchiveError) as exc:
        build_trainer_archive(trainer_copy)
    assert fragment in str(exc.value) and "setup.py" in str(exc.value)


def test_install_requires_of_a_stored_archive_read_with_a_clear_error(trainer_copy: Path) -> None:
    """An archive built elsewhere (not by build_trainer_archive) is checked when it is used."""
    from zipline_dagster.jobs.request import (
        read_install_requires,
    )

    good = build_trainer_archive(trainer_copy)
    assert "pandas>=2.3,<3" in read_install_requires(good.data)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(
            "t/setup.py", "from setuptools import setup\nsetup(name='t', install_requires=R)\n"
        )
    with pytest.raises(TrainerArchiveError, match=r"s3://b/x.zip: t/setup.py: install_requires=R"):
        read_install_requires(buf.getvalue(), uri="s3://b/x.zip")


def test_an_archive_holds_the_trainers_own_files_only(trainer_copy: Path) -> None:
    """What jobs import from the platform is the runtime, which reaches each job beside
    the archive: the archive holds the trainer's files only (so its content address is its
    own code), and a trainer folder cannot bring a package under the runtime's name.
    (Until issue 69 this test asserted the opposite: every archive carried the support
    modules and the driver.)"""
    archive = build_trainer_archive(trainer_copy)
    with zipfile.ZipFile(io.BytesIO(archive.data)) as zf:
        names = zf.namelist()
    on_disk = sorted(
        f"listing_ctr_model/{p.relative_to(trainer_copy).as_posix()}"
        for p in trainer_copy.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert names == on_disk
    assert not any("zipline" in n for n in names)
    (trainer_copy / "zipline_runtime").mkdir()
    (trainer_copy / "zipline_runtime" / "__init__.py").write_text("x = 1\n")
    with pytest.raises(TrainerArchiveError, match=r"own zipline_runtime/; that name is the"):
        build_trainer_archive(trainer_copy)
