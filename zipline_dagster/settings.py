"""Settings: the one place that reads the environment.

Every other module receives these values (resource fields, arguments); nothing else in
the library calls ``os.environ.get``. Trainers read only their flags.

| setting | environment variable | embedded default |
| --- | --- | --- |
| local state (Ray head, warehouse) | ``ZIPLINE_HOME`` | ``./.zipline`` |
| warehouse root (tables) | ``ZIPLINE_WAREHOUSE`` | ``file://$ZIPLINE_HOME/warehouse`` |
| model artifacts base | ``ZIPLINE_ARTIFACT_BASE`` | same as the warehouse |
| the tables' pyiceberg catalog (its name) | ``ZIPLINE_CATALOG`` | ``zipline`` |
| a SQL catalog's SQLAlchemy URL | ``ZIPLINE_CATALOG_URI`` | pyiceberg's configuration of the catalog when it has one, else the embedded SQLite catalog (``catalog.db`` in a ``file://`` warehouse; under ``$ZIPLINE_HOME/catalogs/`` for another) |
| launcher | ``ZIPLINE_LAUNCHER`` (``ray`` or ``local``) | ``ray`` |
| Ray cluster (dashboard address) | ``RAY_ADDRESS`` | the embedded head |
| Ray auth mode | ``RAY_AUTH_MODE`` | ``disabled`` for the embedded head |
| Ray resources of every job's driver | ``ZIPLINE_RAY_ENTRYPOINT_RESOURCES`` (JSON object) | none |
| install trainers' requirements in jobs | ``ZIPLINE_RAY_INSTALL_REQUIREMENTS`` (``true``/``false``) | ``true`` |
| Spark master | ``SPARK_MASTER`` | ``local[*]`` |
| S3 endpoint | ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` | AWS |
| S3 region | ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` | AWS default |
| GCS endpoint (an emulator) | ``STORAGE_EMULATOR_HOST`` | Google Cloud Storage |
| Azure storage (account + key, or an emulator) | ``AZURE_STORAGE_CONNECTION_STRING`` | the account in the ``abfss://`` URI, Azure's default credential |
| MLflow tracking server (on when set) | ``MLFLOW_TRACKING_URI`` | none: MLflow off |
| MLflow experiment of a model (``{model}``: its name) | ``ZIPLINE_MLFLOW_EXPERIMENT`` | ``{model}`` |
| copy model files into MLflow runs | ``ZIPLINE_MLFLOW_COPY_ARTIFACTS`` (``true``/``false``) | ``false`` (a reference) |
| the Dagster UI's URL (links back from MLflow) | ``ZIPLINE_DAGSTER_URL`` | none |
| the Dagster instance the CLI records in (backfill, promote) | ``DAGSTER_HOME`` | none |
| the ``warehouse_maintenance`` schedule started (``on``) | ``ZIPLINE_WAREHOUSE_MAINTENANCE`` | stopped |

Credentials are never settings: the AWS, Google and Azure SDKs and Ray read them from the
environment of the process (or the cluster) that needs them. The Azure connection string
is the exception the Azure SDK imposes (it holds the account key): it is never shown.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class StorageOptions:
    """How to reach each object store; None means the SDK's own default."""

    s3_endpoint_url: str | None = None
    aws_region: str | None = None
    gcs_endpoint_url: str | None = None
    #: Holds an account key: never shown (repr) nor put in a message.
    azure_connection_string: str | None = field(default=None, repr=False)


LAUNCHERS = ("ray", "local")

#: The storage URI schemes (``storage.blobs`` serves them), as users write them.
SCHEMES = ("file", "s3", "gs", "abfss")

#: The Spark master URLs spark-submit takes (a session on any other fails to start, with
#: Spark's reason only on the JVM's stderr: "Java gateway process exited").
_SPARK_MASTER = re.compile(
    r"^(yarn|local|local\[[^\]]+\]|local-cluster\[[^\]]+\]|(spark|k8s)://\S+)$"
)


class SettingsError(ValueError):
    """An environment variable holds a value the platform does not accept."""


