"""Our tokenizer agrees with transformers, renders the model's chat template and streams clean UTF-8."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from replica.model.stop_strings import scan_stop_strings
from replica.model.tokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, Tokenizer, compile_chat_template

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Bonjour, ça va ? 你好 🎉"},
        {"role": "assistant", "content": "Oui !"},
        {"role": "user", "content": "Et toi ?\n\n  spaces  "},
    ],
]
TEXTS = [
    "Hello, world!",
    "Year 2024: 3.14159 and 1,000,000",
    "naïve café — 東京タワー 你好世界 🎉🇯🇵👩‍👩‍👧 done",
    "  leading and trailing spaces \n\ttabs\n",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_dir: Path):  # noqa: ANN201 (transformers type)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_equals_transformers(
    smol_tokenizer: Tokenizer, hf_tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool
) -> None:
    text = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert smol_tokenizer.render_chat(messages, add_generation_prompt) == text
    expected_ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert smol_tokenizer.apply_chat_template(messages, add_generation_prompt) == expected_ids


@pytest.mark.parametrize("text", TEXTS)
def test_encode_equals_transformers_and_decode_roundtrips(
    smol_tokenizer: Tokenizer, hf_tokenizer, text: str
) -> None:
    ids = smol_tokenizer.encode(text)
    assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert smol_tokenizer.decode(ids) == text


def test_digits_are_split_one_per_token(smol_tokenizer: Tokenizer) -> None:
    assert [smol_tokenizer.decode([i]) for i in smol_tokenizer.encode("2024")] == ["2", "0", "2", "4"]


def test_stop_tokens_include_im_end(smol_tokenizer: Tokenizer) -> None:
    assert smol_tokenizer.stop_token_ids == {smol_tokenizer.backend.token_to_id("<|im_end|>")}


@pytest.mark.parametrize("text", TEXTS[:4])
def test_incremental_detokenization_equals_full_decode_without_broken_chars(
    smol_tokenizer: Tokenizer, text: str
) -> None:
    ids = smol_tokenizer.encode(text)
    detok = IncrementalDetokenizer(smol_tokenizer)
    deltas = [detok.push(i) for i in ids]
    tail = detok.flush()
    assert "".join(deltas) + tail == smol_tokenizer.decode(ids) == text
    assert not any(REPLACEMENT_CHAR in d for d in deltas)
    assert tail == ""


def test_split_emoji_is_held_back_until_complete(smol_tokenizer: Tokenizer) -> None:
    ids = smol_tokenizer.encode("🎉")
    assert len(ids) > 1  # byte-level BPE spreads the 4 UTF-8 bytes over tokens
    detok = IncrementalDetokenizer(smol_tokenizer)
    assert [detok.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1]) == "🎉"


def test_flush_returns_an_unfinished_character_as_replacement(smol_tokenizer: Tokenizer) -> None:
    ids = smol_tokenizer.encode("ok 🎉")
    detok = IncrementalDetokenizer(smol_tokenizer)
    streamed = "".join(detok.push(i) for i in ids[:-1])
    assert streamed == "ok" or streamed == "ok "
    assert REPLACEMENT_CHAR in detok.flush()


def test_a_tokens_bytes_are_its_own_even_inside_a_multi_byte_character(smol_tokenizer: Tokenizer) -> None:
    ids = smol_tokenizer.encode("ok 🎉<|im_end|>")
    pieces = [smol_tokenizer.token_bytes(i) for i in ids]
    assert b"".join(pieces) == "ok 🎉<|im_end|>".encode()
    assert any(REPLACEMENT_CHAR in p.decode(errors="replace") for p in pieces)  # the emoji is split


def test_special_tokens_are_skipped_when_streaming(smol_tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(smol_tokenizer)
    ids = smol_tokenizer.encode("hi<|im_end|>")
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "hi"


def test_template_raise_exception_surfaces_as_template_error() -> None:
    template = compile_chat_template("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(jinja2.exceptions.TemplateError, match="alternate"):
        template.render(messages=[])


def test_template_sandbox_blocks_attribute_escape() -> None:
    template = compile_chat_template("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        template.render(messages=[])


class TestStopStrings:
    def test_no_stops_emits_everything(self) -> None:
        assert scan_stop_strings("hello", []).safe_len == 5

    def test_full_match_truncates_before_the_stop(self) -> None:
        scan = scan_stop_strings("answer: 42\nEND more", ["END"])
        assert scan.matched == "END" and scan.safe_len == len("answer: 42\n")

    def test_partial_match_at_the_end_is_held_back(self) -> None:
        scan = scan_stop_strings("answer: 42\nEN", ["END"])
        assert scan.matched is None and scan.safe_len == len("answer: 42\n")

    def test_earliest_of_several_stops_wins(self) -> None:
        scan = scan_stop_strings("a STOP b HALT", ["HALT", "STOP"])
        assert scan.matched == "STOP" and scan.safe_len == 2

    def test_stop_spanning_two_tokens_is_found(self, smol_tokenizer: Tokenizer) -> None:
        stop = "Observation:"
        ids = smol_tokenizer.encode("Thought: x\nObservation: y")
        text, emitted, result = "", 0, None
        detok = IncrementalDetokenizer(smol_tokenizer)
        pieces = []
        for i in ids:
            text += detok.push(i)
            scan = scan_stop_strings(text, [stop], start=max(0, emitted - len(stop) + 1))
            pieces.append(text[emitted : scan.safe_len])
            emitted = scan.safe_len
            if scan.matched:
                result = scan
                break
        assert len(smol_tokenizer.encode(stop)) >= 2
        assert result is not None and result.matched == stop
        assert "".join(pieces) == "Thought: x\n"
        assert not any(stop[:2] in p for p in pieces)

    def test_text_that_diverges_from_a_stop_is_released(self) -> None:
        assert scan_stop_strings("x EN", ["END"]).safe_len == 2
        assert scan_stop_strings("x ENX", ["END"]).safe_len == 5
