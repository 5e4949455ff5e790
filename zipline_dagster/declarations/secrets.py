"""What a model's ``job_configs`` may hold: flags, never credentials.

``job_configs`` become command-line arguments, visible in process listings, Ray job info
and logs, so a value that looks like a secret is refused at load, and no refusal echoes
the value (it may be the credential).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Any

from zipline_dagster.declarations.errors import ModelSpecError

JOB_CONFIG_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
#: Flags the platform always sets from the partition being trained; never user-set.
RESERVED_JOB_CONFIG_KEYS = frozenset({"input-table", "start-ds", "end-ds"})

# Key names that announce a credential. Values under such keys must be environment
# variable *names* (upper-case identifiers), passed as e.g. "client-secret-env".
_SECRET_KEY_WORDS = frozenset(
    {"secret", "password", "passwd", "pwd", "token", "apikey", "credential", "credentials"}
)
_SECRET_KEY_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})
_ENV_VAR_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Value shapes that are credentials whatever key they sit under.
_SECRET_VALUE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("an AWS access key id", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b")),
    ("a Slack token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("a Databricks token", re.compile(r"\bdapi[0-9a-f]{32}\b")),
    ("a private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("a JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.")),
    ("credentials inside a URL", re.compile(r"://[^/\s:@]+:[^/\s@]+@")),
)


def describe_refused(value: object) -> str:
    """What a refused ``job_configs`` value is, without its content.

    Refusal messages land in logs and the Dagster UI, and a refused value may be a
    credential (a PEM key is multi-line), so they say its kind and length only.
    """
    if not isinstance(value, str):
        return f"a value of type {type(value).__name__}"
    kinds = []
    if "\n" in value:
        kinds.append(f"{value.count(chr(10)) + 1}-line")
    if "\x00" in value:
        kinds.append("NUL-containing")
    if not value:
        return "an empty string"
    return f"a {len(value)}-character {' '.join([*kinds, 'string'])} (not shown)"


def check_job_configs(model: str, job_configs: Mapping[str, Any]) -> None:
    """Refuse reserved keys, malformed keys/values and anything that looks like a secret.

    No message echoes a value: it may be a credential (see ``describe_refused``).
    """
    for key, value in job_configs.items():
        fld = f"training_conf.job_configs[{key!r}]"
        if not isinstance(key, str) or not JOB_CONFIG_KEY_RE.match(key):
            shown = key if isinstance(key, str) and len(key) <= 64 and key.isprintable() else None
            raise ModelSpecError(
                f"Model {model!r}: training_conf.job_configs key "
                + (repr(shown) if shown is not None else describe_refused(key))
                + " is invalid; expected a flag name of letters, digits, '-' and '_' "
                "(it becomes --key=value)."
            )
        if key in RESERVED_JOB_CONFIG_KEYS:
            raise ModelSpecError(
                f"Model {model!r}: {fld} is refused ({describe_refused(value)}); {key!r} is "
                "set by the platform from the partition being trained; remove it "
                f"(platform-owned keys: {', '.join(sorted(RESERVED_JOB_CONFIG_KEYS))})."
            )
        if not isinstance(value, str):
            raise ModelSpecError(
                f"Model {model!r}: {fld} is {describe_refused(value)}; expected a string value."
            )
        if "\n" in value or "\x00" in value:
            raise ModelSpecError(
                f"Model {model!r}: {fld} is {describe_refused(value)}; expected a single-line "
                "value (multi-line values are often keys or certificates: pass the name of an "
                "environment variable set on the Ray cluster instead)."
            )
        reason = _secret_reason(key, value)
        if reason:
            raise ModelSpecError(
                f"Model {model!r}: {fld} looks like a secret ({reason}); it is "
                f"{describe_refused(value)}. job_configs become command-line "
                "arguments visible in process listings, Ray job info and logs. Pass the "
                "name of an environment variable instead, e.g. "
                '{"client-secret-env": "DATABRICKS_CLIENT_SECRET"}, and set that variable '
                "on the Ray cluster."
            )


def _secret_reason(key: str, value: str) -> str | None:
    for what, pattern in _SECRET_VALUE_PATTERNS:
        if pattern.search(value):
            return f"the value contains {what}"
    words = [w for w in re.split(r"[-_]", key.lower()) if w]
    names_secret = bool(_SECRET_KEY_WORDS.intersection(words)) or any(
        pair in _SECRET_KEY_PAIRS for pair in itertools.pairwise(words)
    )
    if names_secret and not _ENV_VAR_NAME_RE.match(value):
        return (
            f"the key {key!r} names a credential and the value is not an environment variable name"
        )
    return None