@dataclass(frozen=True)
class Settings:
    home: Path
    warehouse: str
    artifact_base: str
    catalog: str = "zipline"
    #: a SQL catalog's SQLAlchemy URL (may hold a password: never shown)
    catalog_uri: str | None = field(default=None, repr=False)
    launcher: str = "ray"
    ray_address: str | None = None
    ray_auth_mode: str | None = None
    ray_entrypoint_resources: dict[str, float] | None = None
    ray_install_requirements: bool = True
    spark_master: str | None = None
    s3_endpoint_url: str | None = None
    aws_region: str | None = None
    gcs_endpoint_url: str | None = None
    azure_connection_string: str | None = field(default=None, repr=False)
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "{model}"
    mlflow_copy_artifacts: bool = False
    dagster_url: str | None = None
    dagster_home: str | None = None
    warehouse_maintenance: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ

        def get(*names: str) -> str | None:
            for name in names:
                if env.get(name):
                    return env[name]
            return None

        home = Path(get("ZIPLINE_HOME") or Path.cwd() / ".zipline").resolve()
        warehouse = _storage_uri(get("ZIPLINE_WAREHOUSE"), "ZIPLINE_WAREHOUSE")
        warehouse = warehouse or (home / "warehouse").as_uri()
        launcher = get("ZIPLINE_LAUNCHER") or "ray"
        if launcher not in LAUNCHERS:
            raise SettingsError(
                f"ZIPLINE_LAUNCHER={launcher!r} is invalid; accepted: {', '.join(LAUNCHERS)}"
            )
        resources = get("ZIPLINE_RAY_ENTRYPOINT_RESOURCES")
        install = _flag(
            get("ZIPLINE_RAY_INSTALL_REQUIREMENTS"), "ZIPLINE_RAY_INSTALL_REQUIREMENTS", True
        )
        experiment = get("ZIPLINE_MLFLOW_EXPERIMENT") or "{model}"
        try:
            experiment.format(model="m")
        except (KeyError, IndexError, ValueError):
            raise SettingsError(
                f"ZIPLINE_MLFLOW_EXPERIMENT={experiment!r} is invalid; expected a name, "
                "in which {model} stands for the model's name, e.g. /Shared/{model}"
            ) from None
        catalog = get("ZIPLINE_CATALOG") or "zipline"
        if not re.fullmatch(r"[A-Za-z0-9_-]+", catalog):
            raise SettingsError(
                f"ZIPLINE_CATALOG={catalog!r} is invalid; expected a catalog name "
                "(letters, digits, _ and -), as .pyiceberg.yaml names catalogs"
            )
        return cls(
            home=home,
            warehouse=warehouse,
            catalog=catalog,
            catalog_uri=get("ZIPLINE_CATALOG_URI"),
            artifact_base=_storage_uri(get("ZIPLINE_ARTIFACT_BASE"), "ZIPLINE_ARTIFACT_BASE")
            or warehouse,
            launcher=launcher,
            ray_address=get("RAY_ADDRESS"),
            ray_auth_mode=get("RAY_AUTH_MODE"),
            ray_entrypoint_resources=_resources(resources) if resources else None,
            ray_install_requirements=install,
            spark_master=spark_master(get("SPARK_MASTER"), "SPARK_MASTER"),
            s3_endpoint_url=get("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            aws_region=get("AWS_REGION", "AWS_DEFAULT_REGION"),
            gcs_endpoint_url=get("STORAGE_EMULATOR_HOST"),
            azure_connection_string=get("AZURE_STORAGE_CONNECTION_STRING"),
            mlflow_tracking_uri=get("MLFLOW_TRACKING_URI"),
            mlflow_experiment=experiment,
            mlflow_copy_artifacts=_flag(
                get("ZIPLINE_MLFLOW_COPY_ARTIFACTS"), "ZIPLINE_MLFLOW_COPY_ARTIFACTS", False
            ),
            dagster_url=get("ZIPLINE_DAGSTER_URL"),
            dagster_home=get("DAGSTER_HOME"),
            warehouse_maintenance=get("ZIPLINE_WAREHOUSE_MAINTENANCE") == "on",
        )

    @property
    def storage_options(self) -> StorageOptions:
        return StorageOptions(
            s3_endpoint_url=self.s3_endpoint_url,
            aws_region=self.aws_region,
            gcs_endpoint_url=self.gcs_endpoint_url,
            azure_connection_string=self.azure_connection_string,
        )


def _storage_uri(value: str | None, name: str) -> str | None:
    """``value`` when it is a storage URI with a path (or None); else an error naming
    ``name`` (a model declared on it would say its ``model_artifact_base_uri``)."""
    if value is None:
        return None
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in SCHEMES or not rest.strip("/"):
        raise SettingsError(
            f"{name}={value!r} is invalid; expected a URI with a path: "
            + ", ".join(f"{s}://..." for s in SCHEMES)
        )
    if scheme == "file" and not value.startswith("file:///"):
        raise SettingsError(f"{name}={value!r} is invalid; expected an absolute file:///path")
    return value


def spark_master(value: str | None, name: str) -> str | None:
    """``value`` when it is a Spark master URL (or None); else an error naming ``name``."""
    if value is not None and not _SPARK_MASTER.match(value):
        raise SettingsError(
            f"{name}={value!r} is not a Spark master URL; accepted: local, local[N], "
            "local[*], spark://host:port, yarn, k8s://https://host:port"
        )
    return value


def _flag(value: str | None, name: str, default: bool) -> bool:
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise SettingsError(f"{name}={value!r} is invalid; accepted: true, false")
    return value.lower() == "true"


def _resources(value: str) -> dict[str, float]:
    import json

    try:
        parsed = json.loads(value)
        if isinstance(parsed, dict) and all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
            for k, v in parsed.items()
        ):
            return {k: float(v) for k, v in parsed.items()}
    except ValueError:
        pass
    raise SettingsError(
        f"ZIPLINE_RAY_ENTRYPOINT_RESOURCES={value!r} is invalid; expected a JSON object of "
        'resource names to amounts > 0, e.g. {"worker": 0.001}'
    )


def settings() -> Settings:
    """The settings as the environment gives them now."""
    return Settings.from_env()


def zipline_home() -> Path:
    return settings().home


def artifact_base_uri() -> str:
    return settings().artifact_base
