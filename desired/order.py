"""Cycles in `spec.after`: which jobs wait for each other, so that none of them could ever start.

Pure, and linear in the jobs and their `after` entries: Tarjan's strongly connected components
without recursion (a long chain of jobs needs no deep stack), then one breadth-first walk per
cycle found, to name it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, Sequence


def cycles(after: Mapping[str, Sequence[str]]) -> list[tuple[list[str], list[str]]]:
    """The jobs that wait for each other (`after`: job -> the jobs it waits for), group by group,
    each with the shortest cycle through its first name (that name first and last). A job naming
    only itself is left to the caller; names that are not keys of `after` are ignored."""
    edges = {job: [d for d in deps if d in after and d != job] for job, deps in after.items()}
    return [(sorted(group), _shortest_loop(min(group), edges, set(group)))
            for group in _components(edges) if len(group) > 1]


def _components(edges: Mapping[str, Sequence[str]]) -> Iterator[list[str]]:
    """Strongly connected components, by Tarjan's algorithm with an explicit stack."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(edges[root]))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    yield _pop_component(node, stack, on_stack)


def _pop_component(root: str, stack: list[str], on_stack: set[str]) -> list[str]:
    component = []
    while True:
        job = stack.pop()
        on_stack.discard(job)
        component.append(job)
        if job == root:
            return component


def _shortest_loop(start: str, edges: Mapping[str, Sequence[str]], members: set[str]) -> list[str]:
    """The shortest path from `start` back to itself inside its component (breadth first)."""
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in edges[node]:
            if nxt not in members or nxt in came:
                continue
            came[nxt] = node
            if nxt == start:
                back = [start]
                while node != start:
                    back.append(node)
                    node = came[node]
                return [start, *reversed(back)]
            queue.append(nxt)
    raise ValueError(f"{start} is on no cycle")  # unreachable: a component of two or more has one
