"""vLLM's LoRA adapter routes: `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`.

Both change what the deployment serves, so both need the admin key (admin_auth.py). The router
applies them to every engine; an engine's refusal (name taken, rank over --max-lora-rank, target
modules not supported, LoRA not enabled, adapter not loaded) comes back as a 400 naming it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from gateway.admin_auth import admin_credential
from gateway.errors import invalid_request
from gateway.router_client import router_of

router = APIRouter()


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class LoadLoraAdapterRequest(_Body):
    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(_Body):
    lora_name: str
    # vLLM's body has it too; unloading goes by name.
    lora_int_id: int | None = None


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> PlainTextResponse:
    key = admin_credential(request)
    if not body.lora_name or not body.lora_path:
        raise invalid_request("both 'lora_name' and 'lora_path' must be given", "lora_name")
    await router_of(request).load_lora_adapter(key, body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> PlainTextResponse:
    key = admin_credential(request)
    await router_of(request).unload_lora_adapter(key, body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
