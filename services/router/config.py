"""Router settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass


def check_address(address: str, flag: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} {address!r}: expected HOST:PORT")


@dataclass(frozen=True)
class RouterConfig:
    engines: tuple[str, ...]
    tokenizers: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 50050
    # How often to retry an engine whose model info is not known yet.
    discovery_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.engines:
            raise ValueError("at least one --engine address is needed")
        if not self.tokenizers:
            raise ValueError("at least one --tokenizer address is needed")
        for address in self.engines:
            check_address(address, "--engine")
        for address in self.tokenizers:
            check_address(address, "--tokenizer")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
