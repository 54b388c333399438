"""Multi-LoRA serving: many fine-tunes of one base model in one batch (see docs/lora.md)."""
