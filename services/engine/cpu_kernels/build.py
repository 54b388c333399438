"""`python -m services.engine.cpu_kernels.build`: build the CPU kernels now (make install does);
exit 1 if they cannot be built."""

from __future__ import annotations

import logging

from services.engine.cpu_kernels import load

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(0 if load() is not None else 1)
