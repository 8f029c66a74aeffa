"""What every error the gateway answers must look like: OpenAI's {"error": {message, type, param, code}}."""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis


def _content_type(resp: httpx.Response | schemathesis.Response) -> str:
    for name, value in resp.headers.items():
        if name.lower() == "content-type":
            return value[0] if isinstance(value, list) else value
    return ""


def openai_error(resp: httpx.Response | schemathesis.Response) -> dict[str, Any]:
    """The error object of a 4xx/5xx answer, asserting OpenAI's shape exactly (all four keys, typed)."""
    assert _content_type(resp).startswith("application/json"), (resp.status_code, resp.text)
    body = resp.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    return err
