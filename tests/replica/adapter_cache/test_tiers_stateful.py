"""Property-based state machines: budgets are never exceeded and nothing in use is ever evicted."""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from replica.adapter_cache.errors import TierFullError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.host import HostAdapter, HostTier, pack
from replica.adapter_cache.lru import ByteLru
from replica.errors import NoFreeSlotError
from replica.lora.weights import AdapterWeights, ModuleLora
from tests.replica.adapter_cache.helpers import BASE_HASH, SPEC, make_layers

IDS = [f"a{i}" for i in range(8)]
RANKS = {name: 2 + (i % 3) * 3 for i, name in enumerate(IDS)}  # ranks 2, 5, 8: buckets 4 and 8


def weights_for(adapter_id: str) -> AdapterWeights:
    """Every value of adapter i is i + 1, so a slot's contents name its adapter."""
    value, r = float(IDS.index(adapter_id) + 1), RANKS[adapter_id]
    modules = {
        (layer, name): ModuleLora(torch.full((r, i), value), torch.full((o, r), value), 1.0)
        for layer in range(SPEC.num_layers)
        for name, (i, o) in SPEC.shapes.items()
    }
    return AdapterWeights(adapter_id, BASE_HASH, modules)


class LruMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lru: ByteLru[str] = ByteLru(100)
        self.pins: dict[str, int] = {}

    @rule(key=st.sampled_from(IDS), size=st.integers(1, 60))
    def add(self, key: str, size: int) -> None:
        before = set(self.lru.keys())
        try:
            evicted = self.lru.add(key, size)
        except TierFullError:
            assert set(self.lru.keys()) == before
            return
        assert not any(self.pins.get(k, 0) for k in evicted)
        for k in evicted:
            self.pins.pop(k, None)

    @rule(key=st.sampled_from(IDS))
    def pin(self, key: str) -> None:
        if key in self.lru:
            self.lru.pin(key)
            self.pins[key] = self.pins.get(key, 0) + 1

    @rule(key=st.sampled_from(IDS))
    def unpin(self, key: str) -> None:
        if self.pins.get(key, 0):
            self.lru.unpin(key)
            self.pins[key] -= 1

    @invariant()
    def within_budget_and_pinned_kept(self) -> None:
        assert self.lru.used <= self.lru.budget
        assert self.lru.used == sum(self.lru.size(k) for k in self.lru.keys())
        assert all(k in self.lru for k, n in self.pins.items() if n)


class GpuHostMachine(RuleBasedStateMachine):
    """Requests pin adapters in slots while others load: a running adapter's slot always holds its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.capacities = {4: 2, 8: 2}
        self.layers = make_layers(self.capacities)
        self.gpu = GpuTier(self.layers, self.capacities)
        self.one = self._pack("a0").nbytes
        self.host = HostTier(3 * self.one)
        self.running: list[str] = []

    def _pack(self, adapter_id: str) -> HostAdapter:
        weights = weights_for(adapter_id)
        return pack(weights, "0" * 64, torch.float32, False, self.gpu.row_layout(weights.rank))

    @rule(adapter_id=st.sampled_from(IDS))
    def request(self, adapter_id: str) -> None:
        if self.gpu.try_pin(adapter_id) is not None:
            self.running.append(adapter_id)
            return
        item = self.host.get_pinned(adapter_id)
        if item is None:
            try:
                self.host.put(self._pack(adapter_id), pinned=True)
            except TierFullError:
                return
            item = self.host.get(adapter_id)
        try:
            self.gpu.load(item)
        except NoFreeSlotError:
            return
        finally:
            self.host.unpin(adapter_id)
        assert self.gpu.try_pin(adapter_id) is not None
        self.running.append(adapter_id)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        adapter_id = data.draw(st.sampled_from(self.running))
        self.running.remove(adapter_id)
        self.gpu.release(adapter_id)

    @invariant()
    def running_adapters_keep_their_slots(self) -> None:
        assert self.host.used_bytes <= self.host.lru.budget
        for adapter_id in set(self.running):
            entry = self.gpu.table.lookup(adapter_id)
            assert entry is not None and entry.ref_count == self.running.count(adapter_id)
            value = float(IDS.index(adapter_id) + 1)
            r = RANKS[adapter_id]
            for lin in self.layers.values():
                pool = lin.pools[entry.ref.bucket]
                assert torch.all(pool.a[entry.ref.index, :r] == value)
                assert torch.all(pool.a[entry.ref.index, r:] == 0)
        slots = [e.ref for e in self.gpu.table.entries()]
        assert len(slots) == len(set(slots))


TestLru = LruMachine.TestCase
TestLru.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestGpuHost = GpuHostMachine.TestCase
TestGpuHost.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
