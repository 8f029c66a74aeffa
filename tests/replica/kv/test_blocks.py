"""The block manager: allocation, sharing through the prefix cache, LRU eviction, all-or-nothing growth,
and no leak: every block is free with a count of 0 once every sequence is freed."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from replica.kv.block_hash import CacheScope, extend_keys
from replica.kv.blocks import BlockManager

BS = 4
SCOPE = CacheScope("sha256:base", "acme-v1").digest()


def keys_of(tokens: list[int], scope: bytes = SCOPE) -> list[bytes]:
    out: list[bytes] = []
    extend_keys(out, tokens, scope, BS)
    return out


def test_allocation_covers_the_positions_and_takes_the_lowest_blocks_first() -> None:
    m = BlockManager(8, BS)
    assert m.allocate("a", 9)
    assert m.table("a") == [0, 1, 2] and m.num_free == 5
    assert m.allocate("a", 12) and m.table("a") == [0, 1, 2]  # still three blocks
    assert m.allocate("a", 13) and m.table("a") == [0, 1, 2, 3]
    m.check()


def test_growth_is_all_or_nothing() -> None:
    m = BlockManager(4, BS)
    assert m.allocate("a", 8)
    assert not m.allocate("b", 12)  # three needed, two free
    assert "b" not in m.tables and m.num_free == 2
    assert not m.allocate("a", 20) and m.table("a") == [0, 1]
    m.check()


def test_a_cached_prefix_is_shared_and_counted_once_per_holder() -> None:
    m = BlockManager(8, BS)
    prompt = list(range(10))
    assert m.allocate("a", len(prompt))
    m.cache("a", keys_of(prompt))  # blocks 0 and 1 are full and computed
    hits = m.cached_prefix(keys_of(prompt), max_blocks=2)
    assert hits == [0, 1]
    assert m.allocate("b", len(prompt), hits)
    assert m.table("b")[:2] == [0, 1] and m.blocks[0].ref_count == 2
    m.check()


def test_a_freed_cached_block_is_reused_until_it_is_evicted_lru() -> None:
    m = BlockManager(4, BS)
    prompt = list(range(8))
    assert m.allocate("a", 8)
    m.cache("a", keys_of(prompt))
    m.free_sequence("a")
    assert m.num_free == 4 and m.cached_prefix(keys_of(prompt), 2) == [0, 1]
    # the free list is in eviction order: never-used blocks 2, 3 first, then a's tail (1), then its head (0)
    assert list(m.free) == [2, 3, 1, 0]
    assert m.allocate("b", 12)  # takes 2, 3 and evicts block 1
    assert m.cached_prefix(keys_of(prompt), 2) == [0]
    m.check()


def test_a_held_block_is_never_evicted() -> None:
    m = BlockManager(3, BS)
    prompt = list(range(8))
    assert m.allocate("a", 8)
    m.cache("a", keys_of(prompt))
    assert not m.allocate("b", 8)  # two needed, one free: a's blocks are not for taking
    assert m.cached_prefix(keys_of(prompt), 2) == [0, 1]
    m.check()


def test_other_scopes_and_salts_miss() -> None:
    m = BlockManager(8, BS)
    prompt = list(range(8))
    assert m.allocate("a", 8)
    m.cache("a", keys_of(prompt))
    other = CacheScope("sha256:base", "acme-v2").digest()
    salted = CacheScope("sha256:base", "acme-v1", salt="s").digest()
    assert m.cached_prefix(keys_of(prompt, other), 2) == []
    assert m.cached_prefix(keys_of(prompt, salted), 2) == []


def test_an_equal_block_computed_twice_keeps_the_first_key() -> None:
    m = BlockManager(8, BS)
    prompt = list(range(8))
    assert m.allocate("a", 8) and m.allocate("b", 8)
    m.cache("a", keys_of(prompt))
    m.cache("b", keys_of(prompt))
    assert [m.blocks[b].key is None for b in m.table("b")] == [True, True]
    m.check()


def test_hits_join_only_an_empty_table() -> None:
    m = BlockManager(8, BS)
    assert m.allocate("a", 4)
    m.cache("a", keys_of([1, 2, 3, 4]))
    with pytest.raises(ValueError):
        m.allocate("a", 8, [0])


def test_without_prefix_caching_nothing_is_cached() -> None:
    m = BlockManager(8, BS, prefix_caching=False)
    assert m.allocate("a", 8)
    m.cache("a", keys_of(list(range(8))))
    assert m.cached == {} and m.cached_prefix(keys_of(list(range(8))), 2) == []


PROMPTS = st.lists(st.integers(0, 3), min_size=1, max_size=6)  # small alphabets share prefixes often


class BlockMachine(RuleBasedStateMachine):
    """Random sequences that share prefixes, grow, cache their full blocks and end; the invariants hold
    after every step, and every block is free with a count of 0 at the end."""

    @initialize(num_blocks=st.integers(1, 12))
    def start(self, num_blocks: int) -> None:
        self.m = BlockManager(num_blocks, 2)
        self.seqs: dict[str, list[int]] = {}
        self.n = 0

    @rule(prompt=PROMPTS)
    def admit(self, prompt: list[int]) -> None:
        self.n += 1
        sid = f"s{self.n}"
        keys: list[bytes] = []
        extend_keys(keys, prompt, SCOPE, 2)
        hits = self.m.cached_prefix(keys, (len(prompt) - 1) // 2)
        before = self.m.num_free
        if self.m.allocate(sid, len(prompt), hits):
            self.seqs[sid] = prompt
            self.m.cache(sid, keys[: len(prompt) // 2])
            assert self.m.table(sid)[: len(hits)] == hits
        else:
            assert self.m.num_free == before and sid not in self.m.tables

    @precondition(lambda self: bool(self.seqs))
    @rule(data=st.data(), token=st.integers(0, 3))
    def grow(self, data: st.DataObject, token: int) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        tokens = self.seqs[sid] + [token]
        if self.m.allocate(sid, len(tokens)):
            self.seqs[sid] = tokens
            keys: list[bytes] = []
            extend_keys(keys, tokens, SCOPE, 2)
            self.m.cache(sid, keys)

    @precondition(lambda self: bool(self.seqs))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.seqs)))
        del self.seqs[sid]
        self.m.free_sequence(sid)

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "m"):
            self.m.check()

    def teardown(self) -> None:
        if not hasattr(self, "m"):
            return
        for sid in list(self.seqs):
            self.m.free_sequence(sid)
        self.m.check()
        assert self.m.num_free == self.m.num_blocks
        assert all(b.ref_count == 0 for b in self.m.blocks)


TestBlockMachine = BlockMachine.TestCase
