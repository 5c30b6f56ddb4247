"""A recipe's final checkpoint leaves LitGPT: `litgpt convert_from_litgpt`, then Hugging Face transformers.

transformers runs in a subprocess, from .venv/transformers (tests/transformers.txt says why it is kept out of the
project's environment).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import BIN, TINYLLAMA, typed_here
from litgpt import GPT, Config, Tokenizer
from test_recipe import two_process_run  # noqa: F401 (a fixture)

TRANSFORMERS = Path(sys.prefix) / "transformers"  # `make install` puts tests/transformers.txt there
# Loads the converted weights into LlamaForCausalLM and writes its logits: argv = config JSON, weights, ids, output.
RUN_TRANSFORMERS = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
config, weights, ids, output = sys.argv[1:]
model = LlamaForCausalLM(LlamaConfig(**json.loads(config))).eval()
model.load_state_dict(torch.load(weights, weights_only=True), strict=True)  # every key, every shape, nothing left over
with torch.no_grad():
    torch.save(model(input_ids=torch.load(ids)).logits, output)
"""


def llama_config_for_transformers(config: Config) -> dict:
    """The arguments of `transformers.LlamaConfig` for a Llama-shaped LitGPT config, from its fields."""
    llama_shaped = (
        config.mlp_class_name == "LLaMAMLP"
        and config.norm_class_name == "RMSNorm"
        and config.rotary_percentage == 1.0
        and not config.parallel_residual
        and config.rope_condense_ratio == 1
        and config.rope_adjustments is None
    )
    assert llama_shaped, f"{config.name} is not Llama-shaped"
    return dict(
        vocab_size=config.padded_vocab_size,  # LitGPT's embedding and head have the padded size
        hidden_size=config.n_embd,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_query_groups,
        head_dim=config.head_size,
        max_position_embeddings=config.block_size,
        rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_base},
        attention_bias=config.bias,
        mlp_bias=config.bias,
        tie_word_embeddings=False,
    )


def llama_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of transformers' `LlamaForCausalLM` for this config, by name, with its shape."""
    E, V, I, hs = config.n_embd, config.padded_vocab_size, config.intermediate_size, config.head_size
    shapes = {"model.embed_tokens.weight": (V, E), "model.norm.weight": (E,), "lm_head.weight": (V, E)}
    for i in range(config.n_layer):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (E,),
            layer + "post_attention_layernorm.weight": (E,),
            layer + "self_attn.q_proj.weight": (config.n_head * hs, E),
            layer + "self_attn.k_proj.weight": (config.n_query_groups * hs, E),
            layer + "self_attn.v_proj.weight": (config.n_query_groups * hs, E),
            layer + "self_attn.o_proj.weight": (E, config.n_head * hs),
            layer + "mlp.gate_proj.weight": (I, E),
            layer + "mlp.up_proj.weight": (I, E),
            layer + "mlp.down_proj.weight": (E, I),
        }
    return shapes


@pytest.mark.slow
def test_final_checkpoint_converts_and_transformers_gives_litgpts_logits(tmp_path, two_process_run):  # noqa: F811 (the fixture)
    # A student with grouped-query attention (4 query heads, 2 key-value groups), so the conversion splits qkv,
    # saved as the paper's runs save it: sharded by FSDP2 over 2 processes, blocks wrapped for activation checkpointing
    # (test_recipe.py's `two_process_run`, which its own test compares with one process).
    final, converted = two_process_run / "run" / "out" / "final", tmp_path / "hf"

    out = typed_here(BIN / "litgpt", "convert_from_litgpt", final, converted)  # LitGPT's command, in this process
    assert out.returncode == 0, out.stderr[-3000:]

    lit_config = Config.from_file(final / "model_config.yaml")
    assert (lit_config.n_head, lit_config.n_query_groups, lit_config.n_layer) == (4, 2, 2)
    weights = torch.load(converted / "model.pth", weights_only=True)
    assert {name: tuple(tensor.shape) for name, tensor in weights.items()} == llama_shapes(lit_config)
    assert {tensor.dtype for tensor in weights.values()} == {torch.float32}

    lit_model = GPT(lit_config).eval()
    lit_model.load_state_dict(torch.load(final / "lit_model.pth", weights_only=True)["model"])

    tokenizer = Tokenizer(TINYLLAMA)
    texts = [
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
        "Solve $x^2 - 5x + 6 = 0$: the roots are 2 and 3.",
    ]
    ids = [tokenizer.encode(text, bos=True) for text in texts]
    length = min(len(row) for row in ids)
    ids = torch.stack([row[:length] for row in ids])  # (2, T)
    with torch.no_grad():
        expected = lit_model(ids)  # (2, T, padded vocab)
    torch.save(ids, tmp_path / "ids.pt")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TRANSFORMERS), os.environ.get("PYTHONPATH", "")])}
    hf = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_TRANSFORMERS,
            json.dumps(llama_config_for_transformers(lit_config)),
            str(converted / "model.pth"),
            str(tmp_path / "ids.pt"),
            str(tmp_path / "logits.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert hf.returncode == 0, (
        f"transformers (from {TRANSFORMERS}, made by `make install`) failed:\n{hf.stderr[-3000:]}"
    )
    logits = torch.load(tmp_path / "logits.pt", weights_only=True)
    assert logits.shape == expected.shape == (2, length, lit_config.padded_vocab_size)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)
    assert not torch.equal(expected[0, 0], expected[0, -1])  # the comparison is over logits that differ
