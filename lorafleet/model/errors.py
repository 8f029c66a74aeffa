"""Errors of the base-model tools: preparing the default checkpoint and hashing a checkpoint."""

from __future__ import annotations


class BaseModelError(Exception):
    """A base checkpoint cannot be prepared or hashed (source missing, shards absent or truncated)."""
