"""Error text for people: the message, then each cause's type and message.

Steps fail with a clean ``dg.Failure`` (no Python traceback in the UI) and the CLI prints
one ``error:`` line, but neither drops what caused the error: the chain of causes is
appended as ``caused by Type: message``, skipping a cause whose text the message holds.
"""

from __future__ import annotations


def describe(exc: BaseException) -> str:
    text = str(exc)
    seen = {id(exc)}
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        message = " ".join(str(cause).split())
        if message and message not in " ".join(text.split()):
            text += f"\n(caused by {type(cause).__name__}: {message[:500]})"
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return text


def failure(exc: BaseException, **metadata: object) -> Exception:
    """A ``dg.Failure`` for a step: the description keeps the causes, the error type is
    metadata, and no traceback is attached."""
    import dagster as dg

    return dg.Failure(
        description=describe(exc),
        metadata={"error_type": type(exc).__name__, **metadata},  # type: ignore[dict-item]
    )


def step_error(error: object) -> str:
    """``Type: first line`` of a failed step's error (Dagster's ``SerializableErrorInfo``),
    the user's own error rather than Dagster's wrapper around it."""
    while getattr(error, "cause", None) and (
        getattr(error, "cls_name", "") == "DagsterExecutionStepExecutionError"
    ):
        error = error.cause  # type: ignore[attr-defined]
    message = str(getattr(error, "message", "")).strip()
    text = message.partition(": ")[2] or message  # the message repeats the type's path
    return f"{getattr(error, 'cls_name', 'Error')}: {(text.splitlines() or [''])[0]}"
