"""The training step at the device's pace: one shape per run, so `compile: true` compiles once; no host sync outside
log steps."""

import traceback
from pathlib import Path

import torch
import torch._dynamo
from conftest import TINYLLAMA, tiny_config
from litgpt.args import EvalArgs, TrainArgs

import litgpt_vocagnolm.training.distributed
from litgpt_vocagnolm.data.prepared import VocAgnoData, padded_window
from litgpt_vocagnolm.loss.methods import GuidanceArgs
from litgpt_vocagnolm.training import recipe
from litgpt_vocagnolm.training.teacher import TeacherArgs


def train(tmp_path, data, teacher, steps: int, *, compile: bool = False, log_interval: int = 1) -> None:
    """The recipe in this process: a 2-layer student guided online by `teacher`, `steps` optimizer steps of 2 blocks."""
    recipe.setup(
        model_config=tiny_config("student", 32000, n_layer=2, n_embd=64, block_size=64),
        out_dir=tmp_path / "out",
        precision="32-true",
        data=VocAgnoData(path=data, num_workers=0),
        train=TrainArgs(
            save_interval=None,
            log_interval=log_interval,
            global_batch_size=2,
            micro_batch_size=2,
            max_tokens=10**9,
            max_steps=steps,
            max_seq_length=64,
            max_norm=1.0,
            lr_warmup_steps=1,
            min_lr=1e-4,
        ),
        eval=EvalArgs(interval=10**6, max_iters=1, initial_validation=False, final_validation=False),
        devices=1,
        tokenizer_dir=TINYLLAMA,
        logger_name="csv",
        teacher=TeacherArgs(checkpoint_dir=teacher),
        guidance=GuidanceArgs(method="vocagnolm", top_k=0.4),
        compile=compile,
    )


def test_windows_are_padded_to_one_length_per_run(tinyllama_qwen_data):
    data = VocAgnoData(path=tinyllama_qwen_data, num_workers=0)
    data.connect(batch_size=2, max_seq_length=64)
    width = padded_window(data.manifest)
    assert width % 64 == 0 and width - 64 < data.manifest["teacher_max_length"] <= width
    lengths = set()
    for k, batch in enumerate(data.train_dataloader()):
        (side,) = batch.teachers
        assert side.ids.shape == (2, width)
        lengths.add(int(side.valid.sum(1).max()))
        if k == 20:
            break
    assert len(lengths) > 3  # the windows do vary: a batch's longest would have given as many shapes


def test_compiled_step_compiles_once(tmp_path, monkeypatch, tinyllama_qwen_data, qwen_teacher):
    """20 steps compile no graph that the first step did not: the windows' lengths vary, the shapes do not."""
    monkeypatch.setattr(litgpt_vocagnolm.training.distributed, "COMPILE_BACKEND", "aot_eager")
    graphs = []
    for steps in (1, 20):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        train(tmp_path / str(steps), tinyllama_qwen_data, qwen_teacher, steps, compile=True)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    assert graphs[0] > 0  # something was compiled
    assert graphs[1] == graphs[0]


SYNCS = ("item", "tolist", "cpu", "nonzero", "__bool__", "__int__", "__float__", "numpy")


def test_no_host_sync_outside_log_steps(tmp_path, monkeypatch, tinyllama_qwen_data, qwen_teacher):
    """The calls that wait on the device, counted over optimizer steps that neither log nor save: none. (On a GPU,
    `torch.cuda.set_sync_debug_mode("error")` would check the same.)"""
    counts = {"step": 0, "sync": []}
    original_step = torch.optim.AdamW.step

    def counting_step(self, *args, **kwargs):
        counts["step"] += 1
        return original_step(self, *args, **kwargs)

    def counting(name):
        original = getattr(torch.Tensor, name)

        def call(self, *args, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            # After the first step (set-up may sync). AdamW's step counters live on the host (`capturable=False`, and
            # CUDA runs use the fused AdamW), and so does the data order the loader's sampler reads (`order.py`, a
            # permutation made on the CPU on every device): reading them waits on nothing.
            host = "torch/optim/" in caller.filename or caller.filename.endswith("litgpt_vocagnolm/data/order.py")
            if counts["step"] >= 1 and not host:
                counts["sync"].append(f"{name} in {Path(caller.filename).name}:{caller.lineno}")
            return original(self, *args, **kwargs)

        return call

    monkeypatch.setattr(torch.optim.AdamW, "step", counting_step)
    stop = recipe.fit

    def fit(*args, **kwargs):
        for name in SYNCS:
            monkeypatch.setattr(torch.Tensor, name, counting(name))
        try:
            return stop(*args, **kwargs)
        finally:
            monkeypatch.undo()

    monkeypatch.setattr(recipe, "fit", fit)
    train(tmp_path, tinyllama_qwen_data, qwen_teacher, 6, log_interval=100)
    assert counts["step"] == 6
    assert counts["sync"] == [], sorted(set(counts["sync"]))
