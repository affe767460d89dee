"""How records are stored: metrics and events compressed (fedpsa_jax/io.py `compress_jsonl`, fedpsa_jax/sweep/records.py
`COMPRESSED_FILES`), losing nothing.

The committed records under results/ were plain JSON-lines files until they were compressed; the SHA-256 of every one
of those plain files is in tests/fixtures/plain_records_sha256.json, so each compressed record must decompress to
exactly the file it was. Compression is deterministic (the same bytes on any machine: a redraw or a re-save never
rewrites a committed record), every reader of `io` reads the compressed form as the plain one, and a damaged
compressed file is one error naming it.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil

import pytest

from fedpsa_jax import io, sweep
from fedpsa_jax.errors import DamagedRunFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "tests", "fixtures", "plain_records_sha256.json")


def test_every_compressed_record_decompresses_to_the_plain_file_it_was():
  manifest = json.load(open(MANIFEST))
  assert len(manifest) == 322  # every metrics and events file of R1, fedpsa_parts, shape_step and horizon
  for path, digest in manifest.items():
    packed = os.path.join(ROOT, path + io.COMPRESSED)
    assert not os.path.exists(os.path.join(ROOT, path)) and os.path.isfile(packed), path
    assert hashlib.sha256(lzma.decompress(open(packed, "rb").read())).hexdigest() == digest, path


def test_compression_is_deterministic_and_read_back_as_the_plain_file(tmp_path):
  record = os.path.join(ROOT, "results", "horizon", "runs", "method=fedpsa,alpha=0.1,seed=0")
  copy = tmp_path / "record"
  shutil.copytree(record, copy)
  packed = open(copy / "events.jsonl.xz", "rb").read()
  compressed_read = io.read_events(copy)
  assert io.decompress_jsonl(str(copy / "events.jsonl")) and not os.path.exists(copy / "events.jsonl.xz")
  plain = (copy / "events.jsonl").read_bytes()
  assert io.read_events(copy) == compressed_read == [json.loads(line) for line in plain.splitlines()]
  assert len(compressed_read) > 3000 and any("kappa" in e for e in compressed_read)
  assert io.compress_jsonl(str(copy / "events.jsonl")) and not os.path.exists(copy / "events.jsonl")
  assert open(copy / "events.jsonl.xz", "rb").read() == packed  # the same bytes as committed
  assert len(packed) < len(plain) / 5


def test_a_link_is_never_compressed_and_nothing_else_is_touched(tmp_path):
  (tmp_path / "target").write_text('{"day": 0, "test_accuracy": 0.1}\n')
  os.symlink(tmp_path / "target", tmp_path / "metrics.jsonl")
  assert not io.compress_jsonl(str(tmp_path / "metrics.jsonl"))
  assert not io.compress_jsonl(str(tmp_path / "absent.jsonl"))
  assert os.path.islink(tmp_path / "metrics.jsonl") and sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "target"]


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_a_damaged_compressed_record_is_one_error_naming_it(damage, tmp_path):
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"day": i, "test_accuracy": 0.1}) + "\n"
                                                  for i in range(500)))
  io.compress_jsonl(str(tmp_path / "metrics.jsonl"))
  packed = tmp_path / "metrics.jsonl.xz"
  data = packed.read_bytes()
  packed.write_bytes(data[:len(data) // 2] if damage == "cut" else b"\x00" * len(data))
  with pytest.raises(DamagedRunFile, match=rf"^{packed} cannot be decompressed \(") as err:
    io.read_metrics(tmp_path)
  assert "\n" not in str(err.value)


def test_compress_records_converts_plain_records_once(tmp_path):
  records = tmp_path / "records"
  shutil.copytree(os.path.join(ROOT, "results", "table1_mnist_5k"), records, ignore=shutil.ignore_patterns("report"))
  for packed in records.glob("runs/*/*.xz"):  # (as an earlier version kept them: plain)
    io.decompress_jsonl(str(packed)[:-len(io.COMPRESSED)])
  runs = len(os.listdir(records / "runs"))
  assert sweep.compress_records(str(records)) == runs  # (R1 kept no events: one metrics file per record)
  assert sweep.compress_records(str(records)) == 0
  assert not list(records.glob("runs/*/*.jsonl")) and len(list(records.glob("runs/*/metrics.jsonl.xz"))) == runs
