"""Training: the frozen teachers (`teacher`), the recipe's checks before any model (`checks`), FSDP2 (`distributed`),
Slurm's signals (`slurm`), sharded checkpoints (`checkpoints`), one micro-batch (`micro_batch`), one optimizer step
(`step`), the recipe (`recipe`), the recipes that come with the package (`recipes`) and the teacher's losses scored
once (`score_teacher`). Builds on `alignment`, `loss`, `models` and `data`."""
