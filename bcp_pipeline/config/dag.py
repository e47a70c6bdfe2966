"""Stage graphs: topological order, cycle detection, and the sub-graphs that --from / --only select."""

from __future__ import annotations


def find_cycle(needs: dict[str, list[str]]) -> list[str] | None:
    """A cycle as [a, b, ..., a] if the `needs` graph has one, else None (unknown names are ignored)."""
    visiting, done = set(), set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        visiting.add(node)
        path.append(node)
        for upstream in needs.get(node, []):
            if upstream in visiting:
                return path[path.index(upstream) :] + [upstream]
            if upstream not in done and upstream in needs:
                found = visit(upstream)
                if found:
                    return found
        visiting.discard(node)
        done.add(node)
        path.pop()
        return None

    for node in needs:
        if node not in done:
            found = visit(node)
            if found:
                return found
    return None


def topological_order(needs: dict[str, list[str]]) -> list[str]:
    """Every node after its needs; ties keep the mapping's (file) order. Assumes no cycle."""
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(needs):
        for node, upstream in needs.items():
            if node not in placed and all(u in placed for u in upstream):
                order.append(node)
                placed.add(node)
                break
        else:
            raise ValueError(f"cycle among {sorted(set(needs) - placed)}")
    return order


def downstream_of(needs: dict[str, list[str]], start: str) -> set[str]:
    """`start` and every stage that depends on it, directly or not."""
    selected = {start}
    changed = True
    while changed:
        changed = False
        for node, upstream in needs.items():
            if node not in selected and selected.intersection(upstream):
                selected.add(node)
                changed = True
    return selected
