"""The tokenizer process runs without torch.

transformers imports torch whenever it is installed: `AutoTokenizer` reads the model's config, and
transformers' configuration modules import torch and `torch._dynamo`. In the tokenizer that costs
most of its start (every start, a restart after a crash included) and a few hundred MiB of memory,
for nothing: encoding and decoding are the `tokenizers` library, chat templates are jinja. With
torch marked absent before transformers is imported, transformers takes the path it has for an
install without torch (`is_torch_available()` is False) and loads tokenizers just the same.
"""

from __future__ import annotations

import logging
import sys

# What transformers says once when it finds no torch: true here, and on purpose.
_NO_TORCH_ADVICE = "PyTorch was not found"


def keep_torch_out() -> None:
    """Make `import torch` fail in this process (and transformers see no torch); nothing when torch is
    imported already (the tokenizer used in-process, as in tests)."""
    if "torch" in sys.modules:
        return
    # None in sys.modules: an import raises ImportError and importlib's find_spec answers None.
    sys.modules["torch"] = None  # type: ignore[assignment]
    logging.getLogger("transformers").addFilter(lambda record: _NO_TORCH_ADVICE not in record.getMessage())
