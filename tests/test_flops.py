"""The FLOPs MFU divides by, against LitGPT's `measure_flops` (PyTorch's FLOP counter) on the meta device."""

import pytest
import torch
from lightning.fabric.utilities.throughput import measure_flops
from litgpt.config import Config
from litgpt.model import GPT

from litgpt_vocagnolm.planning.flops import forward_flops, training_flops


@pytest.mark.parametrize(
    ("name", "batch", "seq"), [("tiny-llama-1.1b", 4, 2048), ("Qwen2.5-Math-7B", 2, 1920), ("Qwen2.5-7B", 1, 128)]
)
def test_flops_match_the_counter_for_the_papers_models(name, batch, seq):
    config = Config.from_name(name)
    with torch.device("meta"):
        model = GPT(config)
        model.max_seq_length = seq
        x = torch.randint(0, 1, (batch, seq))
    forward = measure_flops(model, lambda: model(x))
    training = measure_flops(model, lambda: model(x), lambda logits: logits.sum())
    assert forward_flops(config, batch, seq) == pytest.approx(forward, rel=0.02)
    assert training_flops(config, batch, seq) == pytest.approx(training, rel=0.02)
    # The head alone, once: a 7B teacher's head is a tenth of its forward, too much to drop silently.
    head = 2 * batch * seq * config.n_embd * config.padded_vocab_size
    assert forward_flops(config, batch, seq, head=False) == pytest.approx(forward - head, rel=0.02)
