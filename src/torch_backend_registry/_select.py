"""``select = "fastest"``: each graph runs with the fastest member of a chain that verifies.

For each graph the chain is handed, a choice is taken from where it is first found: one
shipped in ``backends.choices`` (what ``torch-backends tune`` decided), else one remembered
in the user's cache folder, else a decision: every available member is compiled and
verified, then timed on one copy of the example inputs (warm-up calls first, then rounds in
which the members take turns), and the fastest is chosen where it is ``min-speedup`` times
faster than the chain's first beyond the spread of the samples. Choices are found by the
portable key of what decides them (``_key``). Where torch.distributed is initialised, rank
0 decides (or takes its remembered choice) and tells the other ranks through the default
group's store; they time nothing, and none waits on a collective. A shipped choice needs no
rank to wait on another.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from . import _store
from ._chain import ChainBackend, Run, logger
from ._definition import BackendDefinition, BackendInfo
from ._environment import SELECT_TIMEOUT, SELECT_TIMEOUT_VAR, SELECT_VAR, TUNING_VAR
from ._key import DECIDING, differences, facts, identity, in_words, key, members
from ._runs import said
from ._sources.cache import Cache
from ._sources.choices import Shipped, shipped_for
from ._timing import choose, spread, timed, timings

#: The cache's kind of entry that holds the choices.
KIND = "choices"
#: The facts of a choice that may differ from one rank to another of one job.
MACHINE = ("threads", "torch", "device", "identity")
#: How many times this process compiled each graph a select chain was handed, by the key
#: its ranks share.
_COMPILES: Counter[str] = Counter()
#: What ``TORCH_BACKENDS_SELECT`` may say: unset, decide afresh, take shipped choices only.
MODES = ("", "fresh", "shipped")


def fastest(chain: ChainBackend, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """What ``chain`` compiles ``gm`` to: the compiled graph of the member chosen for it."""
    run = Run(chain, gm, example_inputs, kwargs)
    environ = chain.context.environ
    mode = environ.get(SELECT_VAR, "").strip().lower()
    if mode not in MODES:
        _once(f"{SELECT_VAR}={mode!r} is none of {', '.join(MODES[1:])}: it is taken as unset")
    unknown: list[str] = []
    decided = facts(chain.definition, chain.info, gm, example_inputs, run.device, kwargs, unknown)
    found = key(decided)
    if unknown:  # remembered under it, the choice would be found by no other process
        _once(
            f"backend {run.name!r}: {run.words}: its choice is not remembered: torch.compile was"
            f" given {', '.join(dict.fromkeys(unknown))}, which no other process writes alike"
        )
    # A graph that holds a collective runs on every rank together: no rank may run it alone
    # (to verify or time it) while another waits on the store for a choice.
    together = collective(gm)
    store = None if together else _store.default_store()
    # What every rank compiling this graph writes alike, whatever machine it runs on (its
    # thread count, PyTorch's build and device model aside), and which of this process's
    # compiles of it this is: the n-th on each rank hears rank 0's n-th.
    shared = key({name: decided[name] for name in DECIDING if name not in MACHINE})
    _COMPILES[shared] += 1
    rank_key = f"torch_backend_registry/select/{shared}/{_COMPILES[shared]}"
    # Rank 0 tells the others what it runs, however it came to it (a rank whose machine
    # differs may find no shipped choice of its own, and waits for it).
    tell = store if store is not None and _store.rank() == 0 else None
    if tell is not None:
        run.tell = functools.partial(tell.set, rank_key)
    shipped = Shipped([]) if mode == "fresh" else shipped_for(chain.definition, chain.context)
    at = shipped.find(found)
    tried: list[str] = []
    if at is not None:
        table, where = at
        chosen = table.get("member")
        # A chain never runs a member it does not list.
        tried = [chosen] if chosen in chain.members else []
        if not tried:
            run.say(
                f"the choice shipped at {where} names {chosen!r}, which the chain does not list:"
                " not used",
                "warning",
            )
        for member, compiled in run.candidates(tried):
            return run.use(member, compiled, f", as shipped ({where})")
    if mode == "shipped" or together:
        if at is None and mode == "shipped":
            _warn_nearest(run, shipped, decided)
        for member, compiled in run.candidates([m for m in chain.members if m not in tried]):
            why = "it runs on every rank together: none times it" if together else "shipped only"
            return run.use(member, compiled, f", the chain's first that verifies ({why})")
        run.tell("")  # a rank deciding otherwise waits for none
        raise run.failed()
    if store is not None and tell is None:
        return _as_rank_zero_chose(run, store, rank_key, environ)
    remembered = None if mode == "fresh" or unknown else chain.context.cache.get(KIND, found)
    if isinstance(remembered, dict) and remembered.get("member") in chain.members:
        for member, compiled in run.candidates([remembered["member"]]):
            return run.use(member, compiled, f", as remembered ({said_of(remembered)})")
    passed = dict(run.candidates())
    if not passed:
        run.tell("")
        raise run.failed()
    timeable = run.reference is not None and run.reference.unverified is None
    samples, raised = timed(run, passed) if len(passed) > 1 and timeable else ({}, {})
    untimed = "no other member to time" if len(passed) == 1 else "it cannot be run to time it"
    if raised and not samples:  # the same step raised for every member: timing's, not theirs
        untimed = f"running it again raised for every member: {next(iter(raised.values()))}"
    else:
        for failed, why in raised.items():
            run.skip(failed, f"running it while timed raised {why}", "warning")
            passed.pop(failed)
    member, speedup, how = choose(list(passed), samples, chain.definition.min_speedup, untimed)
    # In the order backends.choices states it: what was chosen, how, what decided it.
    choice = {
        "chain": chain.__name__,
        "member": member,
        "graph": run.words,
        "key": found,
        "how": how,
        "first": next(iter(passed)),
        "speedup": round(speedup, 3),
        "when": time.time(),
        **decided,
        "members": {m: in_words(i) for m, i in members(chain.definition, chain.info).items()},
        "seconds": {m: round(statistics.median(s), 6) for m, s in samples.items()},
        "spread": {m: spread(s) for m, s in samples.items()},
        "skipped": dict(run.failures),
    }
    run.say(f"{timings(choice)}; chose {member!r} ({how})")
    if not unknown:
        chain.context.cache.put(KIND, found, choice)
    # Shipped, a choice keyed by what no process writes alike would be found by processes
    # given something else: tune hears only that it was made.
    made = {"unshippable": run.words} if unknown else choice
    _record(environ, {**made, "manifest": chain.definition.source.path})
    compiled = passed.pop(member)
    passed.clear()  # the members not chosen, and what they compiled, go now
    return run.use(member, compiled, f", {how}")


class FastestChain(ChainBackend):
    """A chain with ``select = "fastest"``: see the module's docstring."""

    __call__ = fastest


