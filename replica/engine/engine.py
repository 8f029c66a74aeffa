"""LLMEngine: the synchronous core. add_request, abort and step; one step is one forward pass."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from replica.engine.admission_queue import AdmissionQueue
from replica.engine.grammar_mask import Grammar, constrain
from replica.engine.logprobs import TokenLogprobs
from replica.engine.model_runner import ModelRunner, StepInput
from replica.engine.sampler import SamplingParams, launch_sample, row_seed
from replica.engine.scheduler import Scheduled, Scheduler
from replica.engine.sequence import Detokenizer, Sequence, SequenceStatus
from replica.engine.slot_pins import SlotPins
from replica.engine.trace import AdmissionTrace
from replica.errors import ContextLengthError, InvalidRequestError, SlotMismatchError
from replica.kv.block_hash import CacheScope
from replica.kv.blocks import BlockManager
from replica.model.stop_strings import scan_stop_strings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepOutput:
    """One event for one request: a new token (with its text delta), and the end when finished is True."""

    request_id: str
    token_id: int | None
    text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when it was first admitted
    logprobs: TokenLogprobs | None = None  # token_id's, when the request asked for logprobs


@dataclass(frozen=True)
class KvPolicy:
    """How the engine uses its KV blocks."""

    namespace: str = ""  # the served weights (base hash; a merged replica adds its adapter): the cache scope
    prefix_caching: bool = True
    chunked_prefill: bool = True
    watermark: float = 0.01  # share of blocks kept free when admitting, so decoding rarely preempts


@dataclass(frozen=True)
class _Taken:
    """A sampled token whose text and stop-string scan are still to come."""

    seq: Sequence
    token: int
    is_stop_token: bool
    logprobs: TokenLogprobs | None = None


class LLMEngine:
    """Continuous batching over a ModelRunner, each adapted row pinned to its adapter's slot (SlotPins)."""

    def __init__(
        self,
        runner: ModelRunner,
        lora: SlotPins | None,
        eos_token_ids: set[int],
        max_num_batched_tokens: int = 8192,
        detokenizer_factory: Callable[[], Detokenizer] | None = None,
        waiting: AdmissionQueue[Sequence] | None = None,
        prefill_delay_s: float = 0.0,
        kv: KvPolicy = KvPolicy(),
        overlap_text: bool | None = None,
        prepare_ahead: bool | None = None,
    ) -> None:
        self.runner = runner
        # Stage the next decode step's inputs while the device computes this one, where launches are
        # asynchronous (CUDA); elsewhere the step has ended by then, and the staging would only add work.
        self.prepare_ahead = runner.device.type == "cuda" if prepare_ahead is None else prepare_ahead
        # Detokenize after the next launch where launches are asynchronous (CUDA); at once elsewhere, where
        # waiting a step would only delay every token.
        self.overlap_text = runner.device.type == "cuda" if overlap_text is None else overlap_text
        self._pending: list[_Taken] = []
        self.lora = lora
        self.eos_token_ids = set(eos_token_ids)
        self.detokenizer_factory = detokenizer_factory
        self.kv = kv
        self.blocks = BlockManager(runner.kv.num_blocks, runner.block_size, kv.prefix_caching)
        self.scheduler = Scheduler(
            runner.max_num_seqs,
            max_num_batched_tokens,
            self.blocks,
            lora,
            waiting,
            chunked_prefill=kv.chunked_prefill,
            watermark_blocks=int(kv.watermark * runner.kv.num_blocks),
        )
        self.seqs: dict[str, Sequence] = {}
        self.prefill_delay_s = prefill_delay_s  # fault injection only (ReplicaSettings.fault_prefill_delay_s)

    def check_request(
        self, prompt_token_ids: list[int], params: SamplingParams, prompt_param: str = "messages"
    ) -> None:
        """Raise a domain error for a request that can never run, or whose prompt plus max_tokens does not fit
        the context: refused before it is queued, never cut short at the context's end. prompt_param names
        the field the prompt came in (messages, or a completion's prompt)."""
        vocab = self.runner.model.config.vocab_size
        params.validate(vocab)
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise InvalidRequestError(f"token ids must be in [0, {vocab})", param="prompt_token_ids")
        limit, prompt = self.runner.max_model_len, len(prompt_token_ids)
        if prompt >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens; the {prompt_param} take {prompt}",
                param=prompt_param,
            )
        if prompt + params.max_tokens > limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens; the request asks for "
                f"{prompt + params.max_tokens} ({prompt} in the {prompt_param}, {params.max_tokens} in the "
                "completion)",
                param="max_tokens",
            )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        adapter_id: str | None = None,
        trace: AdmissionTrace | None = None,
        tenant_id: str | None = None,
        cache_salt: str | None = None,
        grammar: Grammar | None = None,
    ) -> Sequence:
        """Queue a request; it joins the running batch at a coming step (the admission queue's choice).
        Its KV blocks are shared only with requests of the same adapter version and cache_salt."""
        self.check_request(prompt_token_ids, params)
        if request_id in self.seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already in flight", param="request_id")
        seq = Sequence(request_id, list(prompt_token_ids), params, adapter_id, tenant_id, trace=trace)
        seq.grammar = grammar
        seq.scope = CacheScope(self.kv.namespace, adapter_id, cache_salt).digest()
        seq.seed = row_seed(params)
        seq.detokenizer = self.detokenizer_factory() if self.detokenizer_factory else None
        self.seqs[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> bool:
        """Cancel a request: its KV row and adapter pin are freed now (a taken token's text is dropped)."""
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        if seq.status is not SequenceStatus.FINISHED:
            self.scheduler.finish(seq, "abort")
        return True

    def has_work(self) -> bool:
        return bool(self.scheduler.running or self.scheduler.waiting or self._pending)

    def step(self) -> list[StepOutput]:
        """Admit, run one forward pass over every scheduled row, sample where a row reached its last token,
        and report what happened. The forward and the draw are queued first; the host work that does not
        need this step's tokens runs before they are read. With overlap_text, a token's text and stop-string
        scan wait for the next step's launch, and a row that a stop string ended meanwhile drops the token it
        was computing; with prepare_ahead, the next step's decode inputs are staged there too."""
        started = time.perf_counter()
        plan, failed = self.scheduler.schedule()
        outputs = [self._final(s, "", error=s.error) for s in failed]
        for s in failed:
            self.seqs.pop(s.request_id, None)
        refused = [p.seq for p in plan if not self._slot_holds_its_adapter(p.seq)]
        for s in refused:
            outputs.append(self._refuse(s))
        plan = [p for p in plan if not any(p.seq is s for s in refused)]
        if not plan:
            return outputs + self._emit_text()
        if self.prefill_delay_s and any(p.num_new > 1 for p in plan):
            time.sleep(self.prefill_delay_s)  # injected fault: hold the step that prefills
        logits = self.runner.run([self._input(p) for p in plan])  # [num_completing, vocab]
        completing = [p for p in plan if p.completes]
        rows = [p.seq for p in completing]
        pending = launch_sample(
            constrain(logits, [s.grammar for s in rows]),
            [s.params for s in rows],
            [s.seed for s in rows],
            [s.output_token_ids for s in rows],
        )  # queued behind the forward pass; the host goes on
        if self.overlap_text:
            outputs += self._emit_text()  # the last step's tokens, while the device computes this one
        if self.prepare_ahead:
            self._stage_next(plan)
        sampled = pending.read()  # the step's one wait for the device
        taken = zip(completing, sampled.token_ids, sampled.logprobs, strict=True)
        # a stop string may have ended a row after its launch: its token is dropped
        done = [(p, token, lp) for p, token, lp in taken if p.seq.status is SequenceStatus.RUNNING]
        for p in plan:
            if p.seq.status is SequenceStatus.RUNNING:
                self.scheduler.computed(p)
        for p, token, logprobs in done:
            self._take(p.seq, token, logprobs)
        if not self.overlap_text or not (self.scheduler.running or self.scheduler.waiting):
            outputs += self._emit_text()  # nothing launches next: hold nothing back
        ended = time.perf_counter()
        for p, _, _ in done:
            s = p.seq
            if s.trace is not None:  # the step that ends its prefill
                s.trace.step_start, s.trace.step_end, s.trace = started, ended, None
        return outputs

    def fail_running(self, message: str) -> list[StepOutput]:
        """End every running request, and any whose last token still waits for its text, with an error."""
        ended = [*self.scheduler.running, *(t.seq for t in self._pending)]
        self._pending = []
        outputs = []
        for seq in ended:
            if self.seqs.get(seq.request_id) is not seq:
                continue
            del self.seqs[seq.request_id]
            if seq.status is SequenceStatus.FINISHED:
                seq.finish_reason = "error"
            else:
                self.scheduler.finish(seq, "error")
            outputs.append(self._final(seq, "", error=message))
        return outputs

    def _stage_next(self, plan: list[Scheduled]) -> None:
        """Give the runner the next step's expected decode rows: every running row, one position on, when
        each completes in this plan. A row this token is sure to end (max_tokens, the context) is left out;
        one that a stop token ends costs the next step a rebuild of the staging."""
        try:
            self.runner.stage_ahead(self._next_rows(plan))
        except Exception:  # staging ahead only saves time: the next step builds its inputs itself
            log.exception("staging the next decode step failed; it is built when it runs")
            self.runner.stage_ahead([])

    def _next_rows(self, plan: list[Scheduled]) -> list[StepInput]:
        """The next step's expected decode rows, or none when a row of it will still prefill."""
        completing = {id(p.seq): p for p in plan if p.completes}
        rows: list[StepInput] = []
        for s in self.scheduler.running:
            p = completing.get(id(s))
            if p is None:  # it still prefills: the next step is not all decode
                return []
            if self._at_length(s, coming=1):  # the token this step samples ends it
                continue
            position = s.num_cached + p.num_new  # of the token this step samples
            rows.append(StepInput([0], position, self.blocks.table(s.request_id), s.slot))
        return rows

    def _input(self, p: Scheduled) -> StepInput:
        s = p.seq
        ids = s.token_ids[s.num_cached : s.num_cached + p.num_new]
        return StepInput(ids, s.num_cached, self.blocks.table(s.request_id), s.slot, p.completes)

    def _slot_holds_its_adapter(self, s: Sequence) -> bool:
        """The security boundary: a row runs only on a slot that holds the adapter it was admitted for."""
        if s.adapter_id is None or self.lora is None:
            return True
        return s.slot is not None and self.lora.adapter_in_slot(s.slot) == s.adapter_id

    def _refuse(self, s: Sequence) -> StepOutput:
        """Fail just this row (never run it on another adapter's weights); the rest of the batch goes on."""
        held = self.lora.adapter_in_slot(s.slot) if (self.lora is not None and s.slot is not None) else None
        error = SlotMismatchError(
            f"request {s.request_id} was admitted for adapter {s.adapter_id}, "
            f"but its slot {s.slot} holds {held}"
        )
        log.error("refused before the forward pass: %s", error)
        self.seqs.pop(s.request_id, None)
        self.scheduler.finish(s, "error")
        return self._final(s, "", error=f"{error.code}: {error}")

    def _take(self, s: Sequence, token: int, logprobs: TokenLogprobs | None = None) -> None:
        """Append a sampled token and end the row now if the token alone ends it (a stop token, a grammar
        complete, max_tokens, the context), so the next schedule never runs it; its text follows in
        _emit_text. The grammar takes the token here: the next step's mask depends on it."""
        s.output_token_ids.append(token)
        grammar_done = s.grammar is not None and s.grammar.advance(token)
        is_stop_token = token in s.params.stop_token_ids or (
            token in self.eos_token_ids and not s.params.ignore_eos
        )
        reason = None
        if is_stop_token or grammar_done:
            reason = "stop"
        elif self._at_length(s):
            reason = "length"
        if reason is not None:
            self.scheduler.finish(s, reason)
        self._pending.append(_Taken(s, token, is_stop_token, logprobs))

    def _at_length(self, s: Sequence, coming: int = 0) -> bool:
        """Whether s has reached max_tokens or the context, with coming more tokens taken."""
        return (
            len(s.output_token_ids) + coming >= s.params.max_tokens
            or s.num_tokens + coming >= self.runner.max_model_len
        )

    def _emit_text(self) -> list[StepOutput]:
        """Detokenize the taken tokens and scan their stop strings: one output each, the last of a row final.
        A stop string ends a row that is still running."""
        taken, self._pending = self._pending, []
        return [self._advance(t) for t in taken if self.seqs.get(t.seq.request_id) is t.seq]

    def _advance(self, t: _Taken) -> StepOutput:
        s, token, logprobs = t.seq, t.token, t.logprobs
        if not t.is_stop_token and s.detokenizer is not None:
            s.text += s.detokenizer.push(token)
        scan = scan_stop_strings(
            s.text, s.params.stop, max(0, s.emitted - max((len(x) for x in s.params.stop), default=0))
        )
        if scan.matched is not None:
            if s.status is SequenceStatus.FINISHED:
                s.finish_reason = "stop"
            else:
                self.scheduler.finish(s, "stop")
        finished = s.status is SequenceStatus.FINISHED
        if finished and scan.matched is None and s.detokenizer is not None:
            s.text += s.detokenizer.flush()  # end of stream: release any held-back bytes
        end = scan.safe_len if not finished or scan.matched is not None else len(s.text)
        delta = s.text[s.emitted : end]
        s.emitted = max(s.emitted, end)
        if not finished:
            return StepOutput(
                s.request_id,
                token,
                delta,
                False,
                None,
                len(s.prompt_token_ids),
                len(s.output_token_ids),
                cached_tokens=s.cached_tokens,
                logprobs=logprobs,
            )
        self.seqs.pop(s.request_id, None)
        return self._final(s, delta, token, logprobs=logprobs)

    def _final(
        self,
        s: Sequence,
        delta: str,
        token: int | None = None,
        error: str | None = None,
        logprobs: TokenLogprobs | None = None,
    ) -> StepOutput:
        return StepOutput(
            s.request_id,
            token,
            delta,
            True,
            s.finish_reason,
            len(s.prompt_token_ids),
            len(s.output_token_ids),
            error,
            s.cached_tokens,
            logprobs,
        )

    def is_idle(self) -> bool:
        return not self.has_work() and all(s.status is SequenceStatus.FINISHED for s in self.seqs.values())
