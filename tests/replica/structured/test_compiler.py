"""Schemas compiled for SmolLM2's tokenizer: the limits, the cache, and a matcher that walks real JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replica.errors import InvalidRequestError
from replica.model.tokenizer import Tokenizer
from replica.structured.compiler import GrammarCompiler
from schemas.response_format import SchemaLimits

POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "label": {"type": "string"}},
    "required": ["x", "label"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, SchemaLimits(max_bytes=512, max_depth=4), cache_size=2)


def _allowed(bitmask: bytes, token: int) -> bool:
    return bool(bitmask[token // 8] >> (token % 8) & 1)


def test_the_same_schema_in_another_key_order_hits_the_cache(compiler: GrammarCompiler) -> None:
    compiler.matcher(POINT)
    compiler.matcher(dict(reversed(list(POINT.items()))))
    assert (compiler.cache.misses, compiler.cache.hits) == (1, 1)


def test_the_cache_keeps_only_the_most_recent_schemas(compiler: GrammarCompiler) -> None:
    schemas = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}} for i in range(3)]
    for schema in schemas:
        compiler.matcher(schema)
    compiler.matcher(schemas[0])
    assert len(compiler.cache) == 2 and compiler.cache.misses == 4


def test_each_matcher_has_its_own_state(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    first, second = compiler.matcher(POINT), compiler.matcher(POINT)
    ids = tokenizer.encode('{"x":')
    for token in ids:
        first.advance(token)
    assert _allowed(second.allowed_bitmask(), ids[0]) and not _allowed(first.allowed_bitmask(), ids[0])


def test_a_matcher_allows_the_schemas_json_and_ends_after_it(
    compiler: GrammarCompiler, tokenizer: Tokenizer
) -> None:
    matcher = compiler.matcher(POINT)
    text = json.dumps({"x": 3, "label": "a b"}, separators=(",", ":"))
    ids = tokenizer.encode(text)
    for token in ids[:-1]:
        assert _allowed(matcher.allowed_bitmask(), token)
        assert not matcher.advance(token)
    eos = min(tokenizer.stop_token_ids)
    assert not _allowed(matcher.allowed_bitmask(), eos)  # not before the JSON is complete
    assert matcher.advance(ids[-1])
    assert _allowed(matcher.allowed_bitmask(), eos)


def test_json_not_of_the_schema_is_not_allowed(compiler: GrammarCompiler, tokenizer: Tokenizer) -> None:
    matcher = compiler.matcher(POINT)
    for token in tokenizer.encode('{"x":'):
        matcher.advance(token)
    assert not _allowed(matcher.allowed_bitmask(), tokenizer.encode('"')[0])


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "description": "x" * 600},  # over max_bytes
        {"type": "array", "items": {"type": "array", "items": {"type": "array", "items": {"enum": [1]}}}},
        {"type": "no-such-type"},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
    ],
)
def test_a_schema_over_a_limit_or_invalid_names_response_format(
    compiler: GrammarCompiler, schema: dict
) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        compiler.matcher(schema)
    assert caught.value.param == "response_format"
