"""The KV block manager: which blocks each sequence holds, reference counts, the free list and the prefix
cache. Plain Python state, no torch.

Every block is in exactly one of two places: held (reference count > 0, in one or more sequences' block
tables) or free (count 0, in the free list). The free list is in eviction order: a block freed last is
evicted last, and a sequence frees its blocks tail first, so a shared prefix outlives the private tail
after it. A free block may still be cached (it keeps its key): a sequence that finds the key takes the
block back from the free list instead of recomputing it. Allocation takes blocks from the head of the
free list and forgets their keys. A held block is never given to another sequence, so the K and V a
running sequence reads never change under it; only full blocks are ever cached or shared, and a sequence
writes only past its last full block, so no write ever reaches a shared block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None  # set once the block is full and its K/V are computed: then it is cached


class BlockManager:
    """Blocks of block_size token positions, shared through their keys when prefix caching is on."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of one token, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head: next evicted
        self.cached: dict[bytes, int] = {}  # key -> the block holding it
        self.tables: dict[str, list[int]] = {}  # sequence id -> its blocks, in position order
        self.evictions = 0  # cached blocks given to new content since start

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that num_tokens positions take."""
        return -(-num_tokens // self.block_size)

    def table(self, seq_id: str) -> list[int]:
        return self.tables.get(seq_id, [])

    def cached_prefix(self, keys: list[bytes], max_blocks: int) -> list[int]:
        """The blocks of the longest run of keys from the first that the cache holds (at most max_blocks)."""
        if not self.prefix_caching:
            return []
        found = []
        for key in keys[:max_blocks]:
            block_id = self.cached.get(key)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def blocks_needed(self, seq_id: str, num_tokens: int, hits: Sequence[int] = ()) -> int:
        """Free-list blocks that allocate(seq_id, num_tokens, hits) would use up: new blocks, and cached
        hits that are free now (taking one removes it from the free list)."""
        new = max(0, self.blocks_for(num_tokens) - len(self.table(seq_id)) - len(hits))
        return new + sum(1 for b in hits if self.blocks[b].ref_count == 0)

    def can_allocate(self, seq_id: str, num_tokens: int, hits: Sequence[int] = (), reserve: int = 0) -> bool:
        return self.blocks_needed(seq_id, num_tokens, hits) + reserve <= self.num_free

    def allocate(self, seq_id: str, num_tokens: int, hits: Sequence[int] = ()) -> bool:
        """Grow seq_id's table to cover num_tokens positions: first the cached hits (only for a sequence that
        holds no block yet), then new blocks. All or nothing: False, and no change, when too few are free."""
        table = self.tables.setdefault(seq_id, [])
        if hits and table:
            raise ValueError(f"{seq_id} already holds blocks; cached hits join only an empty table")
        if not self.can_allocate(seq_id, num_tokens, hits):
            if not table:
                del self.tables[seq_id]
            return False
        for block_id in hits:
            self._take(block_id)
            table.append(block_id)
        while len(table) < self.blocks_for(num_tokens):
            block_id, _ = self.free.popitem(last=False)
            block = self.blocks[block_id]
            if block.key is not None:  # evicted: its key now names nothing
                del self.cached[block.key]
                block.key = None
                self.evictions += 1
            block.ref_count = 1
            table.append(block_id)
        return True

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def cache(self, seq_id: str, keys: list[bytes]) -> None:
        """Record the keys of seq_id's full, computed blocks (keys[i] is block i's). A key another block holds
        already stays with that block; this sequence's copy stays uncached."""
        if not self.prefix_caching:
            return
        table = self.tables[seq_id]
        for block_id, key in zip(table, keys, strict=False):
            block = self.blocks[block_id]
            if block.key is None and key not in self.cached:
                block.key = key
                self.cached[key] = block_id

    def free_sequence(self, seq_id: str) -> None:
        """Drop seq_id's hold on its blocks, tail first; a block nobody holds joins the free list's tail."""
        for block_id in reversed(self.tables.pop(seq_id, [])):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None

    def check(self) -> None:
        """Assert the invariants (tests and debugging): counts match the tables, the free list is exactly the
        unheld blocks, and the cache maps each key to the one block that carries it."""
        held: dict[int, int] = {}
        for table in self.tables.values():
            assert len(set(table)) == len(table), f"a table holds a block twice: {table}"
            for block_id in table:
                held[block_id] = held.get(block_id, 0) + 1
        for block in self.blocks:
            assert block.ref_count == held.get(block.block_id, 0), block
            assert (block.ref_count == 0) == (block.block_id in self.free), block
            if block.key is not None:
                assert self.cached.get(block.key) == block.block_id, block
        assert all(self.blocks[b].key == k for k, b in self.cached.items())
