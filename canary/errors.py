"""Canary errors."""

from __future__ import annotations


class CanaryError(Exception):
    """Base of canary failures."""


class CanaryTrainingError(CanaryError):
    """Some canaries did not learn to answer every held-out prompt with their marker."""

    def __init__(self, message: str, weak: dict[str, float]) -> None:
        super().__init__(message)
        self.weak = weak  # adapter_id -> smallest logit margin on held-out prompts
