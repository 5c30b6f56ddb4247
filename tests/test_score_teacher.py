"""`vocagnolm score-teacher` as a pipeline: every block scored once on any number of processes, the cache the same
bytes; bad sizes and changed settings refused, naming the values."""

import json
import math
import shutil
from pathlib import Path

import pytest
import ranks
import torch
from conftest import CachedSplit
from litgpt.config import Config
from litgpt.model import GPT

from litgpt_vocagnolm.data.prepared import iter_blocks
from litgpt_vocagnolm.data.teacher_cache import TeacherLossCache, check_cache
from litgpt_vocagnolm.loss import cross_entropy
from litgpt_vocagnolm.training.score_teacher import score_teacher


def cache_bytes(cache: Path) -> dict[str, bytes]:
    """Every file of a cache but its manifest, whose paths and counts are compared apart."""
    return {
        str(p.relative_to(cache)): p.read_bytes()
        for p in sorted(cache.rglob("*"))
        if p.is_file() and p != cache / "manifest.json"
    }


def score_in_two(rank: int, split: CachedSplit, output: Path) -> None:
    """A rank of `score-teacher --devices 2 --blocks_per_shard 8 --num_workers 1` over `split`."""
    score_teacher(data=split.data, teacher=split.teacher, output=output, devices=2, blocks_per_shard=8, num_workers=1)


def test_two_processes_score_every_block_once_and_write_the_same_cache(tmp_path, cached_split):
    """The split's cache, which one process scored in shards of 8 blocks, scored again by two (each with a loader
    worker): the same bytes. The train split's 5 shards are more than the processes, the validation split's one
    fewer: one rank scores none of it."""
    one, two = cached_split.cache, tmp_path / "two"
    ranks.start(score_in_two, (cached_split, two), processes=2)
    assert cache_bytes(one) == cache_bytes(two)
    manifest = json.loads((two / "manifest.json").read_text())
    data_manifest = json.loads((cached_split.data / "manifest.json").read_text())
    assert [math.ceil(data_manifest["splits"][split]["blocks"] / 8) for split in ("train", "val")] == [5, 1]
    for split in ("train", "val"):
        blocks = data_manifest["splits"][split]["blocks"]
        assert manifest["splits"][split]["blocks"] == blocks
        cached = TeacherLossCache(two, split)
        # Every block of the split is in the cache: its window's losses after the first token's NaN.
        for i, block in enumerate(iter_blocks(cached_split.data, split)):
            assert len(cached[i]) == max(1, len(block["teacher_ids"]))
    check_cache(two, cached_split.data / "manifest.json", cached_split.teacher)


@pytest.mark.parametrize("option", ["batch_size", "blocks_per_shard", "num_workers"])
def test_sizes_out_of_range_are_refused(tmp_path, cached_split, option):
    with pytest.raises(ValueError, match=f"--{option} must be at least"):
        score_teacher(data=cached_split.data, teacher=cached_split.teacher, output=tmp_path / "c", **{option: -1})
    assert not (tmp_path / "c").exists()


