"""Errors of the client-side flows that drive the internal API."""

from __future__ import annotations


class PeftDirError(ValueError):
    """A local folder is not a safetensors PEFT LoRA folder that can be registered."""


class RegistrationError(Exception):
    """A version could not be registered or did not become ready; reason_code is the registry's, if any."""

    def __init__(self, adapter_id: str, message: str, reason_code: str | None = None) -> None:
        super().__init__(message)
        self.adapter_id = adapter_id
        self.reason_code = reason_code
