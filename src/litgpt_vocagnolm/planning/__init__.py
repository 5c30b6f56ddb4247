"""A run's cost before it is submitted: `vocagnolm plan` (`plan`: per-GPU memory), its `--measure` (`measure`: the
recipe's own steps timed here) and a step's FLOPs (`flops`). Builds on `training`, whose loop it times."""