def collective(gm: Any) -> bool:
    """Whether the graph calls a collective of torch.distributed (the functional ones of
    tensor parallelism and FSDP, ``c10d``'s ops, ``torch.distributed``'s functions)."""
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        target = node.target if node.op == "call_function" else None
        where = str(getattr(target, "namespace", None) or getattr(target, "__module__", ""))
        if "c10d" in where or where.startswith("torch.distributed"):
            return True
    return False


def said_of(choice: Mapping[str, Any]) -> str:
    """How a choice was made, and when, in words."""
    when = choice.get("when") or 0
    if isinstance(when, (int, float)):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(when))
    return f"{choice.get('how') or 'decided'}; decided {when}"


def remembered(
    cache: Cache, chain: BackendDefinition, info: Callable[[str], BackendInfo]
) -> list[dict[str, Any]]:
    """The choices remembered here for ``chain`` as it is now, newest first."""
    now = identity(chain, info)
    found = [e for e in cache.entries(KIND) if isinstance(e, dict) and e.get("identity") == now]
    return sorted(found, key=lambda entry: -float(entry.get("when", 0)))


def _warn_nearest(run: Run, shipped: Shipped, decided: Mapping[str, Any]) -> None:
    """``TORCH_BACKENDS_SELECT=shipped`` and no choice applies: one warning, naming what differs
    from the nearest choice shipped for this chain (or that none was)."""
    tables = [t for t, _ in shipped.every() if t.get("chain") == run.name]
    nearest = min((differences(decided, t) for t in tables), key=len, default=None)
    why = (
        f"none was shipped for chain {run.name!r}"
        if nearest is None
        else f"the nearest shipped choice differs: {'; '.join(nearest)}"
    )
    run.say(
        f"no shipped choice applies ({why}); TORCH_BACKENDS_SELECT=shipped times nothing: it"
        " compiles with the chain's first member that verifies",
        "warning",
    )


