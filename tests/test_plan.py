"""`vocagnolm plan`: the memory estimate against a measured step, and the command on a paper recipe."""

import importlib.util
import re

import lightning as L
import pytest
from conftest import RECIPES, ROOT, TINYLLAMA, typed_here
from litgpt.config import Config

from litgpt_vocagnolm.models.model_configs import llama_config
from litgpt_vocagnolm.planning.memory import StepShape, estimate_memory, matmul_parameters, parameters
from litgpt_vocagnolm.training.distributed import FSDPArgs

PAPER_RECIPE = RECIPES / "tinyllama-qwen2.5-math-7b-instruct.yaml"
WORKS = "online|cached|student only|scoring|LitGPT's step"
ROW = re.compile(rf"^  ({WORKS}) +(\d+) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+)$")  # work, micro-batch, 3 x 2


def bench_scale():
    """benchmarks/bench_scale.py, whose steps are the recipe's and whose measurement docs/memory.md reports."""
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "benchmarks" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name",
    [
        "tiny-llama-1.1b",
        "Qwen2.5-Math-7B",
        "Mistral-7B-v0.1",
        "deepseek-math-7b-base",
        "Gemma-2-9b",
        "phi-2",
        "falcon-40b",
    ],
)
def test_parameter_counts_equal_litgpt_models(name):
    """Dense models, with their norms, biases, head bias and post-norms: every parameter, and those of the matrix
    products (the 2-D ones but the embedding)."""
    import torch
    from litgpt.model import GPT

    from litgpt_vocagnolm.models.model_configs import register

    register()
    config = Config.from_name(name)
    with torch.device("meta"):  # counted, never allocated
        model = GPT(config)
    assert parameters(config) == sum(p.numel() for p in model.parameters())
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n)
    assert matmul_parameters(config) == matmul


@pytest.mark.parametrize("name, total, active", [("Mixtral-8x7B-v0.1", 46.7, 12.9), ("Qwen3-30B-A3B", 30.5, 3.3)])
def test_a_mixture_of_experts_counts_all_its_experts_and_computes_with_those_a_token_meets(name, total, active):
    """The model cards' figures, in billions to one decimal: all parameters, and those a token goes through (its
    experts, the embedding row included): Mixtral's "46.7B total, 12.9B active", Qwen3's "30.5B in total and 3.3B
    activated"."""
    config = Config.from_name(name)
    assert abs(parameters(config) / 1e9 - total) < 0.06
    assert abs((matmul_parameters(config) + config.padded_vocab_size * config.n_embd) / 1e9 - active) < 0.06


@pytest.mark.parametrize("name", ["Gemma-2-9b", "Gemma-3-4b-it", "Mistral-7B-v0.1", "Mixtral-8x7B-v0.1"])
def test_each_kind_of_layer_is_planned_as_measured(name):
    """Tiny copies (tests/test_model_families.py) at 256 tokens, where the square of the length shows: each layer's
    bytes saved for backward (soft-capped attention's scores, a sliding layer's mask, the experts a token meets) as
    `block_bytes_per_token` and `attention_square_bytes` count them, within SDPA's own output, which the soft-capped
    path does not keep (5%), and a few bytes of the router; each layer's forward peak (the teacher's) within the error
    of fitting a peak (25%)."""
    import torch
    from test_model_families import family_config

    from litgpt_vocagnolm.models.gpt import GPT
    from litgpt_vocagnolm.planning.memory import attention_square_bytes, block_bytes_per_token, cpu_peak_bytes

    config, B, T = family_config(name, vocab_size=64, block_size=T_LONG), 2, T_LONG
    torch.manual_seed(0)
    model = GPT(config)
    for train, (low, high) in ((True, (0.999, 1.05)), (False, (0.9, 1.25))):
        per_token, per_block = block_bytes_per_token(config, train)
        squares = attention_square_bytes(config, B, T, train)
        for layer, block in enumerate(model.transformer.h):
            cos, sin = model.cos[:T].unsqueeze(0), model.sin[:T].unsqueeze(0)
            if config.rope_indices is not None:
                cos, sin = cos[..., config.rope_indices[layer]], sin[..., config.rope_indices[layer]]
            if train:
                measured = saved_bytes(block, torch.randn(B, T, config.n_embd, requires_grad=True), cos, sin)
                planned = per_token * B * T + per_block + squares[layer]
            else:
                frozen = block.to(torch.bfloat16).requires_grad_(False)
                x = torch.randn(B, T, config.n_embd, dtype=torch.bfloat16)
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    (measured,) = cpu_peak_bytes(lambda: frozen(x, cos, sin))
                planned = per_token * B * T + squares[layer]
            assert low <= planned / measured <= high, (train, layer, planned, measured)


