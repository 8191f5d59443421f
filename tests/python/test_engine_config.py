"""The pool configs engines pass in HOSTPOOL_SGLANG / HOSTPOOL_LMCACHE
(hostpool._engine_config): a file's path, inline TOML or JSON; every bad one
is a ConfigError naming the variable."""

from __future__ import annotations

import pytest

import hostpool
from hostpool import _engine_config


def test_a_path_inline_toml_and_inline_json_give_the_same_config(tmp_path):
    toml = tmp_path / "pool.toml"
    toml.write_text('threads = 2\npin = { kind = "cuda" }\n')
    js = tmp_path / "pool.json"
    js.write_text('{"threads": 2, "pin": {"kind": "cuda"}}')
    want = {"threads": 2, "pin": {"kind": "cuda"}}
    assert _engine_config.load(str(toml), what="V") == want
    assert _engine_config.load(str(js), what="V") == want
    assert _engine_config.load('threads = 2\npin = { kind = "cuda" }', what="V") == want
    assert _engine_config.load('  {"threads": 2, "pin": {"kind": "cuda"}}', what="V") == want
    assert _engine_config.load({"threads": 2}, what="V") == {"threads": 2}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", ["V is empty"]),
        ("   ", ["V is empty"]),
        ("/nonexistent/pool.toml", ["V", "/nonexistent/pool.toml", "cannot be read"]),
        ("/", ["V", "cannot be read"]),  # a directory
        ("threads = = 2", ["V", "neither a file's path nor valid TOML"]),
        ('{"threads": 2', ["V", "not valid JSON"]),
        ("[1, 2]\n", ["V"]),
        ("treads = 2", ["V", "treads"]),
        ('size = "384G"', ["V", "384G"]),
        ('backing = "nonesuch"', ["V", "nonesuch"]),
    ],
)
def test_a_bad_config_is_a_config_error_naming_the_variable(value, words):
    with pytest.raises(hostpool.ConfigError) as e:
        _engine_config.load(value, what="V")
    for word in words:
        assert word in str(e.value), (value, str(e.value))


def test_a_file_larger_than_a_config_is_refused(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * (300 << 10))
    with pytest.raises(hostpool.ConfigError, match="larger than 1 MiB"):
        _engine_config.load(str(big), what="V")


def test_dev_zero_is_read_up_to_the_limit_not_forever():
    with pytest.raises(hostpool.ConfigError, match="larger than 1 MiB"):
        _engine_config.load("/dev/zero", what="V")


def test_from_env_is_none_when_unset(monkeypatch):
    monkeypatch.delenv("HOSTPOOL_X_TEST", raising=False)
    assert _engine_config.from_env("HOSTPOOL_X_TEST") is None
    monkeypatch.setenv("HOSTPOOL_X_TEST", "threads = 1")
    assert _engine_config.from_env("HOSTPOOL_X_TEST") == {"threads": 1}


def test_numa_node_gpu_takes_the_device_this_process_drives(monkeypatch):
    """An engine's rank sets its CUDA device before it allocates its KV cache:
    with numa_node = "gpu" and no [cuda] device of its own, the pool is
    placed by that device. Only torch's GPU platform checks are replaced."""
    import torch

    from hostpool import _engine_config

    assert _engine_config.with_gpu_device({"numa_node": "gpu"}) == {"numa_node": "gpu"}, (
        "without CUDA initialized the config is left as it is"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _engine_config.with_gpu_device({"numa_node": "gpu", "size": 1}) == {
        "numa_node": "gpu",
        "size": 1,
        "cuda": {"device": 3},
    }
    given = {"numa_node": "gpu", "cuda": {"device": 1, "chunk_size": "1GiB"}}
    assert _engine_config.with_gpu_device(given) == given, "a device of the config's own wins"
    assert _engine_config.with_gpu_device({"numa_node": 0}) == {"numa_node": 0}