def test_another_teacher_precision_or_shard_size_is_refused_naming_both(tmp_path, cached_split):
    data, teacher = cached_split.data, cached_split.teacher
    output = Path(shutil.copytree(cached_split.cache, tmp_path / "cache"))  # scored in 32-true, 8 blocks a shard
    # The same teacher by another (absolute) path, and a copy of it elsewhere: the same teacher.
    copy = Path(shutil.copytree(teacher, tmp_path / "copy"))
    for same in (teacher.resolve(), copy):
        score_teacher(data=data, teacher=same, output=output, blocks_per_shard=8)
    check_cache(output, data / "manifest.json", copy, "32-true")

    # Same shape, same file names and sizes, other weights: another teacher.
    torch.manual_seed(2)
    torch.save(GPT(Config.from_file(teacher / "model_config.yaml")).state_dict(), copy / "lit_model.pth")
    assert (copy / "lit_model.pth").stat().st_size == (teacher / "lit_model.pth").stat().st_size
    with pytest.raises(ValueError, match="weights differ"):
        check_cache(output, data / "manifest.json", copy)
    recorded = json.loads((output / "manifest.json").read_text())["teacher"]["weights_sha256"]
    with pytest.raises(ValueError, match=f"teacher.weights_sha256: {recorded} in the cache, [0-9a-f]{{64}} now"):
        score_teacher(data=data, teacher=copy, output=output, blocks_per_shard=8)
    with pytest.raises(ValueError, match="precision: 32-true in the cache, 16-true now"):
        score_teacher(data=data, teacher=teacher, output=output, blocks_per_shard=8, precision="16-true")
    with pytest.raises(ValueError, match="blocks_per_shard: 8 in the cache, 4 now"):
        score_teacher(data=data, teacher=teacher, output=output, blocks_per_shard=4)
    with pytest.raises(ValueError, match="scored in 32-true, --teacher.precision is 16-true"):
        check_cache(output, data / "manifest.json", None, "16-true")

    # A killed run's partial cache: resumed only with the same settings.
    manifest = json.loads((output / "manifest.json").read_text())
    (output / "manifest.json").unlink()
    partial = {k: v for k, v in manifest.items() if k not in ("splits", "files")}
    (output / ".settings.json").write_text(json.dumps({**partial, "blocks_per_shard": 4}))
    with pytest.raises(ValueError, match="blocks_per_shard: 4 in the cache, 8 now"):
        score_teacher(data=data, teacher=teacher, output=output, blocks_per_shard=8)


def test_the_gpu_default_compiles_the_blocks_only_and_scores_what_eager_scores(tmp_path, cached_split, monkeypatch):
    """`score-teacher` as typed on a GPU, forced on this CPU: its defaults there (compile, bf16-true). No compiled graph
    holds the head or a gather over the vocabulary (compiled whole, a 151,936-row head's tile loop became one kernel
    whose index, rows x vocabulary, overflowed int32 on an H100), and the cache is the one the same precision writes
    eager. The teacher's head here has 512 rows, in tiles of 64 rows as a large vocabulary's come in several (a
    compiled head would show its nodes at any size). Every graph `torch.compile` is asked for is recorded (and run as
    traced); on a CPU the command stays eager unless told, and `--compile` overrides the default either way."""
    from litgpt_vocagnolm.training import score_teacher as command
    from litgpt_vocagnolm.training import teacher

    data, teacher_dir = cached_split.data, cached_split.teacher
    vocab_size = Config.from_file(teacher_dir / "model_config.yaml").padded_vocab_size
    monkeypatch.setattr(cross_entropy, "TILE_ELEMENTS", 64 * vocab_size)
    graphs = []

    def recorded(graph: torch.fx.GraphModule, example_inputs):
        graphs.append(graph)
        return graph.forward

    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn=None, **options: compile(fn, **{**options, "backend": recorded}))
    assert command.compiles_by_default(torch.device("cuda", 0)) and not command.compiles_by_default(torch.device("cpu"))
    assert teacher.default_precision(torch.device("cuda", 0)) == "bf16-true"

    def score(output: str, **options) -> Path:
        torch._dynamo.reset()
        score_teacher(data=data, teacher=teacher_dir, output=tmp_path / output, **options)
        return tmp_path / output

    eager = score("eager", precision="bf16-true", num_workers=0)
    assert not graphs  # this CPU's default: eager
    monkeypatch.setattr(command, "compiles_by_default", lambda device: True)  # as on a GPU
    monkeypatch.setattr(command, "default_precision", lambda device: "bf16-true")
    gpu = score("as-on-a-gpu")
    assert len(graphs) >= 1
    for graph in graphs:
        for node in graph.graph.nodes:
            assert "lm_head" not in node.name and "gather" not in str(node.target), graph.code
            value = node.meta.get("example_value")
            assert not (isinstance(value, torch.Tensor) and vocab_size in value.shape), (node, graph.code)
    assert json.loads((gpu / "manifest.json").read_text())["precision"] == "bf16-true"
    for split in ("train", "val"):
        for name in sorted(p.name for p in (eager / split).iterdir()):
            assert (gpu / split / name).read_bytes() == (eager / split / name).read_bytes(), name

    graphs.clear()
    score("told-not-to", compile=False, num_workers=0)
    assert not graphs
