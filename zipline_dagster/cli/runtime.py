"""``zipline-dagster adopt-runtime``: pin the project's jobs to the runtime installed here
(or a runtime package folder), naming the models it re-versions."""

from __future__ import annotations

import argparse
import sys

from zipline_dagster.cli.common import CliError, declared_models, project_code_location


def adopt_runtime(args: argparse.Namespace) -> int:
    import importlib

    from zipline_dagster.declarations.model import Model
    from zipline_dagster.jobs.pins import find_lock, read_runtime_pin, record_runtime_pin
    from zipline_dagster.jobs.runtime import RuntimeShipError, check_protocol, store_runtime
    from zipline_dagster.packaging import RuntimeBuildError, build_runtime_archive

    module = args.module or project_code_location()
    try:
        archive = build_runtime_archive(args.source)
        check_protocol(archive, args.source or "the installed zipline-runtime")
    except (RuntimeBuildError, RuntimeShipError) as exc:
        raise CliError(f"adopt-runtime: {exc}") from None
    lock = find_lock(str(importlib.import_module(module).__file__))
    before = read_runtime_pin(lock)
    if before is not None and before.version == archive.version:
        print(f"ok: {lock} pins runtime {archive.version} already; nothing changes")
        return 0
    models = [m for m in declared_models(module).values() if isinstance(m, Model)]
    # the models that declare the lock's pin (``pinned_runtime``) move with it
    staled = sorted(
        m.name for m in models if before is not None and m.runtime_version == before.version
    )
    for base in sorted({m.model_artifact_base_uri for m in models}):
        print(f"stored {store_runtime(base, archive)}", file=sys.stderr)
    record_runtime_pin(lock, archive)
    print(
        f"pinned runtime {archive.version} (zipline-runtime {archive.package_version}, "
        f"protocol {archive.protocol}) in {lock}, replacing "
        f"{before.version if before else 'no pin'}"
    )
    if staled:
        print(
            f"re-versions {len(staled)} model(s): {', '.join(staled)}; their partitions show "
            "unsynced, and automation retrains them"
        )
    else:
        print("re-versions no model: none declares the lock's runtime")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "adopt-runtime",
        help="pin the project's jobs to the installed runtime; names the models it re-versions",
    )
    p.add_argument("--module", help="code location module (default: the project's)")
    p.add_argument(
        "--source",
        help="a zipline_runtime package folder to adopt instead of the installed one",
    )
    p.set_defaults(func=adopt_runtime)
