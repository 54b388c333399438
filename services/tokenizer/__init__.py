"""The tokenizer service: encode, chat templates, streaming detokenization, stop strings."""
