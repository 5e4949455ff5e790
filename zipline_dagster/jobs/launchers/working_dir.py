"""Can Ray's runtime-env agent download a trainer archive from this URI?

Ray fetches a remote ``working_dir`` itself (``ray._private.runtime_env.protocol``), with
its own clients, not the platform's storage layer: ``s3://`` through smart_open + boto3,
``gs://`` through smart_open + google-cloud-storage, ``abfss://`` through adlfs with
Azure's default credential against ``https://{account}.dfs.core.windows.net``. Asked
when a code location loads, so a model whose archive Ray could never fetch fails then,
naming the scheme and the reason, rather than as a failed job at training time.
Checked in this environment; a remote cluster needs the same clients on every node.
"""

from __future__ import annotations

import importlib.util
from urllib.parse import urlparse

from zipline_dagster.settings import StorageOptions

#: scheme -> the modules Ray's agent imports to fetch it (and the pip names).
_CLIENTS = {
    "s3": (("boto3", "smart_open"), "smart_open[s3] boto3"),
    "gs": (("google.cloud.storage", "smart_open"), "smart_open[gcs] google-cloud-storage"),
    "abfss": (("adlfs", "azure.identity"), "adlfs azure-identity"),
}
_AZURE_DFS = ".dfs.core.windows.net"


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def _connection_endpoint(connection_string: str) -> str | None:
    """The BlobEndpoint of a connection string (never the rest: it holds the key)."""
    for part in connection_string.split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "blobendpoint":
            return value.strip()
    return None


def working_dir_problem(uri: str, options: StorageOptions) -> str | None:
    """Why Ray cannot fetch ``uri`` as a ``working_dir``; None when it can."""
    parsed = urlparse(uri)
    scheme = parsed.scheme
    if scheme == "file":
        return None
    if scheme not in _CLIENTS:
        return f"Ray fetches working_dirs from file://, s3://, gs:// and abfss://, not {scheme}://"
    modules, pip_names = _CLIENTS[scheme]
    absent = [m for m in modules if _missing(m)]
    if absent:
        return (
            f"Ray's runtime-env agent needs {', '.join(absent)} to fetch {scheme}:// "
            f"(pip install {pip_names} on every Ray node)"
        )
    if scheme == "abfss":
        container, _, host = parsed.netloc.partition("@")
        if not container or not host.endswith(_AZURE_DFS):
            return (
                f"Ray fetches abfss:// only as abfss://container@account{_AZURE_DFS}/path; "
                f"the host is {host or parsed.netloc!r}"
            )
        endpoint = _connection_endpoint(options.azure_connection_string or "")
        if endpoint and not urlparse(endpoint).netloc.endswith(".core.windows.net"):
            return (
                "Ray signs in to https://{account}" + _AZURE_DFS + " with Azure's default "
                "credential and does not use AZURE_STORAGE_CONNECTION_STRING, whose blob "
                f"endpoint ({urlparse(endpoint).netloc}) is not Azure's (an emulator?)"
            )
    return None