T_LONG = 256


def saved_bytes(block, x, cos, sin) -> int:
    """Bytes a block saves for backward under bf16 autocast, its parameters aside (as `block_bytes_per_token` counts
    them)."""
    import torch

    parameters = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, cos, sin)
    return sum(saved.values())


@pytest.mark.parametrize("activation_checkpointing", [False, True])
def test_estimate_is_within_15_percent_of_the_measured_peak(activation_checkpointing):
    """Small Llama-shaped models with long sequences, so that activations and logits, not parameters, set the peak:
    the four kinds of step bench_scale runs, measured with the profiler's allocation events."""
    bench = bench_scale()
    student = llama_config("s", 2000, n_layer=3, n_embd=64, n_head=4, intermediate_size=172, block_size=512)
    teacher = llama_config("t", 6000, n_layer=2, n_embd=96, n_head=4, intermediate_size=256, block_size=1024)
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    for kind in ("ce", "online", "cached", "score"):
        setting = bench.Setting("t", student, teacher, 4, 512, 600, activation_checkpointing)
        measured, _, _ = bench.measure(fabric, setting, kind, whole_logits=False)
        step = StepShape(
            4,
            512,
            600,
            train=kind != "score",
            activation_checkpointing=activation_checkpointing,
            fused_optimizer=False,
            workspace=False,
        )
        estimate = estimate_memory(student, [teacher] if kind in ("online", "score") else [], step)
        assert 0.85 <= estimate.total / measured <= 1.15, (kind, estimate, measured)


