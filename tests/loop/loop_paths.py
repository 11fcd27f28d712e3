"""Paths the loop tests share (a module of its own: `from conftest import` resolves to whichever
test folder's conftest was imported first when several folders run together)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DENSE_ENV = HERE / "data" / "tiny_arith_dense.yaml"
