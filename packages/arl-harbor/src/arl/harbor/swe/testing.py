"""A tiny local package with its own tests, for exercising the SWE builder without any download.

`write_tiny_package(root)` writes `tinycalc` (a flat package, tests in tests/) under `root` and returns
its PackageSpec; its functions are rich enough for every function-level operator to apply.
"""

from __future__ import annotations

from pathlib import Path

from arl.harbor.swe.packages import PackageSpec

TINY_SOURCE = '''"""tinycalc: a few small functions with tests."""


def clamp(x, lo, hi):
    if lo > hi:
        raise ValueError("lo > hi")
    if x < lo:
        return lo
    elif x > hi:
        return hi
    else:
        return x


def weighted_total(xs, k):
    total = 0
    count = 0
    for x in xs:
        if x > k and x != 0:
            total += x * 2 - 1
        else:
            total -= 1
        count = count + 1
    try:
        mean = total / count
    except ZeroDivisionError:
        mean = 0
    return total + mean


def digits(n):
    out = []
    n = abs(n)
    while n >= 10:
        out.append(n % 10)
        n = n // 10
    out.append(n)
    if len(out) > 1:
        out.reverse()
    return out


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, n=1):
        if n < 0:
            raise ValueError("negative")
        if key in self.counts:
            self.counts[key] = self.counts[key] + n
        else:
            self.counts[key] = n
        return self.counts[key]
'''

TINY_TESTS = '''import pytest

from tinycalc import Counter, clamp, digits, weighted_total


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(30, 0, 10) == 10


def test_clamp_bad_range():
    with pytest.raises(ValueError):
        clamp(1, 5, 0)


def test_weighted_total():
    assert weighted_total([1, 5, 7], 4) == 28


def test_weighted_total_empty():
    assert weighted_total([], 4) == 0


@pytest.mark.parametrize("n,expected", [(0, [0]), (7, [7]), (1234, [1, 2, 3, 4]), (-56, [5, 6])])
def test_digits(n, expected):
    assert digits(n) == expected


def test_counter():
    c = Counter()
    assert c.add("a") == 1
    assert c.add("a", 2) == 3
    assert c.add("b") == 1


def test_counter_negative():
    with pytest.raises(ValueError):
        Counter().add("a", -1)
'''


def write_tiny_package(root: Path) -> PackageSpec:
    """Write the tinycalc package under `root` (created); returns its spec."""
    (root / "tinycalc").mkdir(parents=True, exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    (root / "tinycalc" / "__init__.py").write_text(TINY_SOURCE)
    (root / "tests" / "test_tinycalc.py").write_text(TINY_TESTS)
    (root / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tinycalc\nVersion: 0.0.1\n")
    return PackageSpec("tinycalc", "0.0.1")
