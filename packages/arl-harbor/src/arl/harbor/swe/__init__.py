"""SWE task sets from real repositories: SWE-smith-style bugs in the sdists of pure-Python packages.

`python -m arl.harbor.swe build --out <set>` fetches pinned sdists from PyPI (`sources`), prepares a
test venv per package with the Debian Python the task image uses (`venvs`), breaks functions with
SWE-smith's procedural modifiers (`mutate`), keeps a bug only when some of the package's own tests turn
from pass to fail and the rest keep passing (`validate`), writes the issue text from the failing tests'
output (`issue`) and one Harbor task dir per bug (`writer`). `verify` re-checks a built set on the host
(oracle → 1.0, untouched → 0.0, tests edited → not 1.0). See the README's "SWE task sets" section.
"""