def test_plan_command_on_the_paper_recipe():
    """`vocagnolm plan` as typed, run here (`typed_here`: through `cli.main`, as the console script runs it)."""
    recipe = RECIPES / "tinyllama-qwen2.5-math-7b-instruct.yaml"
    out = typed_here("vocagnolm", "plan", "--config", str(recipe), "--window", "1900", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    for component in ("student parameters", "AdamW state", "teacher parameters", "student activations", "total"):
        assert component in out.stdout, component
    assert "32 GPUs (4 x 8)" in out.stdout and "micro-batch 8 x 2048" in out.stdout
    largest = int(re.search(r"Largest micro-batch that fits 80 GB: (\d+)", out.stdout).group(1))

    from litgpt_vocagnolm.models.model_configs import register

    register()
    student, teacher = Config.from_name("tiny-llama-1.1b"), Config.from_name("Qwen2.5-Math-7B-Instruct")

    def total(micro_batch: int) -> float:  # the recipe's layout and its 1024 / (32 x 8) = 4 micro-batches per step
        step = StepShape(
            micro_batch,
            2048,
            1900,
            world_size=32,
            num_nodes=4,
            accumulation=4,
            compiled=True,
            layout=FSDPArgs(teacher="replicate", student="hybrid"),
        )
        return estimate_memory(student, [teacher], step).total

    assert total(largest) <= 80e9 < total(largest + 1)  # the largest, by the same estimate (the recipe compiles)
    assert re.search(r"replicate +hybrid .* <- chosen <- fastest that fits", out.stdout)  # the recipe's own layout


def test_plan_counts_no_teacher_for_a_method_that_loads_none(capsys):
    """`random` draws among the mapped tokens: like `ce` it loads no teacher, so its step holds none (the table says
    so); `vocagnolm` with the same recipe runs its teacher online."""
    from litgpt_vocagnolm.planning.plan import plan

    recipe = RECIPES / "tinyllama-qwen2.5-math-7b-instruct.yaml"
    printed = {}
    for method in ("random", "vocagnolm"):
        plan(["--config", str(recipe), "--window", "1900", "--guidance.method", method])
        printed[method] = capsys.readouterr().out
    assert "no teacher" in printed["random"] and "teacher parameters" not in printed["random"]
    assert "teacher online" in printed["vocagnolm"] and "teacher parameters" in printed["vocagnolm"]


@pytest.mark.parametrize(
    "micro_batch, compiled_gb, eager_gb", [(1, 34.42, 36.21), (4, 44.46, 51.66), (8, 57.49, 71.89)]
)
def test_estimate_gives_the_peaks_measured_on_an_h100_compiled_and_eager(micro_batch, compiled_gb, eager_gb):
    """The online step's peaks on one H100 (docs/performance.md: TinyLlama-1.1B with Qwen2.5-Math-7B,
    sequence 2048, window 2560, one GPU), compiled and eager: the estimate is within a few percent of each, above."""
    from litgpt_vocagnolm.models.model_configs import register

    register()
    student, teacher = Config.from_name("tiny-llama-1.1b"), Config.from_name("Qwen2.5-Math-7B")
    for compiled, measured in ((True, compiled_gb), (False, eager_gb)):
        estimate = estimate_memory(student, [teacher], StepShape(micro_batch, 2048, 2560, compiled=compiled)).total
        assert 1.0 <= estimate / (measured * 1e9) <= 1.04, (compiled, estimate / 1e9, measured)


def test_plan_of_a_compiled_recipe_offers_a_larger_micro_batch(capsys):
    """The paper recipe compiles: its plan counts what compiled blocks hold, and so fits more sequences than the same
    recipe run eager."""
    from litgpt_vocagnolm.planning.plan import plan

    largest = {}
    for compile in ("true", "false"):
        plan(["--config", str(PAPER_RECIPE), "--window", "1900", "--compile", compile])
        printed = capsys.readouterr().out
        assert f"compile {'on' if compile == 'true' else 'off'}" in printed
        largest[compile] = int(re.search(r"Largest micro-batch that fits 80 GB: (\d+)", printed).group(1))
    assert largest["true"] > largest["false"] >= 8, largest


def measured_rows(printed: str) -> dict[tuple[str, int], list[str]]:
    """The measurement table's rows by (work, micro-batch): planned and measured peak GB, tokens/s, MFU."""
    rows = {}
    for line in printed.splitlines():
        if match := ROW.match(line):
            rows[match[1], int(match[2])] = list(match.groups()[2:])
    return rows


@pytest.mark.long
def test_plan_measure_on_the_tiny_recipe_prints_measured_beside_planned(one_thread):
    """`vocagnolm plan --config demo-cpu --measure true` as typed, on this CPU: the recipe's step (`ce`:
    the student only) at its micro-batch and at half of it, LitGPT's step, a checkpoint's save and load, each beside
    the plan, then the budget's projection and the ratio to LitGPT's step. Run here through `cli.main`, as the
    console script runs it (`typed_here`), on one thread as a console script's process has under `make test`.
    `make test-long`: test_plan_measure_with_a_teacher_runs_online_cached_and_scoring shows the same lines, worked
    out the same way, on steps of 4 blocks of 64 tokens rather than demo-cpu's 16 of 128 (12 s of CPU here)."""
    out = typed_here("vocagnolm", "plan", "--config", "demo-cpu", "--measure", "true", cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = out.stdout[out.stdout.index("Measured here") :]
    header = next(line.split() for line in printed.splitlines() if line.split()[:2] == ["work", "micro-batch"])
    assert header[2:] == ["planned", "measured"] * 3  # peak GB, tokens/s, MFU
    rows = measured_rows(printed)
    assert set(rows) == {("student only", 8), ("student only", 4), ("LitGPT's step", 8)}
    for (work, _), (planned_gb, peak_gb, _, speed, _, _) in rows.items():
        assert float(peak_gb) > 0 and float(speed.replace(",", "")) > 0, work
        assert (planned_gb == "n/a") == (work == "LitGPT's step")  # the plan has no figure for LitGPT's own step
    assert float(rows["student only", 8][0]) > float(rows["student only", 4][0]) > 0

    save, load = map(float, re.search(r"a blocking save ([\d.]+) s, a load ([\d.]+) s", printed).groups())
    assert save > 0 and load > 0
    assert re.search(r"before the time limit .*: the step under way \([\d.]+ s\) and the save take [\d.]+ s", printed)
    # The budget: 40,960 tokens in steps of 16 sequences of 128 tokens; the step's time is that of its 2,048 tokens.
    check_measured_here(printed, rows, "student only", 8, 16 * 128)
    speed = float(rows["student only", 8][3].replace(",", ""))
    ratio = float(re.search(r"Student only step / LitGPT's step, tokens/s at micro-batch 8: ([\d.]+)x", printed)[1])
    litgpt_speed = float(rows["LitGPT's step", 8][3].replace(",", ""))
    assert ratio > 0 and abs(ratio - speed / litgpt_speed) <= 0.01 + 0.01 * ratio


def test_plan_measure_with_a_teacher_runs_online_cached_and_scoring(
    tmp_path, tinyllama_mistral_data, mistral_teacher, capsys
):
    """The tiny recipe guided by a tiny teacher checkpoint, on prepared data: the online step (the recipe's), the
    cached one and scoring are measured too, and the cached step is the one set against LitGPT's; each beside the
    plan, a checkpoint's save and load, the device, then the budget's projection at the online step's pace."""
    from litgpt_vocagnolm.planning.plan import plan

    plan(
        [
            "--config",
            str(RECIPES / "demo-cpu.yaml"),
            "--measure",
            "true",
            "--guidance.method",
            "vocagnolm",
            "--teacher.checkpoint_dir",
            str(mistral_teacher),
            "--data.path",
            str(tinyllama_mistral_data),
            "--train.max_seq_length",
            "64",
            "--train.micro_batch_size",
            "2",
            "--train.global_batch_size",
            "4",
            "--tokenizer_dir",
            str(TINYLLAMA),
            "--out_dir",
            str(tmp_path / "out"),
        ]
    )
    printed = capsys.readouterr().out
    assert f"batches from {tinyllama_mistral_data}" in printed
    printed = printed[printed.index("Measured here") :]
    header = next(line.split() for line in printed.splitlines() if line.split()[:2] == ["work", "micro-batch"])
    assert header[2:] == ["planned", "measured"] * 3  # peak GB, tokens/s, MFU
    rows = measured_rows(printed)
    assert set(rows) == {("online", 2), ("online", 1), ("cached", 2), ("scoring", 2), ("LitGPT's step", 2)}
    for (work, micro_batch), (planned_gb, peak_gb, _, speed, _, _) in rows.items():
        assert float(peak_gb) > 0 and float(speed.replace(",", "")) > 0, work
        assert (planned_gb == "n/a") == (work == "LitGPT's step")  # the plan has no figure for LitGPT's own step
    assert not list((tmp_path / "out").glob("**/step-*"))  # the measured checkpoint is gone

    save, load = map(float, re.search(r"a blocking save ([\d.]+) s, a load ([\d.]+) s", printed).groups())
    assert save > 0 and load > 0
    assert re.search(r"before the time limit .*: the step under way \([\d.]+ s\) and the save take [\d.]+ s", printed)
    # The budget: demo-cpu's 40,960 tokens in steps of 4 sequences of 64 tokens, each the time of its 256 tokens at
    # the pace of the recipe's own step (online, at its micro-batch).
    check_measured_here(printed, rows, "online", 2, 4 * 64)
    ratio = float(re.search(r"Cached step / LitGPT's step, tokens/s at micro-batch 2: ([\d.]+)x", printed)[1])
    cached, litgpt_speed = (float(rows[work, 2][3].replace(",", "")) for work in ("cached", "LitGPT's step"))
    assert ratio > 0 and abs(ratio - cached / litgpt_speed) <= 0.01 + 0.01 * ratio


def test_plan_warns_when_the_prepared_data_is_for_another_sequence_length(capsys, tinyllama_qwen_data):
    """The data prepared at max_seq_length 64 under demo-cpu (128): one line saying so and what to pass; none once the
    recipe's length is the data's."""
    from litgpt_vocagnolm.planning.plan import plan

    plan(["--config", str(RECIPES / "demo-cpu.yaml"), "--data.path", str(tinyllama_qwen_data)])
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        f"Warning: {tinyllama_qwen_data} holds blocks for max_seq_length 64, but this plan is for 128 (the recipe's):"
        " the run would refuse the data. Pass --train.max_seq_length 64, or prepare again with --max_seq_length 128."
    ]
    plan(
        [
            "--config",
            str(RECIPES / "demo-cpu.yaml"),
            "--data.path",
            str(tinyllama_qwen_data),
            "--train.max_seq_length",
            "64",
        ]
    )
    assert "Warning:" not in capsys.readouterr().out


MODELS_PAGE = ROOT / "docs" / "models.md"


def test_the_teacher_costs_that_docs_models_quotes_are_what_plan_prints(capsys):
    """docs/models.md's table of teachers, each cell from `plan` of the paper's recipe with that teacher, and its
    whole plan of Gemma-2-9b as `plan` prints it (the recipe's path aside), and the figures its prose gives."""
    from litgpt_vocagnolm import cli
    from litgpt_vocagnolm.loss.cross_entropy import TILE_ELEMENTS
    from litgpt_vocagnolm.models.model_configs import config_named
    from litgpt_vocagnolm.planning.memory import SOFTCAPPED_SCORE_BYTES

    page = MODELS_PAGE.read_text(encoding="utf-8")
    rows = [line.strip("|").split(" | ") for line in page.splitlines() if re.match(r"\| \w+/\S+ \|", line)]
    assert [row[0].strip() for row in rows] == [
        "Qwen/Qwen2.5-Math-7B-Instruct",
        "google/gemma-2-9b",
        "google/gemma-3-12b-it",
        "google/gemma-2-27b",
    ]
    printed = {}
    for teacher, vocabulary, teacher_gb, total_gb, largest, fastest, scoring_gb in (map(str.strip, r) for r in rows):
        recipe = ["--config", "tinyllama-qwen2.5-math-7b-instruct"]  # as typed: the packaged recipe's name
        cli.main(["plan", *recipe, "--teacher.checkpoint_dir", f"checkpoints/{teacher}"])
        printed[teacher] = out = capsys.readouterr().out
        assert f"{config_named(teacher.split('/')[1], teacher).padded_vocab_size:,}" == vocabulary
        assert re.search(rf"  teacher parameters +{teacher_gb} GB", out), teacher
        assert re.search(rf"  total +{total_gb} GB", out), teacher
        assert f"Largest micro-batch that fits 80 GB: {largest}\n" in out, teacher
        assert re.search(rf"^  {' +'.join(fastest.split(', '))} .*<- fastest that fits", out, re.MULTILINE), teacher
        assert f"(the whole teacher on each GPU): {scoring_gb} GB\n" in out, teacher

    transcript = page[page.index("$ vocagnolm plan") :].split("```")[0].splitlines()
    assert transcript[0].endswith("--teacher.checkpoint_dir checkpoints/google/gemma-2-9b")
    lines = printed["google/gemma-2-9b"].splitlines()  # the recipe's path shortened to ".../" on the page
    assert len(lines) == len(transcript) - 1
    for line, quoted in zip(lines, transcript[1:]):
        assert line.endswith(quoted[3:]) if quoted.startswith(".../") else line == quoted, quoted

    gemma, prose = Config.from_name("Gemma-2-9b"), " ".join(page.split())
    assert f"2 x {gemma.padded_vocab_size:,} x {gemma.n_embd:,}" in prose
    assert f"a tile of {TILE_ELEMENTS // gemma.padded_vocab_size} rows of {gemma.padded_vocab_size:,} logits" in prose
    assert f"({SOFTCAPPED_SCORE_BYTES['forward']} bytes each at their peak" in prose


def check_measured_here(printed: str, rows: dict, work: str, micro_batch: int, step_tokens: int) -> None:
    """What `plan --measure` on a CPU says of where it measured (the device by name; the run's one device a CPU
    process, whose hours are CPU-hours; the job's GPUs planned at 80 GB) and of the budget: demo-cpu's 40,960 tokens
    in steps of `step_tokens`, each the time of its tokens at the pace `rows` gives `work` at `micro_batch`."""
    assert re.search(r"^Measured here, on one device, cpu \(\d+ threads?, [\d.]+ GB\): one process's share", printed)
    assert "GPUs) at the peaks measured here: planned 1024, measured" in printed
    assert f"({work} steps on 1 CPU process)" in printed
    projection = r"measured ([\d,]+) steps x ([\d.]+) s = ([\d,.]+) s wall-clock, ([\d.]+) CPU-hours"
    steps, step, wall, cpu_hours = (float(x.replace(",", "")) for x in re.search(projection, printed).groups())
    assert steps == 40960 // step_tokens
    assert abs(wall - steps * step) <= 0.05 + steps * 5e-5
    assert abs(cpu_hours - wall / 3600) <= 0.005
    speed = float(rows[work, micro_batch][3].replace(",", ""))
    assert abs(step_tokens / speed - step) <= 0.01 * step
