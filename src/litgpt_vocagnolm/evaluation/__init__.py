"""`vocagnolm evaluate`: the math benchmarks (`math_tasks`, `eval_data/`), greedy generation with continuous batching
(`generation`), answers graded as the harness grades them (`grading`), bits per byte, and the results files
(`results`). Builds on `models`, `data` (reading text files) and `loss` (bits per byte)."""
