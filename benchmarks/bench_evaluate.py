"""`vocagnolm evaluate`'s generation next to a bare batched decode loop of the same model over the same prompts.

A random Llama-shaped model (4 layers, width 256 by default) with TinyLlama's real tokenizer, and the first GSM8K test
questions with the harness's 8-shot prompt (~800-900 tokens each). In alternating rounds it times
  evaluate  `generation.generate_greedy`: continuous batching, the questions that take rows freed at one step
            prefilled together into their rows of the KV cache (at most `PREFILL_ROWS` per forward), a host sync per
            step, the new text decoded a few tokens at a time and searched for the harness's stop strings, the whole
            text decoded at the end;
  bare      batches of the same size, longest prompts first, left-padded to the batch's longest prompt (a mask hides
            the padding); one prefill forward per batch (the head on the last position only, as evaluate's), then
            `max_new_tokens - 1` steps of forward and argmax with LitGPT's own KV cache, the tokens kept on the device
            and copied to the host once at the end: nothing but the model's work.
Throughput is generated tokens per second (each question's new tokens: a random model runs its whole budget, as the
printed counts show). Medians of wall time. Goal: evaluate within 10% of bare on CPU (ratio >= 0.9).
One torch thread by default on CPU (`--threads`; see bench_score_teacher.py for why).

    python benchmarks/bench_evaluate.py [--rounds 3] [--questions 16] [--batch_size 8] [--max_new_tokens 256] [--smoke]
    python benchmarks/bench_evaluate.py --device cuda --questions 256 --batch_size 64 --max_new_tokens 512

`--profile` then runs evaluate once more under cProfile and prints where its host time goes (on a GPU, the time a
call waits for the device shows in the call that syncs: `prefill`'s first token, a decode step's `tolist`).
"""

import argparse
import cProfile
import pstats
import statistics
import time
from pathlib import Path

import torch
from litgpt import GPT, Tokenizer
from smoke import parse_args  # benchmarks/ is on sys.path when this file runs as a script

from litgpt_vocagnolm.evaluation.generation import PREFILL_CHUNK, generate_greedy
from litgpt_vocagnolm.evaluation.math_tasks import (
    STOP_STRINGS,
    TASKS,
    build_prompt,
    load_examples,
    load_prompt,
    parse_question,
)
from litgpt_vocagnolm.models.model_configs import llama_config

TINYLLAMA = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tokenizers" / "tinyllama-1.1b"


@torch.inference_mode()
def bare_decode(model: GPT, prompts: list[list[int]], max_new_tokens: int, batch_size: int) -> int:
    """Greedy decoding of `prompts` in fixed batches, longest first: `max_new_tokens` tokens each; returns how many."""
    device = next(model.parameters()).device
    order = sorted(prompts, key=len, reverse=True)
    generated = 0
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        longest = len(batch[0])
        seq_len = longest + max_new_tokens
        ids = torch.zeros(len(batch), longest, dtype=torch.int64, device=device)
        real = torch.ones(len(batch), seq_len, dtype=torch.bool, device=device)  # (B, S): key is not padding
        for row, prompt in enumerate(batch):
            ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            real[row, : longest - len(prompt)] = False
        model.set_kv_cache(batch_size=len(batch), max_seq_length=seq_len, device=device)
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
        itself = torch.eye(seq_len, dtype=torch.bool, device=device)  # a padding query sees itself: no NaN
        model.mask_cache = (causal & (real[:, None, :] | itself))[:, None]  # (B, 1, S, S)
        head, model.lm_head = model.lm_head, torch.nn.Identity()
        for chunk in range(0, longest, PREFILL_CHUNK):
            end = min(chunk + PREFILL_CHUNK, longest)
            hidden = model(ids[:, chunk:end], torch.arange(chunk, end, device=device), input_pos_maxp1=end)
        model.lm_head = head
        tokens = [head(hidden[:, -1]).argmax(dim=-1)]  # (B,)
        for step in range(max_new_tokens - 1):
            position = longest + step
            logits = model(tokens[-1][:, None], torch.tensor([position], device=device), input_pos_maxp1=position + 1)
            tokens.append(logits[:, -1].argmax(dim=-1))
        generated += torch.stack(tokens).numel()  # the one copy to the host
        model.clear_kv_cache()
    return generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; each runs evaluate and bare once")
    parser.add_argument("--questions", type=int, default=16, help="GSM8K test questions")
    parser.add_argument("--batch_size", type=int, default=8, help="questions decoded together, by both")
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="float32", help="a torch dtype: float32, bfloat16")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    parser.add_argument("--profile", action="store_true", help="then profile one evaluate run (cProfile)")
    smoke = {"rounds": 1, "questions": 2, "batch_size": 2, "max_new_tokens": 8, "layers": 1, "embd": 64}
    args = parse_args(parser, smoke)
    torch.set_num_threads(args.threads)

    tokenizer = Tokenizer(TINYLLAMA)
    task, shots = TASKS["gsm8k"], load_prompt(TASKS["gsm8k"])
    prompts = [
        tokenizer.encode(build_prompt(parse_question(example, task), task, shots)).tolist()
        for example in load_examples(task)[: args.questions]
    ]
    config = llama_config(
        "bench", 32000, args.layers, args.embd, n_head=args.embd // 64, intermediate_size=4 * args.embd, block_size=2048
    )
    torch.manual_seed(0)
    model = GPT(config).to(device=args.device, dtype=getattr(torch, args.precision)).eval()
    lengths = sorted(map(len, prompts))
    print(
        f"{args.layers} layers, width {args.embd}, {args.device} {args.precision}, {args.threads} thread(s);"
        f" {len(prompts)} GSM8K prompts of {lengths[0]}-{lengths[-1]} tokens, {args.max_new_tokens} new tokens each,"
        f" batch {args.batch_size}"
    )

    def synchronize() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def run_evaluate() -> int:
        generations = generate_greedy(model, tokenizer, prompts, args.max_new_tokens, STOP_STRINGS, args.batch_size)
        return sum(generation.new_tokens for generation in generations)

    def run_bare() -> int:
        return bare_decode(model, prompts, args.max_new_tokens, args.batch_size)

    runs = {"evaluate": run_evaluate, "bare": run_bare}
    seconds, tokens = {name: [] for name in runs}, {}
    for name, run in runs.items():  # warm-up
        tokens[name] = run()
    for _ in range(args.rounds):
        for name, run in runs.items():
            synchronize()
            start = time.perf_counter()
            run()
            synchronize()
            seconds[name].append(time.perf_counter() - start)
    rates = {name: tokens[name] / statistics.median(seconds[name]) for name in runs}
    for name in runs:
        print(
            f"{name:9s} {tokens[name]:7d} tokens in {statistics.median(seconds[name]):7.2f} s (median of"
            f" {args.rounds}): {rates[name]:9.1f} generated tokens/s"
        )
    print(f"evaluate / bare: {rates['evaluate'] / rates['bare']:.3f}x (goal on CPU: >= 0.9x)")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(lambda: (run_evaluate(), synchronize()))
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
