"""Scenario generation for grid capture-the-flag.

One scenario = a seeded map (walls, three lanes between our base at the bottom and the enemy
flag at the top), the forces of both sides, the opponent's scripted style, a vision radius, a
turn limit and at most one constraint on the strategy. Everything is plain JSON so that an
Example's `state` can be stored, shipped and replayed; the same seed always gives the same
scenario (only `random.Random(seed)` is used, never the global RNG or `hash()`).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

LANES = ("left", "center", "right")
STYLES = ("turtle", "lane_guard", "raider", "hunter")
MAX_HP = 4
UNIT_LETTERS = "abcdefgh"

Cell = tuple[int, int]  # (row, col); row 0 is the enemy's edge at the top


def lane_columns(width: int) -> dict[str, tuple[int, int]]:
    """Column span of each lane: two vertical dividers split the middle of the map in three."""
    left_divider = (width - 5) // 2
    right_divider = width - 1 - left_divider
    return {
        "left": (0, left_divider - 1),
        "center": (left_divider + 1, right_divider - 1),
        "right": (right_divider + 1, width - 1),
    }


def bfs_distances(rows: list[str], start: Cell) -> dict[Cell, int]:
    """Steps from `start` to every reachable open cell (4-neighbourhood)."""
    height, width = len(rows), len(rows[0])
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r, c - 1), (r, c + 1), (r + 1, c)):
            inside = 0 <= nr < height and 0 <= nc < width
            if inside and rows[nr][nc] != "#" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def _open_cells(rows: list[str]) -> list[Cell]:
    return [(r, c) for r, line in enumerate(rows) for c, ch in enumerate(line) if ch != "#"]


def _connected(rows: list[str]) -> bool:
    cells = _open_cells(rows)
    return len(bfs_distances(rows, cells[0])) == len(cells)


def _set(rows: list[str], cell: Cell, ch: str) -> list[str]:
    r, c = cell
    out = list(rows)
    out[r] = out[r][:c] + ch + out[r][c + 1 :]
    return out


def _lane_passable(rows: list[str], cols: tuple[int, int], lane_rows: tuple[int, int]) -> bool:
    """Whether the lane's bottom row reaches its top row without leaving the lane."""
    (c0, c1), (top, bottom) = cols, lane_rows
    frontier = [(bottom, c) for c in range(c0, c1 + 1) if rows[bottom][c] != "#"]
    seen = set(frontier)
    while frontier:
        r, c = frontier.pop()
        if r == top:
            return True
        for nr, nc in ((r - 1, c), (r, c - 1), (r, c + 1), (r + 1, c)):
            inside = top <= nr <= bottom and c0 <= nc <= c1
            if inside and rows[nr][nc] != "#" and (nr, nc) not in seen:
                seen.add((nr, nc))
                frontier.append((nr, nc))
    return False


def lane_route_length(state: dict[str, Any], lane: str) -> int:
    """Steps from our base to the enemy flag when forced through `lane` (entry, then exit)."""
    rows = state["rows"]
    base, flag = tuple(state["base"]), tuple(state["flag"])
    entry, exit_ = (tuple(state["waypoints"][lane][k]) for k in ("entry", "exit"))
    return (
        bfs_distances(rows, base)[entry]
        + bfs_distances(rows, entry)[exit_]
        + bfs_distances(rows, exit_)[flag]
    )


