"""fedpsa_jax/compilation_cache.py: entries a killed writer left are found and removed, on entries made with JAX's
own writer and on JAX's own files (in fresh processes, since JAX reads its cache settings once per process); the
judgement follows JAX's reader, so a JAX whose entry layout changed keeps its whole entries."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import lzma
import textwrap
import time

import pytest
from jax._src import compilation_cache as jax_cache
from jax._src import lru_cache

from fedpsa_jax import compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXECUTABLE = bytes(range(256)) * 8
ENTRY = jax_cache.compress_executable(jax_cache.combine_executable_and_time(EXECUTABLE, 1234))  # as JAX writes one


def _write(path, name, data):
  with open(os.path.join(path, name), "wb") as f:
    f.write(data)


@pytest.mark.parametrize("cut", [0, 1, 2, len(ENTRY) // 2, len(ENTRY) - 4, len(ENTRY) - 1])
def test_a_cut_stream_is_incomplete_and_the_whole_one_is_complete(cut):
  assert compilation_cache.is_complete(ENTRY)
  assert not compilation_cache.is_complete(ENTRY[:cut])  # the last 4 bytes are the checksum: cut too


def test_a_damaged_checksum_or_no_executable_is_incomplete():
  assert not compilation_cache.is_complete(ENTRY[:-1] + bytes([ENTRY[-1] ^ 1]))
  assert not compilation_cache.is_complete(b"not compressed at all")
  assert not compilation_cache.is_complete(jax_cache.compress_executable(b"abc"))  # the compile time alone


def test_a_jax_whose_entry_layout_changed_keeps_its_whole_entries_and_loses_its_cut_ones(tmp_path, monkeypatch):
  """The check used to parse JAX 0.10's layout itself (zlib or zstd, a 4-byte compile time): a JAX that wrote
  another one would have had every entry removed as damaged, at every start."""
  monkeypatch.setattr(jax_cache, "compress_executable", lzma.compress)  # a JAX that compresses otherwise
  monkeypatch.setattr(jax_cache, "decompress_executable", lzma.decompress)
  compilation_cache._jax_entry_reader.cache_clear()
  entry = jax_cache.compress_executable(jax_cache.combine_executable_and_time(EXECUTABLE, 1234))
  _write(tmp_path, "jit_a-1-cache", entry)
  _write(tmp_path, "jit_b-2-cache", entry[:len(entry) // 2])
  try:
    assert compilation_cache.repair(str(tmp_path)) == ["jit_b-2-cache"]
  finally:
    compilation_cache._jax_entry_reader.cache_clear()
  assert os.listdir(tmp_path) == ["jit_a-1-cache"]


def test_a_jax_without_an_entry_reader_has_nothing_removed(tmp_path, monkeypatch, caplog):
  monkeypatch.delattr(jax_cache, "extract_executable_and_time")
  compilation_cache._jax_entry_reader.cache_clear()
  _write(tmp_path, "jit_b-2-cache", ENTRY[:100])
  try:
    assert compilation_cache.repair(str(tmp_path)) == []
  finally:
    compilation_cache._jax_entry_reader.cache_clear()
  assert os.listdir(tmp_path) == ["jit_b-2-cache"] and "no entry reader" in caplog.text


def test_repair_removes_truncated_entries_and_keeps_whole_ones(tmp_path):
  _write(tmp_path, "jit_a-1-cache", ENTRY)
  _write(tmp_path, "jit_b-2-cache", ENTRY[:100])
  _write(tmp_path, "jit_c-3-cache", b"")
  _write(tmp_path, "notes.txt", b"other files are left alone")
  assert compilation_cache.damaged_entries(str(tmp_path)) == ["jit_b-2-cache", "jit_c-3-cache"]
  assert compilation_cache.repair(str(tmp_path)) == ["jit_b-2-cache", "jit_c-3-cache"]
  assert sorted(os.listdir(tmp_path)) == ["jit_a-1-cache", "notes.txt"]
  assert compilation_cache.repair(str(tmp_path)) == []


def test_an_entry_without_its_access_time_is_damaged_only_where_eviction_keeps_them(tmp_path):
  plain, evicting = tmp_path / "plain", tmp_path / "evicting"
  plain.mkdir(), evicting.mkdir()
  _write(plain, "jit_a-1-cache", ENTRY)  # without a size cap JAX writes no -atime at all
  assert compilation_cache.damaged_entries(str(plain)) == []
  for name in ("jit_a-1", "jit_b-2"):
    _write(evicting, name + "-cache", ENTRY)
  _write(evicting, "jit_a-1-atime", (5).to_bytes(8, "little"))
  _write(evicting, "jit_c-3-cache", ENTRY[:10])
  _write(evicting, "jit_c-3-atime", (6).to_bytes(8, "little"))
  assert compilation_cache.repair(str(evicting)) == ["jit_b-2-cache", "jit_c-3-cache"]
  assert sorted(os.listdir(evicting)) == ["jit_a-1-atime", "jit_a-1-cache"]  # c's -atime went with it


def test_repair_of_a_missing_directory_does_nothing(tmp_path):
  assert compilation_cache.repair(str(tmp_path / "none")) == []


_PROGRAM = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from fedpsa_jax import compilation_cache
    path, how, k = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if how == "enable":
      assert compilation_cache.enable(path)
    else:  # JAX's cache as a user would set it, without the repair
      jax.config.update("jax_compilation_cache_dir", path)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    print(float(jax.jit(lambda x: (jnp.sin(x) * k).sum())(jnp.ones(3))))
    from jax._src import compilation_cache as jax_cache
    print("writes through", type(jax_cache._cache.path).__name__, file=sys.stderr)
""")


