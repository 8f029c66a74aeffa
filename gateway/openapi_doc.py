"""The gateway apps' OpenAPI documents, with what FastAPI cannot see: every route's errors are OpenAI's error
body (schemas.api.ErrorBody, rendered by gateway.errors), never FastAPI's HTTPValidationError; and the chat
and legacy completions routes read their raw bodies themselves (to hold the byte cap and answer 400, not
422), so their request bodies, ChatCompletionRequest and CompletionRequest, are declared here."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from schemas.api import ErrorBody
from schemas.openai import ChatCompletionRequest
from schemas.openai_completions import CompletionRequest

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# The routes whose bodies FastAPI does not see, and the model each one reads.
BODIES: dict[str, type[BaseModel]] = {CHAT_PATH: ChatCompletionRequest, COMPLETIONS_PATH: CompletionRequest}
REF = "#/components/schemas/{model}"


def _components(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema and its $defs, as OpenAPI components named after the models."""
    schema = model.model_json_schema(ref_template=REF)
    defs = schema.pop("$defs", {})
    return {**defs, model.__name__: schema}


def gateway_openapi(app: FastAPI) -> dict[str, Any]:
    """The document (built once): FastAPI's, with the error responses and the completion bodies declared."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    components.update(_components(ErrorBody))
    for path, model in BODIES.items():
        if path in doc.get("paths", {}):
            components.update(_components(model))
    error = {
        "description": "OpenAI's error body",
        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}},
    }
    for path, item in doc.get("paths", {}).items():
        for operation in item.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)  # FastAPI's HTTPValidationError: the gateway answers ErrorBody
            responses["default"] = error
            if path in BODIES:
                schema = {"$ref": REF.format(model=BODIES[path].__name__)}
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": schema}},
                }
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = doc
    return doc


def install_openapi(app: FastAPI) -> None:
    """Serve gateway_openapi(app) at the app's /openapi.json."""
    app.openapi = lambda: gateway_openapi(app)  # type: ignore[method-assign]
