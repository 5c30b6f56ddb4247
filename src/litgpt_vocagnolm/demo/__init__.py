"""`vocagnolm demo`, the whole method in miniature on a CPU: the command and its stages (`pipeline`), its settings
(`settings`), the corpus and its noise (`corpus`), the tokenizers (`tokenizer_training`), the package's commands run
in-process (`runs`), the noise in the trained tokens (`noise`), the table and claims (`table`) and the plot (`plot`).
Builds on `alignment`, `loss`, `models`, `data` and `training`."""
