"""How a pydantic validation error is put into words, the same way wherever input is checked."""

from __future__ import annotations

from pydantic import ValidationError


def validation_problems(exc: ValidationError, root: str, *, first_only: bool = False) -> str:
    """``where: what`` for each problem (``root`` names the top level), joined with ``; ``."""
    errors = exc.errors()[:1] if first_only else exc.errors()
    return "; ".join(
        f"{'.'.join(str(part) for part in error.get('loc', ())) or root}: {error.get('msg')}" for error in errors
    )
