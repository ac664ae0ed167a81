"""The merge, alone: discoveries in, an index out; precedence, aliases, chains, the default."""

from __future__ import annotations

import pytest

from torch_backend_registry import (
    BackendDefinition,
    ManifestError,
    Problem,
    Source,
    UnknownBackendError,
)
from torch_backend_registry._definition import DefaultDeclaration, Discovery
from torch_backend_registry._members import MAX_CHAIN_DEPTH
from torch_backend_registry._merge import merge


def found(kind: str, *definitions: BackendDefinition, default: str | None = None) -> Discovery:
    discovery = Discovery()
    discovery.definitions.extend(definitions)
    if default is not None:
        discovery.default = DefaultDeclaration(default, f"/{kind}.toml", 1, "default")
    return discovery


def backend(name: str, kind: str = "project", **fields: object) -> BackendDefinition:
    source = Source(kind, path=f"/{kind}.toml", line=1)  # type: ignore[arg-type]
    if "chain" not in fields and "target" not in fields:
        fields["target"] = f"m:{name}"
    return BackendDefinition(name, source, **fields)  # type: ignore[arg-type]


def test_the_highest_definition_wins_and_the_others_are_shadowed() -> None:
    env, project = backend("fast", "env"), backend("fast", "project")
    index = merge([found("env", env), found("project", project)])
    assert index.resolve("fast") is env
    assert index.info("fast").shadowed == (project,)


def test_disabled_hides_the_name_from_lower_sources_with_its_aliases() -> None:
    index = merge(
        [
            found("env", backend("fast", "env", enabled=False)),
            found("project", backend("fast", aliases=("f",)), backend("fast2")),
        ]
    )
    with pytest.raises(UnknownBackendError, match=r"disabled by /env.toml:1") as caught:
        index.resolve("fast")
    # Declared and left out: no other name was meant, and no listing would show it.
    assert str(caught.value) == "unknown backend 'fast' (disabled by /env.toml:1)."
    assert (caught.value.suggestions, caught.value.left_out) == ((), True)
    with pytest.raises(UnknownBackendError, match="Did you mean 'fast2'") as typo:
        index.resolve("fats2")
    assert str(typo.value).endswith(UnknownBackendError.HINT)
    with pytest.raises(UnknownBackendError, match=r"disabled by /env.toml:1"):
        index.resolve("f")  # the alias follows its canonical name
    assert [d.name for d in index.winners()] == ["fast2"]


def test_an_alias_resolves_to_whatever_its_canonical_name_resolves_to() -> None:
    # README's example: a deployment overrides op_counts without repeating its alias.
    override = backend("op_counts", "env", options={"top": 20})
    project = backend("op_counts", aliases=("ops",), options={"top": 5})
    index = merge([found("env", override), found("project", project)])
    assert index.resolve("ops") is override
    assert index.resolve("op_counts") is override


def test_a_higher_source_defining_the_alias_name_itself_wins() -> None:
    own = backend("ops", "env")
    index = merge([found("env", own), found("project", backend("op_counts", aliases=("ops",)))])
    assert index.resolve("ops") is own
    # ...and the lower alias declaration hides a lower backend of that name.
    index = merge(
        [
            found("project", backend("op_counts", aliases=("ops",))),
            found("entry-point", backend("ops", "entry-point")),
        ]
    )
    assert index.resolve("ops").name == "op_counts"
    assert [d.name for d in index.winners()] == ["op_counts"]


def test_aliases_that_name_each_other_across_sources_are_unknown_not_a_hang() -> None:
    index = merge(
        [
            found("env", backend("a", "env", aliases=("b",))),
            found("project", backend("b", aliases=("a",))),
        ]
    )
    assert index.resolve("a").name == "a"
    assert index.resolve("b").name == "a"


def test_the_first_default_by_precedence_is_the_default() -> None:
    index = merge([found("env", default="x"), found("project", backend("y"), default="y")])
    assert index.default is not None
    assert index.default.name == "x"
    problem = index.default_problem()
    assert problem is not None
    assert str(problem).startswith("/env.toml:1: default: unknown backend 'x'")


def test_a_broken_definition_raises_its_own_problem() -> None:
    problem = Problem("bad", path="/p.toml", line=3, key="backends.b.target")
    index = merge([found("project", BackendDefinition("b", Source("project"), problem=problem))])
    with pytest.raises(ManifestError) as caught:
        index.resolve("b")
    assert caught.value.problem == problem
    assert str(caught.value) == "/p.toml:3: backends.b.target: bad"


