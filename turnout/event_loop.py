"""The event loop every Turnout service runs on: uvloop's where it is installed, else asyncio's.

uvloop (libuv, in C) costs less CPU per socket read, write and callback than asyncio's selector
loop; measured on the service path in docs/benchmarks.md ("Service path (issue 15)"). grpc.aio
runs on any asyncio loop, and uvicorn picks uvloop by itself when it is importable (`loop="auto"`),
so the services only need the policy set before their loop is created: `turnout.cli` does it for
every command. Without uvloop (a platform with no wheel) everything runs on asyncio's loop as before.
"""

from __future__ import annotations

import asyncio


def install_event_loop_policy() -> str:
    """Make the loops this process creates from now on (asyncio.run) uvloop's, if it is installed;
    the name of the loop in use."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"
