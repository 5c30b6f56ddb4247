"""Token-level lexical alignment: the tokenizers (`tokenizer_files`), `align` and its metrics (`lexical`), and the
report of a tokenizer pair (`inspection`: `vocagnolm inspect`). Builds on nothing else of the package."""

from litgpt_vocagnolm.alignment.lexical import align

__all__ = ["align"]
