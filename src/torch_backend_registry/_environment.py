"""How an environment variable that is a switch is read: the words that turn it off."""

from __future__ import annotations

#: What turns a switch off (unset, empty, or these words in any case); any other value
#: turns it on, as ``1``, ``true``, ``yes`` and ``on`` do.
OFF = ("", "0", "false", "no", "off")


def switched_on(value: str | None) -> bool:
    """Whether ``value`` (a variable's, ``None`` where unset) turns its switch on."""
    return (value or "").strip().lower() not in OFF