def generate_scenario(seed: int) -> dict[str, Any]:
    """The scenario for `seed` (deterministic)."""
    rng = random.Random(seed)
    width = rng.choice([9, 11, 13])
    height = rng.choice([11, 12, 13])
    top, bottom = 3, height - 4  # rows of the walled lanes (inclusive)
    lanes = lane_columns(width)
    left_divider, right_divider = lanes["left"][1] + 1, lanes["center"][1] + 1

    rows = ["." * width for _ in range(height)]
    for r in range(top, bottom + 1):
        rows = _set(rows, (r, left_divider), "#")
        rows = _set(rows, (r, right_divider), "#")

    # Waypoints: the open cells at the two ends of each lane, nearest the lane's middle column.
    waypoints: dict[str, dict[str, list[int]]] = {}
    for lane, (c0, c1) in lanes.items():
        mid = (c0 + c1) // 2
        waypoints[lane] = {"entry": [bottom, mid], "exit": [top, mid]}

    rows, status, blocked_lane = _lane_features(rng, rows, lanes, top, bottom)

    flag = (1, rng.randint(1, width - 2))
    base = (height - 2, rng.randint(1, width - 2))

    # A few rocks in the open ground at both ends, kept only if the map stays connected.
    keep_clear = {flag, base} | {tuple(w) for wp in waypoints.values() for w in wp.values()}
    rows = _scatter_rocks(rng, rows, keep_clear, bottom)

    # Our units start on the open cells nearest our base (not on it, so the map shows B).
    from_base = bfs_distances(rows, base)
    our_count = rng.randint(4, 6)
    near_base = sorted((d, cell) for cell, d in from_base.items() if d > 0)
    our_units = [list(cell) for _, cell in near_base[:our_count]]

    enemy_count = rng.randint(max(3, our_count - 2), our_count + 1)
    style = rng.choice(STYLES)
    open_lanes = [lane for lane in LANES if lane != blocked_lane]
    state: dict[str, Any] = {
        "seed": seed,
        "width": width,
        "height": height,
        "rows": rows,
        "lane_rows": [top, bottom],
        "lanes": {lane: list(span) for lane, span in lanes.items()},
        "lane_status": status,
        "waypoints": waypoints,
        "flag": list(flag),
        "base": list(base),
        "our_units": our_units,
        "vision": rng.choice([3, 4]),
    }
    route = {lane: lane_route_length(state, lane) for lane in LANES}
    state["route_lengths"] = route
    shortest = min(route.values())
    state["turn_limit"] = 2 * shortest + rng.randint(10, 22)

    # Holders and hunters favour the obvious lane (the shortest open one); raiders pick any.
    obvious = min(open_lanes, key=lambda lane: (route[lane], LANES.index(lane)))
    favour_obvious = style != "raider" and rng.random() < 0.6
    opponent_lane = obvious if favour_obvious else rng.choice(open_lanes)
    state["opponent"] = {"style": style, "lane": opponent_lane}
    state["enemy_units"] = _place_enemies(rows, state, style, opponent_lane, enemy_count, rng)

    state["constraints"] = _draw_constraint(rng, our_count, open_lanes)
    return state


def _lane_features(
    rng: random.Random, rows: list[str], lanes: dict[str, tuple[int, int]], top: int, bottom: int
) -> tuple[list[str], dict[str, str], str | None]:
    """Rubble narrows a lane; at most one lane is blocked outright."""
    status = {lane: "open" for lane in LANES}
    blocked_lane = rng.choice(LANES) if rng.random() < 0.3 else None
    for lane, (c0, c1) in lanes.items():
        inner_rows = list(range(top + 1, bottom))
        if lane == blocked_lane:
            r = rng.choice(inner_rows)
            for c in range(c0, c1 + 1):
                rows = _set(rows, (r, c), "#")
            status[lane] = f"blocked at row {r}"
        elif rng.random() < 0.45:
            placed = 0
            for _ in range(rng.randint(2, 4)):
                candidate = _set(rows, (rng.choice(inner_rows), rng.randint(c0, c1)), "#")
                # rubble narrows a lane but never closes it, nor walls off a pocket
                if _lane_passable(candidate, (c0, c1), (top, bottom)) and _connected(candidate):
                    rows = candidate
                    placed += 1
            if placed:
                status[lane] = "rubble"
    return rows, status, blocked_lane


