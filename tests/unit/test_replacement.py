"""Day-2 pod replacement (``multilane.operator.rollout.replacement``): one outdated worker at a time,
drained to warm owners before it is deleted."""

from __future__ import annotations

from multilane.operator.platform import WorkerInfo
from multilane.operator.rollout.replacement import ReplacementChoice, choose_replacement, ready_to_delete


def w(
    i: int, rev: str = "new", alive: bool = True, ready: bool | None = True, term: bool = False
) -> WorkerInfo:
    return WorkerInfo(f"c-{i}", i, alive, f"http://c-{i}", terminating=term, revision=rev, ready=ready)


def test_nothing_without_a_desired_revision_or_when_every_worker_is_current() -> None:
    assert choose_replacement([w(0, "old")], None, 1) == ReplacementChoice()
    assert choose_replacement([w(0), w(1)], "new", 2) == ReplacementChoice()


def test_the_highest_outdated_ordinal_is_drained_first() -> None:
    choice = choose_replacement([w(0, "old"), w(1, "old"), w(2)], "new", 3)
    assert choice.drain == "c-1" and choice.delete_now is None
    assert choice.outdated == ("c-1", "c-0")


def test_deleted_only_when_it_owns_nothing_and_no_change_runs() -> None:
    choice = choose_replacement([w(0, "old"), w(1, "old")], "new", 2)
    assert ready_to_delete(choice, {"c-1": ("t/0",)}, change_running=False) is None
    assert ready_to_delete(choice, {"c-1": ()}, change_running=True) is None
    assert ready_to_delete(choice, {"c-1": (), "c-0": ("t/0",)}, change_running=False) == "c-1"


def test_one_at_a_time_a_starting_replacement_holds_the_next() -> None:
    # c-1 was replaced: its new pod is not ready yet (restoring, or starting)
    assert choose_replacement([w(0, "old"), w(1, ready=False)], "new", 2).drain is None
    assert choose_replacement([w(0, "old"), w(1, alive=False)], "new", 2).waiting == "c-1 not ready yet"
    # the pod is gone and not created again yet
    assert choose_replacement([w(0, "old")], "new", 2).waiting.startswith("worker ordinal 1")
    # a terminating one
    assert choose_replacement([w(0, "old"), w(1, "old", term=True)], "new", 2).drain is None


def test_a_dead_or_lone_worker_is_deleted_at_once() -> None:
    dead = choose_replacement([w(0), w(1, "old", alive=False, ready=False)], "new", 2)
    assert dead.delete_now == "c-1" and ready_to_delete(dead, {"c-1": ("t/0",)}, True) == "c-1"
    assert choose_replacement([w(0, "old")], "new", 1).delete_now == "c-0"


def test_workers_beyond_the_decided_size_are_left_to_the_scale_down() -> None:
    assert choose_replacement([w(0), w(1, "old")], "new", 1) == ReplacementChoice()


def test_unknown_readiness_counts_as_ready_when_alive() -> None:
    assert choose_replacement([w(0, "old"), w(1, ready=None)], "new", 2).drain == "c-0"


def test_is_replacer_answers_as_the_runtime_protocol_check() -> None:
    """The per-class answer (a pass asks it several times) is isinstance's for every platform kind."""
    from multilane.operator.k8s.platform import KubernetesPlatform
    from multilane.operator.local.platform import LocalPlatform
    from multilane.operator.platform import WorkerReplacer, is_replacer

    class Replacer:
        async def desired_revision(self, ref: object) -> str | None:
            return None

        async def replace_worker(self, ref: object, name: str) -> None:
            return None

    class Plain:
        async def desired_revision(self, ref: object) -> str | None:
            return None

    assert is_replacer(Replacer()) and not is_replacer(Plain()) and not is_replacer(object())
    for obj in (Replacer(), Plain(), object(), Replacer()):
        assert is_replacer(obj) == isinstance(obj, WorkerReplacer)
    for cls in (KubernetesPlatform, LocalPlatform):
        assert is_replacer(cls.__new__(cls)) == issubclass(cls, WorkerReplacer)
    assert is_replacer(KubernetesPlatform.__new__(KubernetesPlatform))
