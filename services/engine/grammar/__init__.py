"""Structured outputs with xgrammar: constraints (constraint.py) compiled off the step loop with
a cache (compiler.py), one matcher per sequence (state.py), and the bitmask applied as a
sampler hook (bitmask.py)."""
