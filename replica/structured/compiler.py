"""JSON schemas compiled to grammars for one tokenizer, checked against SchemaLimits and cached by schema."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

import llguidance

from replica.errors import InvalidRequestError
from replica.model.tokenizer import Tokenizer
from replica.structured.lru import LruCache
from replica.structured.matcher import GrammarMatcher
from schemas.response_format import SchemaLimits, canonical_json, schema_problem

if TYPE_CHECKING:  # declared only in the stub
    from llguidance._lib import JsonCompileOptions

PARAM = "response_format"
# compact JSON: no free whitespace, so an answer cannot pad itself with spaces until max_tokens
_JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


class GrammarCompiler:
    """Compiles a schema once per (schema, tokenizer) into a matcher that each sequence gets a copy of."""

    def __init__(self, tokenizer: Tokenizer, limits: SchemaLimits, cache_size: int = 128) -> None:
        self.limits = limits
        spec = tokenizer.backend.to_str()
        self.tokenizer_id = hashlib.sha256(spec.encode()).hexdigest()[:16]
        self._tokenizer = llguidance.LLTokenizer(spec, eos_token=sorted(tokenizer.stop_token_ids))
        self.cache: LruCache[llguidance.LLMatcher] = LruCache(cache_size)

    def check(self, schema: dict[str, Any]) -> None:
        """Raise InvalidRequestError (param response_format) for a schema over a limit."""
        problem = schema_problem(schema, self.limits)
        if problem is not None:
            raise InvalidRequestError(problem, param=PARAM)

    def matcher(self, schema: dict[str, Any]) -> GrammarMatcher:
        """A fresh matcher for schema; raises InvalidRequestError for one over a limit or not compilable."""
        self.check(schema)
        key = f"{self.tokenizer_id}:{canonical_json(schema)}"
        compiled = self.cache.get(key)
        if compiled is None:  # compiled outside the cache's lock: a slow schema holds up no other
            compiled = self._compile(schema)
            self.cache.put(key, compiled)
        return GrammarMatcher(compiled.deep_copy())

    def _compile(self, schema: dict[str, Any]) -> llguidance.LLMatcher:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults=_JSON_OPTIONS
            )
        except ValueError as exc:
            raise InvalidRequestError(f"the schema is not valid: {exc}", param=PARAM) from None
        compiled = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if compiled.is_error():
            raise InvalidRequestError(f"the schema is not supported: {compiled.get_error()}", param=PARAM)
        return compiled