# ------------------------------------------------------------------ every rank one choice


def _as_rank_zero_chose(run: Run, store: Any, name: str, environ: Mapping[str, str]) -> Any:
    """On a rank other than 0: compile with the member rank 0 chose, timing nothing; where
    none comes in time, or this rank cannot run it, with the chain's first member that
    verifies, said as a warning naming both."""
    limit = _limit(environ.get(SELECT_TIMEOUT_VAR))
    chosen: str | None = None
    try:
        if _store.wait(store, [name], limit):
            chosen = store.get(name).decode()
        else:
            _rank_warns(run, f"heard no choice from rank 0 within {limit.total_seconds():g} s")
    except Exception as exc:  # rank 0's store gone
        _rank_warns(run, f"heard no choice from rank 0 ({said(exc)})")
    if chosen:
        listed = [chosen] if chosen in run.chain.members else []
        for member, compiled in run.candidates(listed):
            return run.use(member, compiled, ", rank 0's choice")
        why = "its chain does not list it" if not listed else "it cannot be used here"
        for member, compiled in run.candidates([m for m in run.chain.members if m != chosen]):
            _rank_warns(run, f"cannot run rank 0's choice {chosen!r} ({why}): it runs {member!r}")
            return run.use(member, compiled, ", not rank 0's choice")
        raise run.failed()
    for member, compiled in run.candidates():
        return run.use(member, compiled, ", the chain's first that verifies")
    raise run.failed()


def _rank_warns(run: Run, what: str) -> None:
    run.say(f"rank {_store.rank()} {what}; ranks may run different members", "warning")


def _limit(value: str | None) -> timedelta:
    """``TORCH_BACKENDS_SELECT_TIMEOUT`` as a time limit: a positive number of seconds (past
    what the store can count, its longest); anything else is said once, and the default
    used."""
    if value is not None and value.strip():
        with contextlib.suppress(ValueError):  # no number
            number = float(value)
            if 0 < number < float("inf"):
                return _store.time_limit(min(number, _store.LONGEST_DAYS * 86400.0))
        _once(
            f"{SELECT_TIMEOUT_VAR}={value!r} is not a positive number of seconds: a rank"
            f" waits the default {SELECT_TIMEOUT:g} s for rank 0's choice"
        )
    return _store.time_limit(SELECT_TIMEOUT)


@functools.cache  # said once a process (a bad time limit, a value no process writes alike)
def _once(message: str) -> None:
    logger.warning("warning: %s", message)


def _record(environ: Mapping[str, str], choice: Mapping[str, Any]) -> None:
    """Under ``torch-backends tune``, hand the choice to it (and the manifest of its chain,
    beside which tune writes it): a file in the folder it names."""
    folder = environ.get(TUNING_VAR)
    if not folder:
        return
    name = f"choice-{os.getpid()}-{time.monotonic_ns()}.json"
    with (
        contextlib.suppress(OSError),
        open(os.path.join(folder, name), "w", encoding="utf-8") as out,
    ):
        json.dump(dict(choice), out)
