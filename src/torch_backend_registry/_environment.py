"""Settings from the environment: how a switch variable is read; the time limits' defaults."""

from __future__ import annotations

#: What turns a switch off (unset, empty, or these words in any case); any other value
#: turns it on, as ``1``, ``true``, ``yes`` and ``on`` do.
OFF = ("", "0", "false", "no", "off")

#: The variable that compares every rank's backends at install() (a switch).
VERIFY_VAR = "TORCH_BACKENDS_VERIFY"
#: Seconds :func:`verify_consistent` waits for every rank to call it.
CLUSTER_TIMEOUT = 60.0
#: Seconds a backend's probe may take before doctor kills it.
DOCTOR_TIMEOUT = 300.0
#: ``fresh``: a ``select = "fastest"`` chain decides again, and remembers anew; ``shipped``:
#: it takes only choices shipped in ``backends.choices``, and times nothing.
SELECT_VAR = "TORCH_BACKENDS_SELECT"
#: Seconds a rank waits for rank 0's choice before it takes the chain's first member.
SELECT_TIMEOUT_VAR = "TORCH_BACKENDS_SELECT_TIMEOUT"
SELECT_TIMEOUT = 600.0
#: A file of PyTorch's compile caches (``tune --compile-cache``) to load before compiling.
COMPILE_CACHE_VAR = "TORCH_BACKENDS_COMPILE_CACHE"
#: Set by ``torch-backends tune`` for the command it runs: the folder each process hands
#: the choices it made to.
TUNING_VAR = "TORCH_BACKENDS_TUNING"
#: The folder in that one where each process leaves PyTorch's compile caches, where tune
#: made it (``--compile-cache``).
COMPILE_CACHE_FOLDER = "compile-cache"


def switched_on(value: str | None) -> bool:
    """Whether ``value`` (a variable's, ``None`` where unset) turns its switch on."""
    return (value or "").strip().lower() not in OFF
