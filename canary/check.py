"""The isolation verdict: given who asked and which markers came back, count leaks. Pure logic, no torch.

Shared by the engine-level CI test and the end-to-end probe, so both judge a row the same way:
- wrong_marker: the output carries a marker of an adapter other than the requester's (a leak);
- base_with_marker: a base-only request came back with any marker (a leak into the base path);
- missing_marker: an adapter request did not carry its own marker (wrong or no weights applied).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    """One row that failed the check, kept for the report."""

    request_id: str
    adapter_id: str | None
    found: tuple[str, ...]
    kind: str


@dataclass
class IsolationTally:
    """Running counts over many requests; ok() is the pass/fail of the whole run."""

    requests: int = 0
    adapter_requests: int = 0
    base_requests: int = 0
    wrong_marker: int = 0
    base_with_marker: int = 0
    missing_marker: int = 0
    errors: int = 0
    findings: list[Finding] = field(default_factory=list)
    max_findings: int = 20

    def record(self, request_id: str, adapter_id: str | None, found: Iterable[str]) -> None:
        """Judge one completed request: adapter_id is what it was admitted for (None = base)."""
        found_set = set(found)
        self.requests += 1
        if adapter_id is None:
            self.base_requests += 1
            if found_set:
                self.base_with_marker += 1
                self._keep(request_id, adapter_id, found_set, "base_with_marker")
            return
        self.adapter_requests += 1
        if found_set - {adapter_id}:
            self.wrong_marker += 1
            self._keep(request_id, adapter_id, found_set, "wrong_marker")
        if adapter_id not in found_set:
            self.missing_marker += 1
            self._keep(request_id, adapter_id, found_set, "missing_marker")

    def record_error(self, request_id: str, adapter_id: str | None, message: str) -> None:
        """A request that failed outright (counted, never a pass)."""
        self.requests += 1
        self.errors += 1
        self._keep(request_id, adapter_id, (message,), "error")

    def leaks(self) -> int:
        """Rows that carried weights they should not have."""
        return self.wrong_marker + self.base_with_marker

    def ok(self) -> bool:
        return self.leaks() == 0 and self.missing_marker == 0 and self.errors == 0 and self.requests > 0

    def _keep(self, request_id: str, adapter_id: str | None, found: Iterable[str], kind: str) -> None:
        if len(self.findings) < self.max_findings:
            self.findings.append(Finding(request_id, adapter_id, tuple(sorted(found)), kind))

    def summary(self) -> dict[str, object]:
        """JSON-ready counts plus the first few findings."""
        return {
            "requests": self.requests,
            "adapter_requests": self.adapter_requests,
            "base_requests": self.base_requests,
            "wrong_marker": self.wrong_marker,
            "base_with_marker": self.base_with_marker,
            "missing_marker": self.missing_marker,
            "errors": self.errors,
            "ok": self.ok(),
            "findings": self.finding_rows(),
        }

    def finding_rows(self) -> list[dict[str, object]]:
        return [f.__dict__ for f in self.findings]
