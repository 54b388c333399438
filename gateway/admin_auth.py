"""The admin key on HTTP: routes that change the deployment (`/flush_cache`) need
`Authorization: Bearer <admin key>` (Aphrodite's `--admin-key`), whatever the API keys are.

The gateway passes the caller's key on to the router, which passes it on to the engines: each
hop checks it itself, so neither the gateway's nor the router's internal token can flush a cache.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from gateway.errors import HTTPError


def admin_credential(request: Request) -> str:
    """The caller's admin key; HTTPError 401 when it is missing or wrong, 403 when none is configured."""
    admin_key = request.app.state.config.security.admin_key
    if admin_key is None:
        raise HTTPError(403, "admin routes are off: start the server with --admin-key", type_="permission_error")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), admin_key.encode()):
        raise HTTPError(
            401,
            "this route needs the admin key: send 'Authorization: Bearer <admin key>'",
            type_="authentication_error",
        )
    return str(admin_key)
