"""Data: input files (`documents`), both tokenizations packed into blocks (`packing`), `vocagnolm prepare` (`prepare`,
`dry_run`, `workers`), the teacher loss cache (`teacher_cache`), the prepared data read back (`prepared`: the
`VocAgnoData` DataModule a recipe's YAML names as `litgpt_vocagnolm.data.VocAgnoData`) and the order training reads it
in (`order`). Builds on `alignment` and `models` (a teacher checkpoint's fingerprint)."""

from litgpt_vocagnolm.data.prepared import VocAgnoData, iter_blocks

__all__ = ["VocAgnoData", "iter_blocks"]
