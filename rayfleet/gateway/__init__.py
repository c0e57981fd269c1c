"""The HTTP gateway: a JSON API (aiohttp) over one fleet, with bearer-token auth and an OpenAPI 3.1 document.

``serve`` runs it (``rayfleet gateway``); ``build_app`` gives the aiohttp application
for tests and embedding; ``openapi_document`` is what ``GET /openapi.json`` serves.
Trust boundary: the cluster and the storage are trusted, HTTP clients are not. Bodies
are JSON and never unpickled; clients name code only from modules the operator allows.
"""

from __future__ import annotations

from ._app import build_app as build_app
from ._app import openapi_document as openapi_document
from ._auth import TOKEN_ENV as TOKEN_ENV
from ._limits import GatewayLimits as GatewayLimits
from ._server import serve as serve
from ._trust import ALLOWED_MODULES_ENV as ALLOWED_MODULES_ENV
from ._trust import allowed_modules_from_env as allowed_modules_from_env

__all__ = [
    "ALLOWED_MODULES_ENV",
    "GatewayLimits",
    "TOKEN_ENV",
    "allowed_modules_from_env",
    "build_app",
    "openapi_document",
    "serve",
]
