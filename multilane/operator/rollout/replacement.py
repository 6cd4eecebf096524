"""Day-2 pod replacement (``updateStrategy: OnDelete``): which worker to drain and when to delete it.
Pure: no I/O.

The StatefulSet's pod template carries a hash of the rendered template
(:data:`~multilane.operator.spec.children.TEMPLATE_HASH_ANNOTATION`); a pod whose hash differs runs an
outdated template (an image change in the CR, or an operator upgrade that renders the template
differently). Kubernetes replaces nothing by itself (``OnDelete``); the operator replaces one pod at a
time, so that every partition moves to a warm owner before its pod goes. Per control pass:

1. Nothing to do without a desired hash (no StatefulSet yet, or a platform without templates).
2. Outdated workers: ordinal below the decided replicas, not terminating, hash different from the
   desired one. None: done. They are replaced from the highest ordinal down (as a StatefulSet does).
3. One at a time: while a worker of the decided size is missing, terminating, up to date but not yet
   alive and ready (a replacement starting, or restoring what it was handed back), wait.
4. The candidate (highest outdated ordinal) is deleted at once when it is not alive (it holds nothing
   that can be handed over warm) or when no other worker is eligible (one replica: there is no warm
   owner; its partitions pause for the restart and are restored by the new pod).
5. Otherwise it is *drained*: the caller keeps it out of the eligible workers, so the assignment (the
   restore-before-handoff rollout with state, the eager protocol without) moves its partitions to
   the other workers.
6. It is deleted when it owns no partition and no assignment change or rollout is under way
   (:func:`ready_to_delete`, checked after the pass's assignment step). Its replacement comes up with
   the new template; once ready it is eligible again and the planner hands partitions back (step 3
   holds the next candidate until then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from multilane.operator.platform import WorkerInfo

__all__ = ["ReplacementChoice", "choose_replacement", "ready_to_delete"]


@dataclass(frozen=True, slots=True)
class ReplacementChoice:
    """This pass's part of a replacement. At most one of ``drain`` and ``delete_now`` is set."""

    drain: str | None = None  # keep out of the eligible workers (its partitions move away first)
    delete_now: str | None = None  # delete without draining (dead, or no other worker)
    outdated: tuple[str, ...] = ()  # workers on an outdated template, highest ordinal first
    waiting: str = ""  # why no candidate is taken this pass ("" otherwise)


def _is_up(worker: WorkerInfo) -> bool:
    return worker.alive and not worker.terminating and worker.ready is not False


def choose_replacement(
    workers: Sequence[WorkerInfo], desired: str | None, replicas: int
) -> ReplacementChoice:
    """Steps 1-5 of the module docstring."""
    # 1. desired hash known?
    if not desired:
        return ReplacementChoice()
    # 2. outdated workers, highest ordinal first
    current = [w for w in workers if w.ordinal < replicas]
    outdated = sorted(
        (w for w in current if not w.terminating and w.revision != desired),
        key=lambda w: -w.ordinal,
    )
    if not outdated:
        return ReplacementChoice()
    names = tuple(w.name for w in outdated)
    # 3. one at a time: a replacement still starting (or any worker of the size missing) holds the rest
    present = {w.ordinal for w in current}
    missing = [i for i in range(replicas) if i not in present]
    if missing:
        return ReplacementChoice(outdated=names, waiting=f"worker ordinal {missing[0]} not created yet")
    for w in current:
        if w.terminating:
            return ReplacementChoice(outdated=names, waiting=f"{w.name} terminating")
        if w.revision == desired and not _is_up(w):
            return ReplacementChoice(outdated=names, waiting=f"{w.name} not ready yet")
    # 4. delete at once: dead, or no other eligible worker to hand to
    candidate = outdated[0]
    others = [w for w in current if w.name != candidate.name and w.eligible]
    if not candidate.alive or not others:
        return ReplacementChoice(delete_now=candidate.name, outdated=names)
    # 5. drain
    return ReplacementChoice(drain=candidate.name, outdated=names)


def ready_to_delete(
    choice: ReplacementChoice, members: Mapping[str, Sequence[str]], change_running: bool
) -> str | None:
    """Step 6: the worker to delete now (the drained one once it owns nothing and no change runs, or
    the one to delete at once), else None."""
    if choice.delete_now:
        return choice.delete_now
    if choice.drain and not members.get(choice.drain) and not change_running:
        return choice.drain
    return None
