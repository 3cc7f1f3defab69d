"""Re-export of the one token parser, which lives in :mod:`bcer.contracts.tokens`.

Kept so existing imports (``from bcer.engine.tokens import parse_token``) keep working.
"""
from __future__ import annotations

from ..contracts.tokens import (
    RUNTIME_KEYS,
    SCOPES,
    Scope,
    Token,
    find_tokens,
    is_token,
    normalise_seq,
    parse_token,
)

__all__ = ["RUNTIME_KEYS", "SCOPES", "Scope", "Token", "find_tokens", "is_token", "normalise_seq", "parse_token"]
