"""Pool configs that engines hand hostpool through an environment variable.

``HOSTPOOL_SGLANG`` and ``HOSTPOOL_LMCACHE`` hold a pool config: a TOML or
JSON file's path, or the config itself inline (TOML, or JSON when it starts
with ``{``). :func:`load` reads one into a dict of config keys, checked as
``Pool.from_config`` checks a file.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from typing import Any

import hostpool

__all__ = ["load", "from_env", "for_plugin", "with_gpu_device"]

# As the CLI's --config: a config is small.
_MAX_BYTES = 1 << 20


def load(source: str | os.PathLike[str] | Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """The pool config ``source`` names or holds, as a dict of its keys.

    ``what`` names the source in errors (``HOSTPOOL_SGLANG``). Raises
    :class:`hostpool.ConfigError` for a file that cannot be read, text that
    is neither TOML nor JSON, or a config :func:`hostpool.check_config`
    refuses.
    """
    if isinstance(source, Mapping):
        config = dict(source)
    else:
        text = os.fspath(source)
        stripped = text.strip()
        if not stripped:
            raise hostpool.ConfigError(
                f"{what} is empty: give a pool config (a TOML or JSON file's path, or inline "
                "TOML or JSON such as 'dir = \"/dev/hugepages\"')"
            )
        if stripped.startswith("{"):
            config = _parse_json(stripped, what)
        elif "\n" not in stripped and "=" not in stripped:
            config = _read_file(stripped, what)
        else:
            config = _parse_toml(stripped, what)
    try:
        hostpool.check_config(config)
    except hostpool.ConfigError as e:
        raise hostpool.ConfigError(f"{what}: {e}") from e
    return config


def from_env(var: str) -> dict[str, Any] | None:
    """:func:`load` of environment variable ``var``; ``None`` when it is unset."""
    value = os.environ.get(var)
    if value is None:
        return None
    return load(value, what=var)


def for_plugin(var: str) -> tuple[dict[str, Any] | None, hostpool.Error | None] | None:
    """What an engine's plugin entry point installs: ``None`` when ``var`` is unset,
    else ``(config, None)`` or, for a config that does not load, ``(None, error)``.

    Never raises: the engines run plugins at start, and one that raises
    either kills every process (vLLM) or is only logged (SGLang); the plugin
    installs the error instead, to be raised at first use.
    """
    if var not in os.environ:
        return None
    try:
        return from_env(var), None
    except hostpool.Error as e:
        return None, e
    except Exception as e:  # never raise into the engine
        return None, hostpool.ConfigError(f"{var}: {e}")


def with_gpu_device(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``[cuda] device`` set to the GPU this process drives
    (``torch.cuda.current_device()``) when it places the pool by its GPU
    (``numa_node = "gpu"``) and names no device: an engine's rank sets its
    device before it allocates its KV cache, so each rank's shard goes to its
    own GPU's NUMA node. Unchanged where CUDA is not initialized.
    """
    config = dict(config)
    if config.get("numa_node") != "gpu":
        return config
    cuda = dict(config.get("cuda") or {})
    if "device" in cuda:
        return config
    try:
        import torch
    except ImportError:
        return config
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return config
    cuda["device"] = int(torch.cuda.current_device())
    config["cuda"] = cuda
    return config


def _read_file(path: str, what: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except OSError as e:
        raise hostpool.ConfigError(
            f"{what} names the config file {path!r}, which cannot be read ({e.strerror or e}); "
            "give an existing TOML or JSON file, or the config inline"
        ) from e
    if len(data) > _MAX_BYTES:
        raise hostpool.ConfigError(f"{what}: the config file {path!r} is larger than 1 MiB")
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise hostpool.ConfigError(f"{what}: the config file {path!r} is not UTF-8") from e
    if path.endswith(".json") or text.lstrip().startswith("{"):
        return _parse_json(text, f"{what} ({path})")
    return _parse_toml(text, f"{what} ({path})")


def _parse_json(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise hostpool.ConfigError(f"{what} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise hostpool.ConfigError(f"{what} must be a JSON object of pool config keys")
    return value


def _parse_toml(text: str, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise hostpool.ConfigError(
            f"{what} is neither a file's path nor valid TOML ({e}); JSON must start with '{{'"
        ) from e
