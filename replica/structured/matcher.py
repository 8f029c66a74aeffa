"""One sequence's grammar state over llguidance: the tokens allowed next, and advancing by the chosen one."""

from __future__ import annotations

import llguidance


class GrammarMatcher:
    """A sequence's own matcher (never shared): its bitmask, then the token the sampler chose."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def allowed_bitmask(self) -> bytes:
        """Bit t % 8 of byte t // 8 is set when token t may come next (llguidance's little-endian 32-bit
        words; EOS only when the grammar accepts what came so far)."""
        return self._matcher.compute_bitmask()

    def advance(self, token_id: int) -> bool:
        """Take the chosen token; True when the grammar is now complete and takes nothing more but EOS."""
        self._matcher.consume_token(token_id)
        return self._matcher.is_stopped()
