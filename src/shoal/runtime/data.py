"""Token batches for training: uniform random ids, or windows of a local token file.

A token file is a flat binary of uint16 or uint32 ids (what common preprocessors write), read by
memory map, so a worker reads only the windows of its batches; its dtype comes from
``--data-dtype`` or a sidecar ``FILE.json`` (``{"dtype": "uint16"}``). A parquet, arrow or JSONL
file of text is tokenised once, by the launcher, with a local ``tokenizer.json`` (the
``tokenizers`` library) into such a file; documents are joined with the end-of-text token when
the tokenizer has one.

Sampling depends on (seed, step, sample index) only, never on the plan, so a re-plan or a resume
under another plan sees the same data: with ``shuffle``, sample i of step k starts at the i-th
offset drawn by a generator seeded by (seed, k); without, step k's global batch is the file's
consecutive windows of seq + 1 tokens k*gbs ... (k+1)*gbs - 1 (from the start again once the
file is used up).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shoal.errors import SpecError

DTYPES = ("uint16", "uint32")
TEXT_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json")
EOT_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]")


@dataclass(frozen=True)
class RandomTokens:
    """Uniform ids from a generator seeded by (seed, step): data without a data set."""

    vocab: int
    seed: int = 0

    def batch(self, step: int, global_batch: int, seq: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, self.vocab, (global_batch, seq + 1), generator=gen)


@dataclass(frozen=True)
class TokenFile:
    """Windows of a flat binary of token ids."""

    path: str
    dtype: str
    shuffle: bool = True
    seed: int = 0

    def _tokens(self) -> np.ndarray:
        return np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r")

    def batch(self, step: int, global_batch: int, seq: int) -> torch.Tensor:
        ids = self._tokens()
        n = len(ids)
        if n < seq + 1:
            raise SpecError(f"{n} tokens, fewer than one sample of {seq + 1}", file=self.path,
                            field="--data")
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
            starts = torch.randint(0, n - seq, (global_batch,), generator=gen).tolist()
        else:
            windows = n // (seq + 1)
            starts = [((step * global_batch + i) % windows) * (seq + 1)
                      for i in range(global_batch)]
        rows = np.stack([np.asarray(ids[s:s + seq + 1], dtype=np.int64) for s in starts])
        return torch.from_numpy(rows)


def file_dtype(path: Path, given: str | None) -> str:
    """The ids' dtype: the flag's, else the sidecar's (``FILE.json`` or ``FILE`` without its
    suffix ``.json``)."""
    if given is not None:
        if given not in DTYPES:
            raise SpecError("not a token id type", field="--data-dtype", value=given,
                            allowed=", ".join(DTYPES))
        return given
    for side in (path.with_name(path.name + ".json"), path.with_suffix(".json")):
        if side.is_file() and side != path:
            try:
                dtype = json.loads(side.read_text()).get("dtype")
            except (ValueError, AttributeError):
                raise SpecError("not a JSON object", file=str(side)) from None
            if dtype not in DTYPES:
                raise SpecError("not a token id type", file=str(side), field="dtype", value=dtype,
                                allowed=", ".join(DTYPES))
            return dtype
    raise SpecError("the token ids' type is not known", file=str(path), field="--data-dtype",
                    allowed="--data-dtype uint16 or uint32, or a sidecar FILE.json with "
                            '{"dtype": "uint16"}')


def check_ids(path: Path, dtype: str, vocab: int) -> int:
    """The number of ids in the file, after checking every one is below the vocabulary."""
    ids = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    if len(ids) == 0:
        raise SpecError("holds no token", file=str(path), field="--data")
    top = int(ids.max())
    if top >= vocab:
        raise SpecError(f"a token id ({top}) past the model's vocabulary of {vocab}",
                        file=str(path), field="--data", allowed=f"ids below {vocab}")
    return len(ids)


def read_texts(path: Path, column: str) -> list[str]:
    """The text column of a parquet, arrow or JSONL file."""
    if path.suffix in (".jsonl", ".json"):
        out = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    raise SpecError("not a JSON object per line", file=str(path),
                                    field=f"line {n}") from None
                if not isinstance(row, dict) or not isinstance(row.get(column), str):
                    raise SpecError("no text in the column", file=str(path),
                                    field=f"line {n}.{column}", allowed="--text-column NAME")
                out.append(row[column])
        return out
    import pyarrow as pa  # only text data sets need pyarrow
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        table = pq.read_table(path, columns=[column]) if column in pq.read_schema(path).names \
            else None
    else:
        with pa.memory_map(str(path)) as src:
            try:
                table = pa.ipc.open_file(src).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_stream(src).read_all()
    if table is None or column not in table.column_names:
        raise SpecError("no such column", file=str(path), field=column,
                        allowed="--text-column NAME")
    return [str(x) for x in table.column(column).to_pylist() if x is not None]


def tokenize(path: Path, tokenizer: Path, column: str, out: Path, vocab: int) -> Path:
    """Tokenise a text file into a flat uint32 token file at ``out`` (with its sidecar)."""
    from tokenizers import Tokenizer  # only text data sets need tokenizers

    if not tokenizer.is_file():
        raise SpecError("tokenizer not found", file=str(tokenizer), field="--tokenizer")
    tok = Tokenizer.from_file(str(tokenizer))
    eot = next((tok.token_to_id(t) for t in EOT_NAMES if tok.token_to_id(t) is not None), None)
    ids: list[int] = []
    for enc in tok.encode_batch(read_texts(path, column)):
        ids += enc.ids
        if eot is not None:
            ids.append(eot)
    arr = np.asarray(ids, dtype=np.uint32)
    arr.tofile(out)
    (out.parent / (out.name + ".json")).write_text(json.dumps({"dtype": "uint32"}))
    check_ids(out, "uint32", vocab)
    return out
