"""`POST /v1/audio/transcriptions` and `/v1/audio/translations`: OpenAI's speech-to-text routes.

Turnout serves text-generation models only, so both answer 400 saying so (as
vLLM answers for a model without audio support), rather than 404 (which
reads as a wrong URL) or a 5xx (which reads as a fault worth retrying). The
multipart body is not parsed: no field of it could change the answer.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.errors import HTTPError

router = APIRouter()


def _no_audio(api: str) -> HTTPError:
    return HTTPError(
        400,
        f"The model does not support the {api} API: Turnout serves text-generation models, none takes audio input",
        param="model",
    )


@router.post("/v1/audio/transcriptions")
async def transcriptions() -> None:
    raise _no_audio("Transcriptions")


@router.post("/v1/audio/translations")
async def translations() -> None:
    raise _no_audio("Translations")
