"""Identity names and the runtime ids minted from them.

An identity becomes part of storage paths and log lines, so it is validated once,
at the edge, and every later layer can trust it.
"""

from __future__ import annotations

import re

from ..errors import InvalidSpecError

MAX_IDENTITY_LENGTH = 200
_IDENTITY_CHARS = re.compile(r"[A-Za-z0-9._:/-]+")


def validate_identity(identity: object) -> str:
    """Return ``identity`` if it is a valid agent name, else raise.

    A valid identity is 1-200 characters of ``[A-Za-z0-9._:/-]``, does not start with
    ``/``, and contains no ``..`` (it becomes part of storage paths).

    Raises:
        InvalidSpecError: naming what is wrong and what a valid name looks like.
    """
    if not isinstance(identity, str):
        raise InvalidSpecError(
            f"identity must be a string such as 'orders/eu-1', got {type(identity).__name__}",
            field="identity",
        )
    problem = _identity_problem(identity)
    if problem:
        raise InvalidSpecError(
            f"invalid identity {identity[:60]!r}: {problem}. Use 1-{MAX_IDENTITY_LENGTH} characters of "
            f"letters, digits and . _ : / -, e.g. 'orders/eu-1'",
            field="identity",
        )
    return identity


def _identity_problem(identity: str) -> str:
    if not identity:
        return "it is empty"
    if len(identity) > MAX_IDENTITY_LENGTH:
        return f"it is {len(identity)} characters long, more than {MAX_IDENTITY_LENGTH}"
    if not _IDENTITY_CHARS.fullmatch(identity):
        bad = sorted({ch for ch in identity if not _IDENTITY_CHARS.fullmatch(ch)})
        return f"it contains characters that are not allowed: {''.join(bad)!r}"
    if identity.startswith("/"):
        return "it starts with '/'"
    if ".." in identity:
        return "it contains '..'"
    return ""


def format_runtime_id(identity: str, generation: int) -> str:
    """The runtime id of one generation of an identity: ``rt:{identity}:{generation}``."""
    return f"rt:{identity}:{generation}"


def parse_runtime_id(runtime_id: str) -> tuple[str, int]:
    """Split ``rt:{identity}:{generation}`` into its parts.

    Raises:
        InvalidSpecError: if the text does not have that shape.
    """
    prefix, _, rest = runtime_id.partition(":")
    identity, _, generation = rest.rpartition(":")
    if prefix != "rt" or not identity or not generation.isdigit():
        raise InvalidSpecError(
            f"invalid runtime id {runtime_id!r}: expected the shape 'rt:{{identity}}:{{generation}}'",
            field="runtime_id",
        )
    return validate_identity(identity), int(generation)
