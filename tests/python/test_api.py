"""The package's public names: each documented, each in the type stubs."""

from __future__ import annotations

import ast
import pathlib

import pytest

import hostpool
import hostpool._hostpool as ext

STUBS = pathlib.Path(hostpool.__file__).with_name("_hostpool.pyi")


def _stub_names() -> dict[str, set[str]]:
    tree = ast.parse(STUBS.read_text())
    names: dict[str, set[str]] = {"": set()}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                n.name if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) else n.target.id
                for n in node.body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
            }
            names[""].add(node.name)
        elif isinstance(node, ast.FunctionDef):
            names[""].add(node.name)
        elif isinstance(node, (ast.AnnAssign, ast.Assign)):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            names[""].update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_every_public_name_of_the_extension_is_in_the_stubs():
    stubs = _stub_names()
    public = {n for n in dir(ext) if not n.startswith("_")} | {"__version__"}
    assert public <= stubs[""], public - stubs[""]
    for cls in (ext.Pool, ext.Shared):
        members = {n for n in dir(cls) if not n.startswith("_")}
        assert members <= stubs[cls.__name__], (cls.__name__, members - stubs[cls.__name__])


def test_every_public_name_has_a_docstring():
    for name in hostpool.__all__:
        obj = getattr(hostpool, name)
        if name != "__version__":
            assert (obj.__doc__ or "").strip(), name
    for cls in (hostpool.Pool, hostpool.Shared):
        for member in (n for n in dir(cls) if not n.startswith("_")):
            assert (getattr(cls, member).__doc__ or "").strip(), f"{cls.__name__}.{member}"


def test_the_exceptions_form_the_documented_hierarchy():
    assert issubclass(hostpool.Error, RuntimeError)
    assert issubclass(hostpool.ConfigError, ValueError)
    for cls in (hostpool.ConfigError, hostpool.CapacityError, hostpool.PeerError,
                hostpool.NotAvailableError, hostpool.PinError, hostpool.PoolBusyError, hostpool.KeeperError):
        assert issubclass(cls, hostpool.Error), cls


def test_check_config_plans_without_building_and_names_what_is_wrong(tmp_path):
    assert hostpool.check_config({"size": "64GiB", "threads": 2, "pin": {"kind": "cuda"}}) is None
    path = tmp_path / "pool.toml"
    path.write_text('size = "1GiB"\nprefault = "touch"\n')
    assert hostpool.check_config(path) is None
    for bad, word in (({"treads": 2}, "treads"), ({"backing": "nonesuch"}, "nonesuch"),
                      ({"size": "384G"}, "384G"), ({"block_size": 0}, "block_size")):
        try:
            hostpool.check_config(bad)
        except hostpool.ConfigError as e:
            assert word in str(e), (bad, str(e))
        else:
            raise AssertionError(f"{bad} was accepted")


def test_engine_version_error_names_the_engine_version_missing_names_and_tested_versions():
    import pickle

    from hostpool import _engines

    with pytest.raises(hostpool.EngineVersionError) as raised:
        _engines.require("vllm", "0.99.0", ["vllm.x.B", "vllm.x.A", "vllm.x.A"])
    e = raised.value
    assert isinstance(e, hostpool.Error) and e.exit_code == 1
    assert (e.engine, e.version, e.missing, e.tested) == ("vllm", "0.99.0", ("vllm.x.A", "vllm.x.B"), _engines.TESTED["vllm"])
    text = str(e)
    assert "vllm 0.99.0" in text and "vllm.x.A, vllm.x.B" in text and all(v in text for v in e.tested)
    assert f"pip install vllm=={e.tested[0]}" in text
    again = pickle.loads(pickle.dumps(e))
    assert (again.engine, again.missing, str(again)) == (e.engine, e.missing, text)
    _engines.require("vllm", "0.34.0", [])  # nothing missing: no error


def test_the_tested_versions_are_judged_without_a_local_build_suffix():
    from hostpool import _engines

    assert _engines.is_tested("vllm", "0.34.0") and _engines.is_tested("vllm", "0.34.0+cu128")
    assert not _engines.is_tested("vllm", "0.32.0") and not _engines.is_tested("vllm", None)
    assert set(_engines.TESTED) == set(_engines.DISTRIBUTIONS) == {"vllm", "sglang", "lmcache", "mooncake"}
