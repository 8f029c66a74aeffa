"""Tokenizer over the `tokenizers` library, with the model's own jinja2 chat template and stop tokens."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from replica.errors import UnsupportedModelError

REPLACEMENT_CHAR = "\ufffd"


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's bytes_to_unicode), character -> the byte it stands for: printable
    bytes stand for themselves, the others for the characters from U+0100 up, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


_BYTE_OF = _byte_level_table()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; templates expect plain JSON (as transformers renders it)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in a sandbox with the globals Hugging Face templates rely on."""
    return _environment().from_string(source)


def renders_tools(source: str | None) -> bool:
    """True when a chat template reads a `tools` variable, so it shows tools itself (as Hugging Face does)."""
    return source is not None and "tools" in meta.find_undeclared_variables(_environment().parse(source))


def _token_text(value: Any) -> str | None:
    """Special tokens appear as plain strings or as AddedToken dicts in tokenizer_config.json."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _read_chat_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default")
    if template is None and (model_dir / "chat_template.jinja").is_file():
        template = (model_dir / "chat_template.jinja").read_text()
    return template


class Tokenizer:
    """Encode, decode and render chats for one checkpoint directory."""

    def __init__(
        self,
        backend: HFTokenizer,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        stop_token_ids: set[int],
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.stop_token_ids = stop_token_ids
        self._template = compile_chat_template(chat_template) if chat_template else None
        self.renders_tools = renders_tools(chat_template)
        # The most UTF-8 bytes one token stands for (decoded alone, plus one for a leading space a decoder may
        # drop): a text of more than n times this many bytes has more than n tokens.
        n = backend.get_vocab_size(with_added_tokens=True)
        decoded = (len(backend.decode([i], skip_special_tokens=False).encode()) for i in range(n))
        self.max_token_bytes = max(decoded, default=0) + 1

    @classmethod
    def from_dir(cls, model_dir: Path) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json and generation_config.json from a model directory."""
        model_dir = Path(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            raise UnsupportedModelError(f"{model_dir / 'tokenizer.json'} not found")
        backend = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = _read_json(model_dir / "tokenizer_config.json")
        generation = _read_json(model_dir / "generation_config.json")
        bos = _token_text(config.get("bos_token"))
        eos = _token_text(config.get("eos_token"))
        stops: set[int] = set()
        eos_id = backend.token_to_id(eos) if eos is not None else None
        if eos_id is not None:
            stops.add(eos_id)
        gen_eos = generation.get("eos_token_id")
        stops.update(gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos])
        return cls(backend, _read_chat_template(model_dir, config), bos, eos, stops)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; special-token strings in the text (e.g. <|im_start|>) map to their ids."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ids."""
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a byte-level BPE token's own (part of a multi-byte character
        included); otherwise the UTF-8 of the token decoded alone."""
        piece = self.backend.id_to_token(token_id)
        if (
            isinstance(self.backend.decoder, decoders.ByteLevel)
            and piece is not None
            and all(c in _BYTE_OF for c in piece)
        ):
            return bytes(_BYTE_OF[c] for c in piece)
        return self.decode([token_id]).encode()

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render messages with the model's own chat template (tools: for a template that renders_tools)."""
        if self._template is None:
            raise UnsupportedModelError("this model has no chat template; send token ids instead")
        extra = {"tools": tools} if tools is not None else {}
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **extra,
        )

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat (the template writes special tokens itself)."""
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)


class IncrementalDetokenizer:
    """Turn a token stream into text deltas; a multi-byte character split over tokens is held back whole."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        # ids[prefix_offset:read_offset] decode to text already emitted; decoding a short window
        # keeps each step O(window) and gives the decoder the left context it needs for spaces.
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly empty)."""
        self.ids.append(token_id)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # incomplete UTF-8 at the end: wait for the next token
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return whatever is still held back (at end of stream), replacement characters included."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]
