"""The models: LitGPT checkpoint directories and their weights (`weights`), LitGPT's GPT returning each target's loss
(`gpt`), the configs LitGPT lacks (`model_configs`). Builds on `alignment` (the tokenizer files) and `loss` (the
cross-entropy kernel)."""
