"""Linux fallback confinement when bubblewrap cannot run: Landlock (through the `landlock`
binding) limits writes to the given folders; it cannot cut the network, so the caller
uses it only when the network was allowed explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

try:
    import landlock
except ImportError:  # optional: only the fallback needs it
    landlock = None


def available() -> bool:
    """True when the binding is installed and the kernel has Landlock enabled."""
    if landlock is None:
        return False
    try:
        return landlock.landlock_abi_version() >= 1
    except (OSError, landlock.LandlockError):
        return False


def write_rights():
    """Every access right that changes the file system; reading and executing stay open."""
    fs = landlock.FSAccess
    return fs.all() & ~(fs.EXECUTE | fs.READ_FILE | fs.READ_DIR)


def restrictor(writable: list[Path]) -> Callable[[], None]:
    """A preexec function: after it runs, the process (and its children) can write only
    beneath `writable` (plus /dev for /dev/null and terminals)."""
    rights = write_rights()
    paths = [str(p) for p in writable if p.exists()] + ["/dev"]

    def apply() -> None:
        ruleset = landlock.Ruleset(restrict_rules=rights)
        ruleset.allow(*paths, rules=rights)
        ruleset.apply()

    return apply