def _compile(path, how, scale=2.0, max_size=None):
  """A fresh process that compiles and runs one function with the cache in `path`; its stderr."""
  env = {name: v for name, v in os.environ.items() if not name.startswith("JAX_COMPILATION_CACHE")}
  if max_size:
    env["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(max_size)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  done = subprocess.run([sys.executable, "-c", _PROGRAM, str(path), how, str(scale)], env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  return done.stderr


@pytest.mark.slow
def test_jax_warns_on_a_truncated_entry_forever_and_the_repaired_cache_is_whole_again(tmp_path):
  written = _compile(tmp_path, "enable")
  assert "Error" not in written and "writes through WholeWrites" in written  # (JAX's own cache wrote them)
  entries = sorted(n for n in os.listdir(tmp_path) if n.endswith("-cache"))
  assert entries and compilation_cache.damaged_entries(str(tmp_path)) == []
  assert not [n for n in os.listdir(tmp_path) if ".partial-" in n]
  for name in entries:  # as a process killed halfway through writing each would leave them
    with open(tmp_path / name, "r+b") as f:
      f.truncate(os.path.getsize(tmp_path / name) // 2)
  assert compilation_cache.damaged_entries(str(tmp_path)) == entries
  for _ in range(2):  # JAX never rewrites an entry that exists: it warns in every process
    assert "Error reading persistent compilation cache entry" in _compile(tmp_path, "plain")
  assert "Error" not in _compile(tmp_path, "enable")
  assert sorted(n for n in os.listdir(tmp_path) if n.endswith("-cache")) == entries
  assert compilation_cache.damaged_entries(str(tmp_path)) == []
  assert "Error" not in _compile(tmp_path, "plain")  # read back whole


@pytest.mark.slow
def test_with_a_size_cap_an_entry_without_its_access_time_stops_every_write_until_repaired(tmp_path):
  cap = 10**8
  _compile(tmp_path, "plain", 2.0, cap)
  orphan = next(n for n in os.listdir(tmp_path) if n.startswith("jit__lambda") and n.endswith("-atime"))
  os.remove(tmp_path / orphan)  # killed between JAX's two writes
  assert "Error writing persistent compilation cache entry" in _compile(tmp_path, "plain", 3.0, cap)
  assert "Error" not in _compile(tmp_path, "enable", 4.0, cap)
  assert compilation_cache.damaged_entries(str(tmp_path)) == []
  assert len([n for n in os.listdir(tmp_path) if n.startswith("jit__lambda")]) == 2  # k = 4's entry, written


def _partial_files(path) -> list[str]:
  return [n for n in os.listdir(path) if ".partial-" in n]


def test_an_entry_appears_only_whole_renamed_from_its_temporary_file(tmp_path, monkeypatch):
  """What a reader in another process can see: no `KEY-cache` until it is whole (JAX's own `put` writes it in
  place, where a concurrent reader finds it cut and warns)."""
  assert compilation_cache.write_whole_entries()
  cache = lru_cache.LRUCache(str(tmp_path), max_size=10**8)  # (eviction on: KEY-cache, then KEY-atime)
  renamed, real_replace = [], os.replace

  def replace(source, target):
    with open(source, "rb") as f:
      renamed.append((os.path.basename(source), os.path.basename(target), f.read(), os.path.exists(target)))
    real_replace(source, target)

  monkeypatch.setattr(os, "replace", replace)
  cache.put("jit_f-abc", ENTRY)
  assert [(target, existed) for _, target, _, existed in renamed] == [("jit_f-abc-cache", False),
                                                                       ("jit_f-abc-atime", False)]
  assert renamed[0][0].startswith(".jit_f-abc-cache.partial-") and renamed[0][2] == ENTRY
  assert cache.get("jit_f-abc") == ENTRY and compilation_cache.damaged_entries(str(tmp_path)) == []
  assert [target for _, target, _, _ in renamed[2:]] == ["jit_f-abc-atime"]  # (a read renews its access time)
  assert _partial_files(tmp_path) == []
  cache.put("jit_f-abc", ENTRY[:10])  # JAX never rewrites a key that exists
  assert cache.get("jit_f-abc") == ENTRY and "jit_f-abc-cache" not in [target for _, target, _, _ in renamed[2:]]


def test_a_failed_write_leaves_neither_the_entry_nor_its_temporary_file(tmp_path, monkeypatch):
  compilation_cache.write_whole_entries()
  cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)

  def full_disk(source, target):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "replace", full_disk)
  with pytest.raises(OSError, match="No space left"):  # (JAX's compiler warns and runs the program uncached)
    cache.put("jit_f-abc", ENTRY)
  assert os.listdir(tmp_path) == []


def test_repair_removes_temporary_files_of_writers_gone_an_hour_and_keeps_those_being_written(tmp_path):
  _write(tmp_path, "jit_f-abc-cache", ENTRY)
  _write(tmp_path, ".jit_g-abc-cache.partial-11-22", ENTRY[:100])
  _write(tmp_path, ".jit_h-abc-cache.partial-33-44", ENTRY[:100])
  an_hour_ago = time.time() - 3601
  os.utime(tmp_path / ".jit_g-abc-cache.partial-11-22", (an_hour_ago, an_hour_ago))
  assert compilation_cache.repair(str(tmp_path)) == []  # (no entry was damaged)
  assert sorted(os.listdir(tmp_path)) == [".jit_h-abc-cache.partial-33-44", "jit_f-abc-cache"]
