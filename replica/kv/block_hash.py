"""The key of a full KV block: its tokens, every token before them, and the scope that computed them.

A block's K and V depend on the base weights, on the adapter (LoRA on k_proj/v_proj, and on every earlier
layer, changes them) and on every preceding token. So the key chains the previous block's key with the
block's tokens, and the scope (base model hash, adapter version id, an optional per-request salt) is in
every link. Blocks are reused only on an exact key match: the key is a security boundary, so it is a
SHA-256 digest, never Python's hash().
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheScope:
    """What besides the tokens decides a block's K and V; blocks are shared only within one scope."""

    base_model_hash: str  # the weights the replica serves (with a merged adapter folded in, its id too)
    adapter_id: str | None  # the immutable adapter version id; None for the base alone
    salt: str | None = None  # a request's cache_salt: only requests with the same salt share blocks

    def digest(self) -> bytes:
        """32 bytes that differ whenever any field differs (fields are length-prefixed, None is distinct)."""
        h = hashlib.sha256(b"lorafleet-kv-scope-v1")
        for field in (self.base_model_hash, self.adapter_id, self.salt):
            raw = b"\xff" if field is None else b"\x00" + field.encode()
            h.update(struct.pack("<I", len(raw)) + raw)
        return h.digest()


def block_key(parent: bytes | None, tokens: list[int], scope_digest: bytes) -> bytes:
    """The key of one full block: SHA-256 over the parent's key, the scope and the block's token ids."""
    h = hashlib.sha256(parent or b"\x00" * 32)
    h.update(scope_digest)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


def extend_keys(keys: list[bytes], token_ids: list[int], scope_digest: bytes, block_size: int) -> None:
    """Append the keys of the full blocks of token_ids that keys does not cover yet (in place)."""
    for i in range(len(keys), len(token_ids) // block_size):
        parent = keys[i - 1] if i else None
        keys.append(block_key(parent, token_ids[i * block_size : (i + 1) * block_size], scope_digest))