def _scatter_rocks(
    rng: random.Random, rows: list[str], keep_clear: set[tuple[int, ...]], bottom: int
) -> list[str]:
    """1-4 rocks in the open ground above and below the lanes, off the kept-clear cells."""
    height, width = len(rows), len(rows[0])
    for _ in range(rng.randint(1, 4)):
        r = rng.choice([0, 1, 2, bottom + 1, bottom + 2, height - 1])
        c = rng.randint(0, width - 1)
        if any(abs(r - kr) + abs(c - kc) <= 1 for kr, kc in keep_clear):
            continue
        candidate = _set(rows, (r, c), "#")
        if _connected(candidate):
            rows = candidate
    return rows


def _place_enemies(
    rows: list[str],
    state: dict[str, Any],
    style: str,
    lane: str,
    count: int,
    rng: random.Random,
) -> list[dict[str, Any]]:
    flag = tuple(state["flag"])
    from_flag = bfs_distances(rows, flag)
    # Guard posts: the cells one or two steps from the flag, in a seeded order.
    ring = sorted(cell for cell, d in from_flag.items() if 1 <= d <= 2)
    rng.shuffle(ring)
    ring.sort(key=lambda cell: from_flag[cell])
    top = state["lane_rows"][0]
    c0, c1 = state["lanes"][lane]
    # Lane posts: the open cells at the top end of the held lane, just inside it.
    lane_posts = [(r, c) for r in (top, top + 1) for c in range(c0, c1 + 1) if rows[r][c] != "#"]

    if style == "turtle":
        roles = ["guard"] * count
    elif style == "lane_guard":
        holders = max(2, count - 2)
        roles = ["holder"] * holders + ["guard"] * (count - holders)
    elif style == "raider":
        raiders = (count + 1) // 2
        roles = ["raider"] * raiders + ["guard"] * (count - raiders)
    else:
        roles = ["hunter"] * (count - 1) + ["guard"]

    units: list[dict[str, Any]] = []
    guard_posts, holder_posts = iter(ring), iter(lane_posts + ring)
    hunter_lanes = [lane] + [x for x in LANES if x != lane]
    start_cells = iter(sorted(ring, key=lambda cell: (from_flag[cell], cell)))
    # Raiders are already on their way: they start in the middle of their lane.
    middle = (state["lane_rows"][0] + state["lane_rows"][1]) // 2
    raid_cells = iter(
        sorted(
            (
                (r, c)
                for r in range(top, middle + 2)
                for c in range(c0, c1 + 1)
                if rows[r][c] != "#"
            ),
            key=lambda cell: (abs(cell[0] - middle), cell),
        )
    )
    for i, role in enumerate(roles):
        if role == "guard":
            post = next(guard_posts)
            units.append({"role": "guard", "pos": list(post), "post": list(post), "lane": None})
        elif role == "holder":
            post = next(holder_posts)
            units.append({"role": "guard", "pos": list(post), "post": list(post), "lane": lane})
        else:
            start = next(raid_cells) if role == "raider" else next(start_cells)
            unit_lane = lane if role == "raider" else hunter_lanes[i % 3]
            units.append({"role": role, "pos": list(start), "post": None, "lane": unit_lane})
    # Hunters start among the guard ring; keep two units off one cell.
    seen: set[tuple[int, int]] = set()
    spare = iter(sorted(cell for cell, d in from_flag.items() if 1 <= d <= 4))
    for unit in units:
        while tuple(unit["pos"]) in seen:
            unit["pos"] = list(next(spare))
        seen.add(tuple(unit["pos"]))
    return units


def _draw_constraint(rng: random.Random, our_count: int, open_lanes: list[str]) -> dict[str, Any]:
    constraints: dict[str, Any] = {
        "min_defense": None,
        "max_attackers": None,
        "forbidden_lane": None,
    }
    draw = rng.random()
    if draw < 0.45:
        return constraints
    if draw < 0.65:
        constraints["min_defense"] = rng.choice([0.2, 0.3, 0.4, 0.5])
    elif draw < 0.82:
        constraints["max_attackers"] = rng.randint(2, our_count - 1)
    else:
        constraints["forbidden_lane"] = rng.choice(open_lanes)
    return constraints
