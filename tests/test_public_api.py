"""The public surface is exactly ``__all__``: one sorted list, every name in it exists, and
everything else the package holds is private (its modules start with ``_``, as httpx's do)."""

import json
import subprocess
import sys

import suffice


def test_all_is_sorted_and_complete():
    assert suffice.__all__ == sorted(suffice.__all__)
    for name in suffice.__all__:
        assert hasattr(suffice, name), name


def test_the_package_namespace_holds_nothing_public_beyond_all():
    # A fresh interpreter: what ``import suffice`` alone puts in the namespace.
    code = "import json, suffice; print(json.dumps(sorted(vars(suffice))))"
    names = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout)
    public = [n for n in names if not n.startswith("_") or n == "__version__"]
    assert public == sorted(suffice.__all__)


def test_every_error_derives_from_the_base():
    for name in suffice.__all__:
        obj = getattr(suffice, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, suffice.SufficeError)


def test_bad_arguments_are_also_value_errors():
    assert issubclass(suffice.InvalidItemError, ValueError)
    assert issubclass(suffice.InvalidQueryError, ValueError)
    assert issubclass(suffice.BudgetError, ValueError)
