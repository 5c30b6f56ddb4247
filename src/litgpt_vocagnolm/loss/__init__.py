"""The teacher-guided loss and its baselines: per-token cross-entropy kernels (`cross_entropy`), the token selection
(`selection`), the logit-distillation baselines (`distillation`) and the table of methods with the loss built once per
run (`methods`). Builds on nothing else of the package."""

from litgpt_vocagnolm.loss.selection import teacher_guided_weights

__all__ = ["teacher_guided_weights"]
