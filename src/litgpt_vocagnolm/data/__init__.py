"""Data: input files (`documents`), both tokenizations packed into blocks (`packing`), `vocagnolm prepare` (`prepare`,
`dry_run`, `workers`), the teacher loss cache (`teacher_cache`), the manifest (`manifest`), the prepared data read back
(`prepared`: the `VocAgnoData` DataModule a recipe's YAML names as `litgpt_vocagnolm.data.VocAgnoData`) and the order
training reads it in (`order`). Builds on `alignment` and `models` (a teacher checkpoint's fingerprint).

`VocAgnoData` and `iter_blocks` are handed on when first asked for: reading prepared data loads LitGPT, LitData and
torch (about 4 s of CPU), which `vocagnolm prepare`, whose modules import this file first, needs only to write a split.
"""

from importlib import import_module

__all__ = ["VocAgnoData", "iter_blocks"]


def __getattr__(name: str) -> object:
    """`VocAgnoData` and `iter_blocks`, from `prepared`, on first use."""
    if name in __all__:
        return getattr(import_module("litgpt_vocagnolm.data.prepared"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