def test_chain_checks_are_linear_when_members_repeat() -> None:
    # c0 = [c1, c1], c1 = [c2, c2], ...: a walk that follows every member visits 2**40
    # paths, and would not end; a linear one is done at once, whatever the shape.
    levels = 40
    chains = [backend(f"c{i}", chain=(f"c{i + 1}", f"c{i + 1}")) for i in range(levels)]
    index = merge([found("project", *chains, backend(f"c{levels}"))])
    assert index.chain_problems == {}
    assert index.unknown_members() == {}
    looped = [*chains, backend(f"c{levels}", chain=("c0", "c0"))]  # and back to the start
    problems = merge([found("project", *looped)]).chain_problems
    assert sorted(problems) == sorted(f"c{i}" for i in range(levels + 1))
    assert "names itself (c0 -> c1 -> " in problems["c0"].message


def test_a_chain_deeper_than_the_limit_is_a_manifest_error_not_a_recursion_error() -> None:
    depth = 3000
    chains = [backend(f"c{i}", chain=(f"c{i + 1}",)) for i in range(depth)]
    index = merge([found("project", *chains, backend(f"c{depth}"))])
    problems = index.chain_problems
    assert f"nests {depth} chains deep, more than {MAX_CHAIN_DEPTH}" in problems["c0"].message
    assert problems["c0"].key == "backends.c0.chain"
    # Chains within the limit are fine.
    assert f"c{depth - MAX_CHAIN_DEPTH}" not in problems


def test_a_loop_is_reported_on_every_chain_in_it() -> None:
    index = merge(
        [
            found(
                "project",
                backend("a", chain=("b", "eager")),
                backend("b", chain=("c",)),
                backend("c", chain=("a",)),
                backend("outside", chain=("a",)),
                backend("eager"),
            )
        ]
    )
    problems = index.chain_problems
    assert set(problems) == {"a", "b", "c"}
    assert "names itself (b -> c -> a -> b)" in problems["b"].message


def test_unknown_members_are_named_and_a_chain_of_only_unknown_members_says_so() -> None:
    index = merge(
        [
            found(
                "project",
                backend("some", chain=("nope", "ok")),
                backend("typo", chain=("okk", "ok")),
                backend("dead", chain=("nope1", "nope2")),
                backend("mixed", chain=("nope", "okk", "ok")),
                backend("dead_typo", chain=("nope", "okk")),
                backend("ok"),
            )
        ],
        pytorch={"inductor"},
    )
    unknown = index.unknown_members()
    assert "names 'nope', which is not installed here; it skips it" in unknown["some"].message
    assert unknown["some"].severity == "note"
    assert "(did you mean 'okk' -> 'ok'?)" in unknown["typo"].message
    assert unknown["typo"].severity == "error"
    assert "'nope1', 'nope2', which are no usable backend; no member can be used here" in (
        unknown["dead"].message
    )
    assert unknown["dead"].severity == "error"
    # Beside a typo, a member merely not installed here is said as what it is: skipped.
    assert unknown["mixed"].message.endswith(
        "chain 'mixed' names 'okk', which is no usable backend (did you mean 'okk' -> 'ok'?);"
        " fix the name or remove it; it skips 'nope' when it runs"
    )
    # With no member here, the typo is still what to fix; the other is skipped.
    assert unknown["dead_typo"].message == (
        "chain 'dead_typo' names 'okk', which is no usable backend (did you mean 'okk' -> 'ok'?);"
        " no member can be used here; fix the name or remove it; it skips 'nope' when it runs"
    )
    # PyTorch's names, not read here, count as names a typo may have meant.
    typo = merge(
        [found("project", backend("c", chain=("inductr", "ok")), backend("ok"))],
        pytorch={"inductor"},
    )
    assert "(did you mean 'inductr' -> 'inductor'?)" in typo.unknown_members()["c"].message
    # A plugin named after another backend is no typo: a note, not an error.
    plugin = merge(
        [found("project", backend("c", chain=("inductor_cuda", "ok")), backend("ok"))],
        pytorch={"inductor"},
    )
    assert plugin.unknown_members()["c"].severity == "note"


def test_suggestions_are_of_names_that_resolve() -> None:
    index = merge([found("project", *(backend(f"name{i}") for i in range(500)))])
    with pytest.raises(UnknownBackendError) as caught:
        index.resolve("name1x")
    assert "name1" in caught.value.suggestions
    for _ in range(10):  # asked again, the same answer
        with pytest.raises(UnknownBackendError) as again:
            index.resolve("name1x")
        assert again.value.suggestions == caught.value.suggestions
