"""The geometry of a slot row: which module sits where, and how a packed buffer of some modules lands in it.

Pure: no torch. replica.lora.arena allocates rows of this layout; the RAM tier packs adapters in it.
A row holds each module as A [rank, in_features] then B [out_features, rank] at the bucket's rank, in the
order of the modules' PEFT tensor names (as a safetensors file stores them: layer "0", "1", "10", ...,
then mlp before self_attn, then by name). So a PEFT file that adapts every module at the bucket's rank in
the slot dtype already holds one slot row in its data section, and the RAM tier keeps it without a copy.
A packed buffer holds only the modules an adapter targets, in row order: it lands as a few contiguous
runs (one when it targets every module), and the untargeted modules' spans are zeroed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from schemas.llama import LLAMA_MODULES

ModuleKey = tuple[int, str]  # (layer index, module name such as "q_proj")

Run = tuple[int, int, int]  # (offset in the slot row, offset in the packed buffer, numel)
Gap = tuple[int, int]  # (offset in the slot row, numel): zeroed


def name_order(key: ModuleKey) -> tuple[str, str, str]:
    """Sort key of a module as its PEFT tensor name sorts (...model.layers.{i}.{parent}.{name}...)."""
    layer, name = key
    return str(layer), LLAMA_MODULES.get(name, ""), name


@dataclass(frozen=True)
class RowPlan:
    """How one packed buffer (the target modules only, in row order) lands in a slot row."""

    copies: tuple[Run, ...]
    zeros: tuple[Gap, ...]
    scale_copies: tuple[Run, ...]
    scale_zeros: tuple[Gap, ...]
    numel: int  # of the packed buffer
    num_scales: int


@dataclass(frozen=True)
class RowLayout:
    """Pure geometry of one bucket's slot row: module order and where each module's A and B begin."""

    rank: int
    modules: tuple[tuple[ModuleKey, int, int], ...]  # (key, in_features, out_features) in row order
    _plans: dict[tuple[ModuleKey, ...], RowPlan] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def for_modules(rank: int, shapes: dict[ModuleKey, tuple[int, int]]) -> RowLayout:
        """shapes: key -> (in_features, out_features); the row is in PEFT tensor-name order."""
        return RowLayout(rank, tuple((k, *shapes[k]) for k in sorted(shapes, key=name_order)))

    @cached_property
    def index(self) -> dict[ModuleKey, int]:
        return {key: j for j, (key, _, _) in enumerate(self.modules)}

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        """Start of each module's A in the row; its B follows at + rank * in_features; last item: the row."""
        out, cursor = [], 0
        for _key, fan_in, fan_out in self.modules:
            out.append(cursor)
            cursor += self.rank * (fan_in + fan_out)
        out.append(cursor)
        return tuple(out)

    @property
    def row_numel(self) -> int:
        return self.offsets[-1]

    def module_numel(self, key: ModuleKey) -> int:
        j = self.index[key]
        return self.offsets[j + 1] - self.offsets[j]

    def plan(self, targets: tuple[ModuleKey, ...]) -> RowPlan:
        """Runs for a buffer packing `targets` (a subset, in row order): copies, and zeros for the rest.

        KeyError for a module this row does not hold; ValueError when targets are not in row order.
        """
        cached = self._plans.get(targets)
        if cached is not None:
            return cached
        js = [self.index[k] for k in targets]
        if js != sorted(set(js)):
            raise ValueError("targets must be distinct and in the row's module order")
        copies: list[Run] = []
        zeros: list[Gap] = []
        scale_copies: list[Run] = []
        scale_zeros: list[Gap] = []
        buf = 0
        covered = 0  # module index up to which the row is accounted for
        for n, j in enumerate(js):
            if j > covered:
                zeros.append((self.offsets[covered], self.offsets[j] - self.offsets[covered]))
                scale_zeros.append((covered, j - covered))
            size = self.offsets[j + 1] - self.offsets[j]
            if copies and copies[-1][0] + copies[-1][2] == self.offsets[j]:
                row, start, numel = copies[-1]
                copies[-1] = (row, start, numel + size)
                s_row, s_start, s_n = scale_copies[-1]
                scale_copies[-1] = (s_row, s_start, s_n + 1)
            else:
                copies.append((self.offsets[j], buf, size))
                scale_copies.append((j, n, 1))
            buf += size
            covered = j + 1
        if covered < len(self.modules):
            zeros.append((self.offsets[covered], self.row_numel - self.offsets[covered]))
            scale_zeros.append((covered, len(self.modules) - covered))
        plan = RowPlan(tuple(copies), tuple(zeros), tuple(scale_copies), tuple(scale_zeros), buf, len(js))
        if len(self._plans) < 1024:
            self._plans[targets] = plan
        return plan
