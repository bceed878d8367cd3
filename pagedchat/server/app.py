"""The FastAPI app: the OpenAI routes, models, health, tokenize, detokenize, metrics."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.server import routes
from pagedchat.server.errors import APIError, install_handlers
from pagedchat.server.limits import RequestLimits
from pagedchat.server.protocol import DetokenizeRequest, TokenizeRequest
from pagedchat.server.state import ServerSettings, ServerState


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def admit(request: Request) -> None:
    """Every guarded route: the API key, the model named, and no new work while draining."""
    state = _state(request)
    key = state.settings.api_key
    if key is not None and request.headers.get("authorization") != f"Bearer {key}":
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                       code="invalid_api_key")
    if state.draining:
        raise APIError(503, "the server is shutting down")
    if not state.engine_loop.alive:
        raise APIError(503, f"the engine is not running: {state.engine_loop.failed}")


guarded = APIRouter(dependencies=[Depends(admit)])
open_routes = APIRouter()


def _card(state: ServerState, name: str) -> dict:
    return {"id": name, "object": "model", "created": state.created, "owned_by": "pagedchat",
            "max_model_len": state.config.max_model_len}


@guarded.get("/v1/models")
async def models(request: Request) -> dict:
    state = _state(request)
    return {"object": "list", "data": [_card(state, name) for name in state.settings.model_names]}


@guarded.get("/v1/models/{name:path}")
async def model(name: str, request: Request) -> dict:
    state = _state(request)
    state.check_model(name)  # 404 for a name /v1/models does not list
    return _card(state, name)


@guarded.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    state = _state(request)
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give either prompt or messages", "prompt")
    if body.messages is not None:
        ids = await state.chat_prompt(body.messages)
    else:
        ids = await state.encode(body.prompt, body.add_special_tokens)
    return {"tokens": ids, "count": len(ids), "max_model_len": state.config.max_model_len}


@guarded.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    state = _state(request)
    state.check_model(body.model)
    if any(not 0 <= t < state.vocab_size for t in body.tokens):
        raise APIError(400, f"tokens: every id must be in [0, {state.vocab_size})", "tokens")
    return {"prompt": state.tokenizer.decode(body.tokens)}


@open_routes.head("/health", include_in_schema=False)  # load balancers' probes
@open_routes.get("/health")
async def health(request: Request) -> Response:
    """200 once the engine has warmed up and while it runs; 503 with the reason otherwise."""
    state = _state(request)
    reason = "the server is shutting down" if state.draining else (
        state.engine_loop.not_ready_reason)
    if reason is not None:
        loop = state.engine_loop
        starting = not state.draining and loop.alive and not loop.ready.is_set()
        status = "starting" if starting else "unavailable"
        return JSONResponse({"status": status, "reason": reason}, status_code=503)
    return JSONResponse({"status": "ok"})


@open_routes.get("/metrics")
async def metrics(request: Request) -> Response:
    state = _state(request)
    stats = await state.engine_loop.stats()
    return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)


def create_app(engine: LLMEngine, settings: ServerSettings) -> FastAPI:
    """An app serving ``engine``; its engine thread starts and stops with the app."""
    state = ServerState(engine, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine_loop.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(state.engine_loop.stop)

    app = FastAPI(title="pagedchat", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    app.add_middleware(RequestLimits, max_bytes=settings.max_request_bytes,
                       read_timeout=settings.read_timeout,
                       max_concurrent=settings.max_concurrent_requests)
    install_handlers(app)
    app.include_router(guarded)
    app.include_router(routes.router, dependencies=[Depends(admit)])
    app.include_router(open_routes)
    return app
