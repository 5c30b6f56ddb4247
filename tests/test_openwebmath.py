"""`vocagnolm prepare` on parquet files with OpenWebMath's schema, and `prepare --dry_run` against the real run.

OpenWebMath's schema, from its dataset card (huggingface.co/datasets/open-web-math/open-web-math, README.md,
`dataset_info.features`): four string columns, `url`, `text`, `date` (when the page was crawled) and `metadata`
(a JSON string from the extraction). Its train split: 6,315,233 rows in parquet files.
"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import QWEN, ROOT, TINYLLAMA

from litgpt_vocagnolm.alignment.lexical import encode
from litgpt_vocagnolm.alignment.tokenizer_files import find_tokenizer_file, load_tokenizer, tokenizer_info
from litgpt_vocagnolm.data.dry_run import PAPER_TOKENS, Packing, measure_prepare, text_bytes
from litgpt_vocagnolm.data.packing import BlockDtypes
from litgpt_vocagnolm.data.prepare import prepare
from litgpt_vocagnolm.data.prepared import load_manifest

SCHEMA = pa.schema([("url", pa.string()), ("text", pa.string()), ("date", pa.string()), ("metadata", pa.string())])


@pytest.fixture(scope="module")
def openwebmath_like(tmp_path_factory) -> tuple[Path, list[str]]:
    """Two parquet files of real math text (the Stack Exchange sample in data/) with OpenWebMath's columns."""
    lines = (ROOT / "data/stackexchange/math_stackexchange_33votes.jsonl").read_text(encoding="utf-8").splitlines()
    texts = [f"{r['input']}\n\n{r['output']}" for r in map(json.loads, lines[:90])]
    folder = tmp_path_factory.mktemp("open-web-math") / "data"
    folder.mkdir()
    for part, rows in enumerate([texts[:60], texts[60:]]):
        table = pa.table(
            {
                "url": [f"https://math.stackexchange.com/questions/{part}{i}" for i in range(len(rows))],
                "text": rows,
                "date": ["2023-03-21 11:08:42"] * len(rows),
                "metadata": [json.dumps({"extraction_info": {"found_math": True}, "warc_path": "s3://x"})] * len(rows),
            },
            schema=SCHEMA,
        )
        pq.write_table(table, folder / f"train-{part:05d}-of-00002.parquet", row_group_size=40)
    return folder, texts


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, openwebmath_like) -> dict:
    """The manifest of `vocagnolm prepare` on those files, with its defaults (`--text_key text`)."""
    output = tmp_path_factory.mktemp("prepared") / "owm"
    folder = openwebmath_like[0]
    prepare(student=TINYLLAMA, teacher=QWEN, input=folder, output=output, max_seq_length=128, num_workers=1)
    return load_manifest(output)


def test_prepare_reads_openwebmath_parquet(openwebmath_like, prepared):
    folder, texts = openwebmath_like
    assert pq.read_schema(next(folder.glob("*.parquet"))) == SCHEMA
    manifest = prepared
    splits = manifest["splits"].values()
    # Every row's `text`, and nothing of the other columns: documents, characters and tokens all add up.
    assert sum(s["documents"] for s in splits) == len(texts)
    assert sum(s["characters"] for s in splits) == sum(map(len, texts))
    student = load_tokenizer(TINYLLAMA)
    info = tokenizer_info(find_tokenizer_file(TINYLLAMA))
    specials = (info.bos_id is not None) + (info.eos_id is not None)
    assert sum(s["student_tokens"] for s in splits) == sum(len(encode(student, t)[0]) + specials for t in texts)
    assert manifest["skipped_records"] == {} and manifest["skipped_files"] == []


def test_dry_run_predicts_the_real_run(tmp_path, capsys, openwebmath_like, prepared):
    folder, texts = openwebmath_like
    files = sorted(folder.glob("*.parquet"))
    # The text column's size read from the parquet metadata, without reading a row: a little high, as its page
    # headers and statistics (a page's smallest and largest string) count too.
    assert text_bytes(files[0], ["text"]) == pytest.approx(sum(len(t.encode("utf-8")) for t in texts[:60]), rel=0.05)

    manifest = prepared
    student = tokenizer_info(find_tokenizer_file(TINYLLAMA))
    teacher = tokenizer_info(find_tokenizer_file(QWEN))
    packing = Packing(student, teacher, 129, manifest["teacher_max_length"], BlockDtypes(**manifest["dtypes"]))
    figures = measure_prepare(files, ["text"], packing, val_fraction=0.01, num_workers=4, teacher_dir=QWEN)
    # The sample is the whole input here: the extrapolation must land on what prepare wrote (the input's size comes
    # from the metadata, as above).
    real_tokens = sum(s["student_tokens"] for s in manifest["splits"].values())
    real_shard_bytes = sum(s["shard_bytes"] for s in manifest["splits"].values())
    assert figures["student_tokens"] == pytest.approx(real_tokens, rel=0.05)
    assert figures["shard_bytes"] == pytest.approx(real_shard_bytes, rel=0.05)
    assert figures["passes"] == pytest.approx(PAPER_TOKENS / (real_tokens * 0.99 * 128 / 129), rel=0.05)
    assert figures["teacher_flops"] is None  # a bare tokenizer dir: no model config to count FLOPs from

    # The command writes nothing and prints the figures.
    dry = tmp_path / "dry"
    prepare(student=TINYLLAMA, teacher=QWEN, input=folder, output=dry, max_seq_length=128, dry_run=True)
    out = capsys.readouterr().out
    assert not dry.exists()
    assert "student tokens/s per worker" in out and "passes over the train split" in out and "loss cache" in out


def test_jsonl_text_bytes(tmp_path):
    # A .jsonl file's text is its size times the share of each line that the records' text fields take.
    lines = (ROOT / "data/gsm8k/train.jsonl").read_text(encoding="utf-8").splitlines()[:200]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    records = [json.loads(line) for line in lines]
    expected = sum(len(f"{r['question']}\n\n{r['answer']}".encode("utf-8")) for r in records)
    assert text_bytes(path, ["question", "answer"]) == expected


def test_teacher_flops_from_its_checkpoint_config(tmp_path):
    # Counted on the model LitGPT builds from the checkpoint's config, against memory.py's count by formula.
    from litgpt.config import Config
    from litgpt.utils import save_config

    from litgpt_vocagnolm.data.dry_run import teacher_flops_per_token
    from litgpt_vocagnolm.planning.memory import matmul_parameters

    config = Config.from_name("Qwen2.5-Math-7B")
    save_config(config, tmp_path)
    assert teacher_flops_per_token(tmp_path) == 2 * matmul_parameters(config) == 2 * 7_070_285_824
