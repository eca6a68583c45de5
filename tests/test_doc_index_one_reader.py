"""A corpus's doc_lengths.npy has one reader, minilmd/doc_index.py (int32 as prepare writes it, the header checked
against meta.json's count, nothing beyond those documents read): nothing else in the product parses a .npy file.
Before (house9 item 11), `prepare --append` read the old index with np.load, whole, any dtype widened to int32."""
from __future__ import annotations

import ast

import audit_calls
import source_tree

LOADERS = {"numpy.load", "numpy.lib.format.read_array", "numpy.lib.format.open_memmap"}


def _npy_reads(tree: ast.Module) -> list[int]:
    names = audit_calls.qualified_names(tree)
    names.setdefault("np", "numpy")
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and audit_calls.dotted(node.func, names) in LOADERS]


def test_no_module_but_doc_index_parses_a_npy_file():
    found = [f"{source_tree.relative(path)}:{line}" for path in source_tree.code_files()
             if path.name != "doc_index.py" for line in _npy_reads(source_tree.tree(path))]
    assert not found, "doc_lengths.npy is read through minilmd/doc_index.py only:\n" + "\n".join(found)


def test_the_scan_sees_np_load():
    tree = ast.parse("import numpy as np\nfrom numpy import load\nnp.load(f)\nload(g)\nnp.save(f, a)\nnp.fromfile(k)\n")
    assert _npy_reads(tree) == [3, 4]
