"""Real data and real weights in ``shoal train``: token files read by memory map, text tokenised
with a local tokenizer.json, sampling by (seed, step, sample index) only, the first step's loss
equal to transformers' on the file's first windows, bf16 autocast on the CPU, and a worker's
memory holding only its layers."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shoal.catalog import TINY  # noqa: E402
from shoal.errors import SpecError  # noqa: E402
from shoal.runtime.data import TokenFile, check_ids, file_dtype, tokenize  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402

SEQ = 8


def token_file(path, n=1000, dtype="uint16", vocab=256, seed=0):
    ids = np.random.default_rng(seed).integers(0, vocab, n).astype(dtype)
    ids.tofile(path)
    return ids


def test_consecutive_windows_without_shuffle(tmp_path):
    ids = token_file(tmp_path / "t.bin")
    f = TokenFile(str(tmp_path / "t.bin"), "uint16", shuffle=False)
    gb, w = 4, SEQ + 1
    for step in (0, 1, 5):
        b = f.batch(step, gb, SEQ).numpy()
        for i in range(gb):
            k = (step * gb + i) % (len(ids) // w)
            assert (b[i] == ids[k * w:(k + 1) * w]).all()


def test_shuffled_samples_depend_on_seed_step_and_index_only(tmp_path):
    token_file(tmp_path / "t.bin")
    f = TokenFile(str(tmp_path / "t.bin"), "uint16", shuffle=True, seed=3)
    assert torch.equal(f.batch(2, 8, SEQ)[:4], f.batch(2, 4, SEQ))  # sample i is sample i
    assert torch.equal(f.batch(2, 4, SEQ), f.batch(2, 4, SEQ))
    assert not torch.equal(f.batch(2, 4, SEQ), f.batch(3, 4, SEQ))
    other = TokenFile(str(tmp_path / "t.bin"), "uint16", shuffle=True, seed=4)
    assert not torch.equal(f.batch(2, 4, SEQ), other.batch(2, 4, SEQ))


def test_the_id_type_comes_from_the_flag_or_a_sidecar_and_ids_are_checked(tmp_path):
    p = tmp_path / "t.bin"
    token_file(p, dtype="uint32", vocab=300)
    with pytest.raises(SpecError, match="type is not known"):
        file_dtype(p, None)
    (tmp_path / "t.bin.json").write_text(json.dumps({"dtype": "uint32"}))
    assert file_dtype(p, None) == "uint32"
    assert file_dtype(p, "uint16") == "uint16"
    with pytest.raises(SpecError, match="not a token id type"):
        file_dtype(p, "int8")
    with pytest.raises(SpecError, match="past the model's vocabulary of 256") as e:
        check_ids(p, "uint32", 256)
    assert str(p) in str(e.value)


def _tokenizer(tmp_path, texts):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(
        special_tokens=["[UNK]", "<|endoftext|>"]))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path, tok


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_text_is_tokenised_with_a_local_tokenizer(kind, tmp_path):
    texts = ["the cat sat on the mat", "a dog ran far", "the end"]
    path, tok = _tokenizer(tmp_path, texts)
    data = tmp_path / f"d.{kind}"
    if kind == "jsonl":
        data.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    else:
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"body": texts}), data)
    out = tokenize(data, path, "body", tmp_path / "tok.bin", 256)
    eot = tok.token_to_id("<|endoftext|>")
    want = sum(([*tok.encode(t).ids, eot] for t in texts), [])
    assert np.fromfile(out, dtype=np.uint32).tolist() == want
    with pytest.raises(SpecError, match="column"):
        tokenize(data, path, "text", tmp_path / "x.bin", 256)


def _plan(gb=4, n_layers=5):
    return TrainingPlan.model_validate({"microbatch_size": 1, "stages": [
        {"layers": [0, 2], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": gb}]},
        {"layers": [2, n_layers], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": m} for m in (3, gb - 3)]}]})


def test_step_one_loss_equals_transformers_on_the_first_windows(tmp_path):
    """``shoal train --model FOLDER --data tokens.bin --shuffle off``: step 1's loss is
    transformers' loss of that model on windows 0 .. gbs-1 of the file."""
    T = pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from shoal.cli import app

    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                        max_position_embeddings=64)
    torch.manual_seed(0)
    m = T.LlamaForCausalLM(cfg).eval()
    m.save_pretrained(tmp_path / "model")
    ids = token_file(tmp_path / "tokens.bin", n=500)
    (tmp_path / "plan.json").write_text(_plan().model_dump_json(by_alias=True))
    r = CliRunner().invoke(app, ["train", str(tmp_path / "plan.json"), "--model",
                                 str(tmp_path / "model"), "--data", str(tmp_path / "tokens.bin"),
                                 "--data-dtype", "uint16", "--shuffle", "off", "--steps", "2",
                                 "--seq", str(SEQ), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    windows = torch.from_numpy(ids[:4 * (SEQ + 1)].astype(np.int64)).view(4, SEQ + 1)
    with torch.no_grad():
        ref = float(m(windows, labels=windows).loss)
    assert doc["losses"][0] == pytest.approx(ref, rel=1e-4)
    assert doc["predicted"]["iteration_time_s"] > 0 and doc["mfu"] > 0
    assert len(doc["mfus"]) == 2 and doc["measured_over_predicted"] > 0


def test_bf16_autocast_trains_on_the_cpu():
    """The CPU runs the autocast path: the losses follow float32's closely, not exactly."""
    from shoal.runtime.train import reference, spawn

    plan = _plan(n_layers=6)
    res = spawn(plan, TINY, 2, 16, dtype=torch.float32, autocast="bf16")
    ref, _ = reference(TINY, plan, 2, 16, dtype=torch.float32)
    got = res[0]["losses"]
    assert got == pytest.approx(ref, rel=2e-2) and got != pytest.approx(ref, rel=1e-7)


MEMORY = r"""
import sys, torch
from shoal.runtime.hf.config import arch_from_hf
from shoal.runtime.model import Stage

def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

arch = arch_from_hf(sys.argv[1])
a, b = int(sys.argv[2]), int(sys.argv[3])
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) starts again from now
before = kb("VmRSS")
st = Stage(arch, a, b, dtype=torch.float32)
with torch.no_grad():  # every parameter read, as a step reads them (the files are mapped lazily)
    sum(float(p.sum()) for p in st.parameters())
print((kb("VmHWM") - before) * 1024, sum(p.numel() for p in st.parameters()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_worker_reads_only_its_layers(tmp_path):
    """A worker holding a quarter of the blocks of a safetensors model (sharded in several
    files) peaks below 40% of the model's size in resident memory (measured over what the
    process held before it built its stage)."""
    T = pytest.importorskip("transformers")
    cfg = T.LlamaConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=16,
                        num_attention_heads=6, num_key_value_heads=6, vocab_size=8000)
    T.LlamaForCausalLM(cfg).save_pretrained(tmp_path, max_shard_size="40MB")
    size = sum(f.stat().st_size for f in tmp_path.glob("*.safetensors"))
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    out = subprocess.run([sys.executable, "-c", MEMORY, str(tmp_path), "5", "9"],
                         capture_output=True, text=True, check=True)
    grew, params = map(int, out.stdout.split())
    assert params * 4 < 0.25 * size  # four of sixteen blocks
    assert params * 4 <= grew < 0.4 * size, (grew, size)  # it holds them, and not much more


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_the_cuda_path_trains_as_one_process_in_bf16(tmp_path):
    """NCCL, bf16 autocast and CUDA-event timing: a 2-stage plan through the CLI on two GPUs
    follows one process's float32 losses to bf16 precision."""
    from typer.testing import CliRunner

    from shoal.cli import app
    from shoal.runtime.train import reference

    plan = TrainingPlan.model_validate({"microbatch_size": 1, "stages": [
        {"layers": [0, 3], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": 4}]},
        {"layers": [3, 6], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": 4}]}]})
    (tmp_path / "plan.json").write_text(plan.model_dump_json(by_alias=True))
    r = CliRunner().invoke(app, ["train", str(tmp_path / "plan.json"), "--model", "tiny",
                                 "--steps", "3", "--seq", "16", "--device", "cuda",
                                 "--precision", "bf16", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["backend"] == "nccl" and doc["step_time_s"] > 0
    ref, _ = reference(TINY, plan, 3, 16, dtype=torch.float32)
    assert doc["losses"] == pytest.approx(ref, rel=2e-2)
