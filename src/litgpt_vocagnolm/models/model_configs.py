"""LitGPT model configs for the paper's teachers that LitGPT 0.5 lacks, from the models' published config.json.

`register()` adds them to `litgpt.config` (idempotent); the recipe, `vocagnolm evaluate` and
`vocagnolm convert_to_litgpt` call it, so `Config.from_name("llemma_7b")` works wherever we run. `litgpt download`
itself cannot see them: download with `--convert_checkpoint false`, then run `vocagnolm convert_to_litgpt DIR`.
"""

from pathlib import Path

from litgpt.config import Config

from litgpt_vocagnolm.errors import InvalidArgument, PathMissing, check_writable

CONFIGS = [
    # https://huggingface.co/EleutherAI/llemma_7b/blob/main/config.json (Code Llama 7B continued on Proof-Pile-2)
    dict(
        name="llemma_7b",
        hf_config=dict(org="EleutherAI", name="llemma_7b"),
        block_size=4096,
        vocab_size=32016,
        padding_multiple=16,
        n_layer=32,
        n_head=32,
        n_embd=4096,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        norm_eps=1e-05,
        mlp_class_name="LLaMAMLP",
        intermediate_size=11008,
        rope_base=1000000,
    ),
    # https://huggingface.co/deepseek-ai/deepseek-math-7b-base/blob/main/config.json (LlamaForCausalLM, 30 layers)
    # and its -instruct / -rl siblings, which share the architecture.
    *(
        dict(
            name=f"deepseek-math-7b-{kind}",
            hf_config=dict(org="deepseek-ai", name=f"deepseek-math-7b-{kind}"),
            block_size=4096,
            vocab_size=102400,
            padded_vocab_size=102400,
            n_layer=30,
            n_head=32,
            n_embd=4096,
            rotary_percentage=1.0,
            parallel_residual=False,
            bias=False,
            norm_class_name="RMSNorm",
            norm_eps=1e-06,
            mlp_class_name="LLaMAMLP",
            intermediate_size=11008,
            rope_base=10000,
        )
        for kind in ("base", "instruct", "rl")
    ),
]


def llama_config(
    name: str, vocab_size: int, n_layer: int, n_embd: int, n_head: int, intermediate_size: int, block_size: int
) -> Config:
    """A small Llama-shaped `litgpt.Config` (RMSNorm, SwiGLU MLP, full RoPE, no biases): the shape of TinyLlama and
    of the paper's teachers, at any size, for the demo, tests and benchmarks."""
    return Config(
        name=name,
        block_size=block_size,
        vocab_size=vocab_size,
        padding_multiple=64,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        norm_class_name="RMSNorm",
        mlp_class_name="LLaMAMLP",
        intermediate_size=intermediate_size,
    )


def register() -> None:
    from litgpt import config

    # gair-prox/Mistral-7B-ProXMath: Mistral-7B-v0.1 continued on ProX-refined OpenWebMath; the same architecture.
    proxmath = dict(config.name_to_config["Mistral-7B-v0.1"])
    proxmath.update(name="Mistral-7B-ProXMath", hf_config=dict(org="gair-prox", name="Mistral-7B-ProXMath"))
    for entry in [*CONFIGS, proxmath]:
        if entry["name"] not in config.name_to_config:
            config.configs.append(entry)
            config.name_to_config[entry["name"]] = entry


def config_named(name: str, what: str) -> Config:
    """LitGPT's config of that name (after `register()`), or an error saying where the names are listed."""
    try:
        return Config.from_name(name)
    except ValueError:
        raise InvalidArgument(
            f"{what}: {name!r} is not a LitGPT config name. `litgpt pretrain --recipe vocagnolm --model_name list`"
            " lists them."
        ) from None


def convert_to_litgpt(checkpoint_dir: Path, model_name: str | None = None, dtype: str | None = None) -> None:
    """`litgpt convert_to_litgpt` that also knows llemma_7b, deepseek-math-7b-* and Mistral-7B-ProXMath.

    Arguments:
        checkpoint_dir: A Hugging Face checkpoint directory (e.g. from `litgpt download --convert_checkpoint false`),
            writable: lit_model.pth is written into it.
        model_name: The LitGPT config name; inferred from the directory name by default.
        dtype: The dtype of the converted weights.
    """
    from litgpt.scripts.convert_hf_checkpoint import convert_hf_checkpoint

    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise PathMissing(
            f"checkpoint_dir {str(checkpoint_dir)!r} is not a folder. Give the folder of a Hugging Face checkpoint"
            " (e.g. checkpoints/EleutherAI/llemma_7b, from `litgpt download --convert_checkpoint false`)."
        )
    check_writable(checkpoint_dir, "checkpoint_dir")
    register()
    inferred = "The folder's name (the default --model_name; else pass --model_name NAME)"
    config_named(model_name or checkpoint_dir.name, "--model_name" if model_name else inferred)
    weights = [p.name for p in checkpoint_dir.iterdir() if p.suffix in (".bin", ".safetensors")]
    if not weights and (checkpoint_dir / "lit_model.pth").is_file():
        raise InvalidArgument(
            f"checkpoint_dir {str(checkpoint_dir)!r} is a LitGPT checkpoint already (lit_model.pth, no Hugging Face"
            " weights): use it as it is; `litgpt convert_from_litgpt` goes the other way."
        )
    if not weights:
        present = sorted(p.name for p in checkpoint_dir.iterdir())
        raise PathMissing(
            f"checkpoint_dir {str(checkpoint_dir)!r} holds no Hugging Face weights (*.safetensors or *.bin; it holds"
            f" {present}). Download them: `litgpt download <repo> --convert_checkpoint false`."
        )
    convert_hf_checkpoint(checkpoint_dir=checkpoint_dir, model_name=model_name, dtype=dtype)
