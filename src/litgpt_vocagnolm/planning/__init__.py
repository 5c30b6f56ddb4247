"""A run's cost before it is submitted: `vocagnolm plan` (`plan`), the per-GPU memory and traffic it estimates
(`memory`), its `--measure` (`measure`: the recipe's own steps timed here) and a step's FLOPs (`flops`). Builds on
`training`, whose loop it times."""
