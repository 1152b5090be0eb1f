"""The public surface is one sorted ``__all__`` and every name in it exists."""

import suffice


def test_all_is_sorted_and_complete():
    assert suffice.__all__ == sorted(suffice.__all__)
    for name in suffice.__all__:
        assert hasattr(suffice, name), name


def test_every_error_derives_from_the_base():
    for name in suffice.__all__:
        obj = getattr(suffice, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, suffice.SufficeError)
