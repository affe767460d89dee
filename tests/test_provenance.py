"""provenance: the data fingerprint's invariances and sensitivity, the commit of a real git checkout."""

import os
import subprocess

import numpy as np
import pytest

from fedpsa_jax import provenance


def _data(seed=0, n_train=40, n_test=10):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n_train + n_test, 4, 4, 1)).astype(np.float32)
  y = rng.integers(0, 10, n_train + n_test).astype(np.int32)
  return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def test_fingerprint_ignores_order_and_the_train_test_split():
  x_tr, y_tr, x_te, y_te = _data()
  base = provenance.data_fingerprint(x_tr, y_tr, x_te, y_te)
  perm = np.random.default_rng(1).permutation(len(y_tr))
  assert provenance.data_fingerprint(x_tr[perm], y_tr[perm], x_te, y_te) == base
  # Another holdout of the same examples (a different seed's split of mnist_5k).
  x_all, y_all = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
  assert provenance.data_fingerprint(x_all[10:], y_all[10:], x_all[:10], y_all[:10]) == base


@pytest.mark.parametrize("change", ["pixel", "label", "drop"])
def test_fingerprint_changes_with_any_example(change):
  x_tr, y_tr, x_te, y_te = _data()
  base = provenance.data_fingerprint(x_tr, y_tr, x_te, y_te)
  x_tr, y_tr = x_tr.copy(), y_tr.copy()
  if change == "pixel":
    x_tr[3, 1, 2, 0] = np.nextafter(x_tr[3, 1, 2, 0], np.float32(np.inf))  # the smallest change a float allows
  elif change == "label":
    y_tr[3] = (y_tr[3] + 1) % 10
  else:
    x_tr, y_tr = x_tr[1:], y_tr[1:]
  assert provenance.data_fingerprint(x_tr, y_tr, x_te, y_te) != base


def _git(repo, *args):
  return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_code_version_of_a_checkout_and_of_a_plain_folder(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "module.py").write_text("x = 1\n")
  _git(repo, "add", "module.py")
  _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
  monkeypatch.setattr(provenance, "PACKAGE_DIR", str(repo))
  assert provenance.code_version() == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}
  (repo / "module.py").write_text("x = 2\n")
  assert provenance.code_version()["dirty"] is True
  (repo / "untracked.py").write_text("")  # (untracked files are not the code a run imports)
  (repo / "module.py").write_text("x = 1\n")
  assert provenance.code_version()["dirty"] is False
  plain = tmp_path / "plain"
  plain.mkdir()
  monkeypatch.setattr(provenance, "PACKAGE_DIR", str(plain))
  assert provenance.code_version() == {"commit": None, "dirty": None}


def test_machine_names_the_backend_and_the_versions():
  import jax

  m = provenance.machine()
  assert m["backend"] == jax.default_backend() and m["jax"] == jax.__version__
  assert m["vector_isa"] == provenance.vector_isa() and m["xla_flags"] == os.environ.get("XLA_FLAGS")
  assert m["devices"].startswith(f"{len(jax.devices())} × ")


@pytest.mark.parametrize("lines, expected", [
    (["processor\t: 0", "flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw"], "AVX-512"),
    (["processor\t: 0", "flags\t\t: fpu sse4_2 avx avx2 fma", "processor\t: 1", "flags\t\t: fpu avx512f"], "AVX2"),
    (["processor\t: 0", "Features\t: fp asimd evtstrm aes sve sve2"], "SVE2"),  # Arm
    (["processor\t: 0", "Features\t: fp asimd evtstrm"], "NEON"),
    (["processor\t: 0", "flags\t\t: fpu vme"], None),  # none of the known extensions
    (["processor\t: 0", "model name\t: avx2 in its name only"], None),  # no flags line
])
def test_vector_isa_is_the_widest_extension_of_the_first_cpus_flags(tmp_path, lines, expected):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("\n".join(lines) + "\n")
  assert provenance.vector_isa(str(cpuinfo)) == expected


def test_vector_isa_of_a_machine_without_cpuinfo_is_unknown(tmp_path):
  assert provenance.vector_isa(str(tmp_path / "missing")) is None
