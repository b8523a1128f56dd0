"""The package's public API: every exported name resolves, and importing a submodule loads only what it needs."""

from __future__ import annotations

import subprocess
import sys

import pytest

import proxy


@pytest.mark.parametrize("name", proxy.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(proxy, name) is not None


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError):
        proxy.no_such_name  # noqa: B018


def test_importing_the_config_loads_neither_tiktoken_nor_jinja2() -> None:
    code = "import sys, proxy.config; print('tiktoken' in sys.modules, 'jinja2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
