"""The grid capture-the-flag simulator: deterministic per (scenario seed, strategy).

A turn: our units move (one square at most), flag pickup / capture, the scripted enemy moves,
its pickup / capture, then every pair of adjacent enemies fights (hits drawn from one
`random.Random(seed)`), then units resting at their own flag heal. Both sides see only enemies
within `vision` squares (Manhattan) of one of their own units: fog of war decides what the
scripted opponent reacts to and what our units chase or avoid.

How the strategy acts (all fields matter):
- defense: share of our units held back around our base; they intercept visible intruders.
- path_bias: the lane attackers go through (entry, then exit, then the flag).
- formation: "column" (each at full speed), "wedge" (leaders wait for the slowest, so they
  arrive and fight together), "spread" (attackers split over the three lanes, bias lane first).
- aggression: how far attackers go out of their way to fight a visible enemy (0..4 squares),
  whether they stand and fight when engaged, and how much they pay to route around enemies.
- retreat_threshold: an attacker whose hit points fall below this share walks home to heal.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from selftaught.tasks.games.ctf_map import LANES, MAX_HP, UNIT_LETTERS

INF = float("inf")
BASE_HEAL_RADIUS = 1  # units this close to their own flag stand heal when not in a fight
HOME_GROUND_RADIUS = 2  # fighting this close to your own flag stand gives a bonus
DEFENDER_LEASH = 6  # our defenders do not chase farther than this from the base
GUARD_REACT = 3  # enemy guards react to intruders this close to their post
RAIDER_AVOIDANCE = 3.0  # raiders slip around our units rather than fight them


@dataclass
class Piece:
    name: str
    side: str  # "us" | "them"
    role: str  # us: attacker / defender; them: guard / raider / hunter
    pos: int
    hp: int = MAX_HP
    post: int | None = None
    lane: str | None = None
    waypoint: int = 0  # index into the unit's route
    retreating: bool = False
    carrying: bool = False
    alive: bool = True
    died_at: int | None = None


@dataclass
class GameResult:
    """What happened in one game, in numbers and in words."""

    captured: bool
    flag_lost: bool  # the enemy carried our flag to its stand
    turns_used: int
    turn_limit: int
    pickup_turn: int | None
    capture_turn: int | None
    carrier_deaths: list[tuple[int, tuple[int, int]]]
    attackers: int
    defenders: int
    our_alive: int
    our_total: int
    enemy_alive: int
    enemy_total: int
    progress: float  # 0..1: approach to the flag, then carrying it home, 1 = captured
    survival: float  # share of our units alive at the end
    efficiency: float  # 1 = captured in the fewest possible turns, 0 = not captured
    soft: float
    events: list[str] = field(default_factory=list)
    summary: str = ""
    frames: list[dict[str, tuple[int, int]]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Grid:
    """Flat-indexed grid with cached breadth-first distance maps (walls never change)."""

    def __init__(self, rows: list[str]):
        self.height, self.width = len(rows), len(rows[0])
        self.open = [ch != "#" for line in rows for ch in line]
        self.neighbors: list[list[int]] = []
        for i in range(self.width * self.height):
            r, c = divmod(i, self.width)
            near = []
            for nr, nc in ((r - 1, c), (r, c - 1), (r, c + 1), (r + 1, c)):
                if 0 <= nr < self.height and 0 <= nc < self.width:
                    j = nr * self.width + nc
                    if self.open[j]:
                        near.append(j)
            self.neighbors.append(near)
        self.row_of = [i // self.width for i in range(self.width * self.height)]
        self.col_of = [i % self.width for i in range(self.width * self.height)]
        self._bfs: dict[int, list[float]] = {}

    def index(self, cell: list[int] | tuple[int, int]) -> int:
        return cell[0] * self.width + cell[1]

    def cell(self, i: int) -> tuple[int, int]:
        return divmod(i, self.width)

    def manhattan(self, a: int, b: int) -> int:
        return abs(self.row_of[a] - self.row_of[b]) + abs(self.col_of[a] - self.col_of[b])

    def within(self, center: int, radius: int) -> list[tuple[int, int]]:
        """(cell, manhattan distance) for every cell within `radius` of `center`, walls too."""
        r0, c0 = self.row_of[center], self.col_of[center]
        out = []
        for r in range(max(0, r0 - radius), min(self.height, r0 + radius + 1)):
            span = radius - abs(r - r0)
            for c in range(max(0, c0 - span), min(self.width, c0 + span + 1)):
                out.append((r * self.width + c, abs(r - r0) + abs(c - c0)))
        return out

    def distances(self, target: int) -> list[float]:
        """Steps from every cell to `target` (INF where unreachable or a wall)."""
        if target not in self._bfs:
            dist = [INF] * len(self.open)
            dist[target] = 0
            frontier = [target]
            while frontier:
                nxt = []
                for i in frontier:
                    for j in self.neighbors[i]:
                        if dist[j] == INF:
                            dist[j] = dist[i] + 1
                            nxt.append(j)
                frontier = nxt
            self._bfs[target] = dist
        return self._bfs[target]

    def weighted_distances(self, target: int, enter_cost: list[float]) -> list[float]:
        """Cost from every cell to `target` where entering cell j costs enter_cost[j]."""
        dist = [INF] * len(self.open)
        dist[target] = 0.0
        heap = [(0.0, target)]
        while heap:
            d, j = heapq.heappop(heap)
            if d > dist[j]:
                continue
            for i in self.neighbors[j]:
                nd = d + enter_cost[j]
                if nd < dist[i]:
                    dist[i] = nd
                    heapq.heappush(heap, (nd, i))
        return dist


@lru_cache(maxsize=128)
def grid_for(rows: tuple[str, ...]) -> Grid:
    """One shared Grid (and its distance caches) per map: scoring many strategies on one
    scenario reuses every breadth-first search."""
    return Grid(list(rows))


class Simulation:
    """One game in progress. `play()` runs it to the end; tests drive `turn()` directly."""

    def __init__(self, state: dict[str, Any], strategy: dict[str, Any]):
        self.state = state
        self.strategy = strategy
        self.grid = grid_for(tuple(state["rows"]))
        self._phase_cache: dict[tuple[int, float], list[float]] = {}
        self.rng = random.Random(state["seed"])
        self.vision: int = state["vision"]
        self.turn_limit: int = state["turn_limit"]
        self.base = self.grid.index(state["base"])
        self.flag_stand = self.grid.index(state["flag"])
        self.turn = 0
        self.events: list[str] = []
        self.captured_at: int | None = None
        self.lost_at: int | None = None
        self.pickup_turn: int | None = None
        self.carrier_deaths: list[tuple[int, tuple[int, int]]] = []
        self.frames: list[dict[str, tuple[int, int]]] = []

        self.aggression = float(strategy["aggression"])
        self.engage_range = round(self.aggression * 4)
        self.avoid_weight = (1.0 - self.aggression) * 4.0
        self.retreat_below = float(strategy["retreat_threshold"]) * MAX_HP
        self.formation: str = strategy["formation"]
        bias: str = strategy["path_bias"]

        n_ours = len(state["our_units"])
        self.defenders_count = min(n_ours, max(0, round(float(strategy["defense"]) * n_ours)))
        self.attackers_count = n_ours - self.defenders_count
        lane_order = [bias] + [lane for lane in ("center", "left", "right") if lane != bias]
        self.units: list[Piece] = []
        for i, cell in enumerate(state["our_units"]):
            attacker = i < self.attackers_count
            lane = bias
            if attacker and self.formation == "spread":
                lane = lane_order[i % 3]
            self.units.append(
                Piece(
                    name=UNIT_LETTERS[i],
                    side="us",
                    role="attacker" if attacker else "defender",
                    pos=self.grid.index(cell),
                    lane=lane if attacker else None,
                )
            )
        defender_posts = self._posts_around(self.base, self.defenders_count)
        defenders = [u for u in self.units if u.role == "defender"]
        for unit, post in zip(defenders, defender_posts, strict=False):
            unit.post = post
        for i, spec in enumerate(state["enemy_units"]):
            self.units.append(
                Piece(
                    name=f"E{i + 1}",
                    side="them",
                    role=spec["role"],
                    pos=self.grid.index(spec["pos"]),
                    post=self.grid.index(spec["post"]) if spec["post"] else None,
                    lane=spec["lane"],
                    waypoint=1 if spec["role"] == "raider" else 0,  # raiders start inside the lane
                )
            )
        self.routes = {lane: self._route(lane, upward=True) for lane in LANES}
        self.enemy_routes = {lane: self._route(lane, upward=False) for lane in LANES}
        self.flag_distance = self.grid.distances(self.flag_stand)
        self.home_distance = self.grid.distances(self.base)
        self.start_gap = max(
            1.0, min(self.flag_distance[u.pos] for u in self.units if u.side == "us")
        )
        self.best_approach = self.start_gap  # closest any attacker came to the flag
        self.best_return = 0.0  # best share of the way home a carrier made
        self.lanes_taken = sorted({u.lane for u in self.units if u.role == "attacker" and u.lane})

    # -- helpers -------------------------------------------------------------------------
    def _posts_around(self, center: int, count: int) -> list[int]:
        dist = self.grid.distances(center)
        cells = sorted((d, i) for i, d in enumerate(dist) if 0 < d <= 2)
        return [i for _, i in cells[:count]] or [center] * count

    def _route(self, lane: str, upward: bool) -> list[int]:
        wp = self.state["waypoints"][lane]
        entry, exit_ = self.grid.index(wp["entry"]), self.grid.index(wp["exit"])
        if upward:
            return [entry, exit_, self.grid.index(self.state["flag"])]
        return [exit_, entry, self.grid.index(self.state["base"])]

    def alive(self, side: str) -> list[Piece]:
        return [u for u in self.units if u.alive and u.side == side]

    def visible_enemies(self, side: str) -> list[Piece]:
        """Enemies of `side` within vision of at least one living unit of `side` (shared)."""
        eyes = [u.pos for u in self.alive(side)]
        other = "them" if side == "us" else "us"
        return [
            e
            for e in self.alive(other)
            if any(self.grid.manhattan(e.pos, p) <= self.vision for p in eyes)
        ]

    def _occupied_by(self, side: str) -> set[int]:
        return {u.pos for u in self.alive(side)}

    def _adjacent_enemies(self, unit: Piece) -> list[Piece]:
        other = "them" if unit.side == "us" else "us"
        return [e for e in self.alive(other) if self.grid.manhattan(e.pos, unit.pos) <= 1]

    def _move_along(self, unit: Piece, dist: list[float], cost: list[float] | None = None) -> None:
        """One step down the distance map (or stay), never into a wall or an enemy's cell."""
        other = "them" if unit.side == "us" else "us"
        blocked = self._occupied_by(other)
        best, best_value = unit.pos, INF
        for j in self.grid.neighbors[unit.pos]:
            if j in blocked or dist[j] >= dist[unit.pos]:
                continue
            value = dist[j] + (cost[j] if cost else 1.0)
            if value < best_value:
                best, best_value = j, value
        unit.pos = best

    def _move_toward(self, unit: Piece, target: int) -> None:
        self._move_along(unit, self.grid.distances(target))

    def _avoidance_costs(self, seen: list[Piece], weight: float) -> list[float]:
        """Entering a cell next to a seen enemy costs extra, so paths bend around it."""
        cost = [1.0] * len(self.grid.open)
        for e in seen:
            for i, d in self.grid.within(e.pos, 2):
                cost[i] += weight if d <= 1 else weight * 0.4
        return cost

    def _move_avoiding(self, unit: Piece, target: int, seen: list[Piece], weight: float) -> None:
        if not seen or weight <= 0:
            self._move_toward(unit, target)
            return
        # What a side sees is fixed while it moves, so one cost map per (target, weight) per
        # phase serves every unit of that side.
        cost_key = (-1, weight)
        if cost_key not in self._phase_cache:
            self._phase_cache[cost_key] = self._avoidance_costs(seen, weight)
        cost = self._phase_cache[cost_key]
        if (target, weight) not in self._phase_cache:
            self._phase_cache[(target, weight)] = self.grid.weighted_distances(target, cost)
        self._move_along(unit, self._phase_cache[(target, weight)], cost)

    def _nearest(self, unit: Piece, others: list[Piece]) -> Piece | None:
        if not others:
            return None
        dist = self.grid.distances(unit.pos)
        return min(others, key=lambda o: (dist[o.pos], o.name))

    def _advance_waypoint(self, unit: Piece, route: list[int]) -> None:
        """A waypoint counts as passed once the unit stands on it or next to it."""
        last = len(route) - 1
        while unit.waypoint < last and self.grid.manhattan(unit.pos, route[unit.waypoint]) <= 1:
            unit.waypoint += 1

    def _route_remaining(self, unit: Piece) -> float:
        route = self.routes[unit.lane or "center"]
        total = self.grid.distances(route[unit.waypoint])[unit.pos]
        for a, b in zip(route[unit.waypoint :], route[unit.waypoint + 1 :], strict=False):
            total += self.grid.distances(b)[a]
        return total

    # -- our side ------------------------------------------------------------------------
    def _our_turn(self) -> None:
        self._phase_cache.clear()
        seen = self.visible_enemies("us")
        carrier = next((u for u in self.alive("us") if u.carrying), None)
        enemy_carrier = next((e for e in self.alive("them") if e.carrying), None)
        advancing = [
            u
            for u in self.alive("us")
            if u.role == "attacker" and not u.carrying and not u.retreating and carrier is None
        ]
        slowest = max((self._route_remaining(u) for u in advancing), default=0.0)
        for unit in self.alive("us"):
            if unit.role == "defender":
                self._defend(unit, seen, enemy_carrier)
            else:
                self._attack(unit, seen, carrier, slowest)

    def _defend(self, unit: Piece, seen: list[Piece], enemy_carrier: Piece | None) -> None:
        if self._adjacent_enemies(unit):
            return  # hold and fight
        if enemy_carrier is not None and enemy_carrier in seen:
            self._move_toward(unit, enemy_carrier.pos)
            return
        near_base = [e for e in seen if self.grid.manhattan(e.pos, self.base) <= DEFENDER_LEASH - 2]
        target = self._nearest(unit, near_base)
        if target is not None:
            self._move_toward(unit, target.pos)
        elif unit.post is not None:
            self._move_toward(unit, unit.post)

    def _attack(
        self, unit: Piece, seen: list[Piece], carrier: Piece | None, slowest: float
    ) -> None:
        if unit.carrying:
            self._move_avoiding(unit, self.base, seen, 4.0)
            return
        if unit.hp < self.retreat_below and not unit.retreating:
            unit.retreating = True
            self.events.append(f"turn {self.turn}: {unit.name} retreats to heal ({unit.hp} hp)")
        if unit.retreating:
            if unit.hp >= MAX_HP and self.grid.manhattan(unit.pos, self.base) <= BASE_HEAL_RADIUS:
                unit.retreating, unit.waypoint = False, 0
            else:
                self._move_avoiding(unit, self.base, seen, 4.0)
                return
        engaged = self._adjacent_enemies(unit)
        if engaged and self.aggression >= 0.5:
            return  # stand and fight
        prey = [e for e in seen if self.grid.manhattan(e.pos, unit.pos) <= self.engage_range]
        target_unit = self._nearest(unit, prey) if not engaged else None
        if target_unit is not None:
            self._move_toward(unit, target_unit.pos)
            return
        if carrier is not None:  # escort the carrier home
            if self.grid.manhattan(unit.pos, carrier.pos) > 1:
                self._move_avoiding(unit, carrier.pos, seen, self.avoid_weight)
            else:
                self._move_avoiding(unit, self.base, seen, self.avoid_weight)
            return
        route = self.routes[unit.lane or "center"]
        self._advance_waypoint(unit, route)
        if self.formation == "wedge" and self._route_remaining(unit) < slowest - 1:
            return  # wait for the rest of the wedge
        self._move_avoiding(unit, route[unit.waypoint], seen, self.avoid_weight)

    # -- their side (scripted) -----------------------------------------------------------
    def _their_turn(self) -> None:
        self._phase_cache.clear()
        seen = self.visible_enemies("them")
        our_carrier = next((u for u in self.alive("us") if u.carrying), None)
        for unit in self.alive("them"):
            if unit.carrying and unit.role == "raider":  # home the way it came, sneaking
                route = self.routes[unit.lane or "center"]
                self._advance_waypoint(unit, route)
                self._move_avoiding(unit, route[unit.waypoint], seen, RAIDER_AVOIDANCE)
                continue
            if unit.carrying:
                self._move_toward(unit, self.flag_stand)
                continue
            if self._adjacent_enemies(unit):
                continue  # engaged units hold and fight
            if our_carrier is not None and unit.role != "raider":
                target = our_carrier.pos if our_carrier in seen else self.base
                self._move_toward(unit, target)
                continue
            if unit.role == "guard":
                assert unit.post is not None
                near_post = [
                    e for e in seen if self.grid.manhattan(e.pos, unit.post) <= GUARD_REACT
                ]
                target_unit = self._nearest(unit, near_post)
                self._move_toward(unit, target_unit.pos if target_unit else unit.post)
            elif unit.role == "hunter":
                target_unit = self._nearest(unit, seen)
                if target_unit is not None:
                    self._move_toward(unit, target_unit.pos)
                else:
                    route = self.enemy_routes[unit.lane or "center"]
                    self._move_toward(unit, route[0])  # patrol the top of its lane
            else:  # raider: for our flag through its lane, slipping around our units
                route = self.enemy_routes[unit.lane or "center"]
                self._advance_waypoint(unit, route)
                self._move_avoiding(unit, route[unit.waypoint], seen, RAIDER_AVOIDANCE)

    # -- resolution ----------------------------------------------------------------------
    def _flags(self) -> None:
        our_flag_taken = any(e.carrying for e in self.alive("them"))
        their_flag_taken = any(u.carrying for u in self.alive("us"))
        for unit in self.alive("us"):
            if unit.carrying and unit.pos == self.base:
                self.captured_at = self.turn
                self.events.append(f"turn {self.turn}: {unit.name} brought the flag home")
                return
            if not their_flag_taken and unit.role == "attacker" and unit.pos == self.flag_stand:
                unit.carrying, their_flag_taken = True, True
                if self.pickup_turn is None:
                    self.pickup_turn = self.turn
                self.events.append(f"turn {self.turn}: {unit.name} picked up the flag")
            if unit.carrying:
                home = self.home_distance[self.flag_stand]
                share = 1.0 - self.home_distance[unit.pos] / max(home, 1)
                self.best_return = max(self.best_return, share)
            elif unit.role == "attacker":
                self.best_approach = min(self.best_approach, self.flag_distance[unit.pos])
        for unit in self.alive("them"):
            if unit.carrying and unit.pos == self.flag_stand:
                self.lost_at = self.turn
                self.events.append(f"turn {self.turn}: enemy {unit.name} carried our flag home")
                return
            if not our_flag_taken and unit.pos == self.base:
                unit.carrying, our_flag_taken, unit.waypoint = True, True, 0
                self.events.append(f"turn {self.turn}: enemy {unit.name} took our flag")

    def _strength(self, unit: Piece) -> float:
        allies = sum(
            1
            for u in self.alive(unit.side)
            if u is not unit and self.grid.manhattan(u.pos, unit.pos) <= 2
        )
        home = self.base if unit.side == "us" else self.flag_stand
        bonus = 0.5 if self.grid.manhattan(unit.pos, home) <= HOME_GROUND_RADIUS else 0.0
        post = unit.post if unit.role == "guard" and unit.lane is not None else None
        if post is not None and self.grid.manhattan(unit.pos, post) <= 1:
            bonus += 0.5  # lane holders fight dug in at their post
        return 1.0 + 0.5 * min(allies, 3) + bonus

    def _combat(self) -> set[str]:
        damage: dict[str, int] = {}
        fighting: set[str] = set()
        strength = {u.name: self._strength(u) for u in self.units if u.alive}
        for unit in self.units:
            if not unit.alive:
                continue
            foes = self._adjacent_enemies(unit)
            if not foes:
                continue
            fighting.add(unit.name)
            foe = min(foes, key=lambda f: (f.hp, f.name))
            p_hit = strength[unit.name] / (strength[unit.name] + strength[foe.name])
            if self.rng.random() < p_hit:
                damage[foe.name] = damage.get(foe.name, 0) + 1
        for unit in self.units:
            if unit.alive and unit.name in damage:
                unit.hp -= damage[unit.name]
                if unit.hp <= 0:
                    self._kill(unit)
        return fighting

    def _kill(self, unit: Piece) -> None:
        unit.alive, unit.died_at = False, self.turn
        r, c = self.grid.cell(unit.pos)
        who = unit.name if unit.side == "us" else f"enemy {unit.name}"
        if unit.carrying:
            unit.carrying = False
            if unit.side == "us":
                self.carrier_deaths.append((self.turn, (r, c)))
            self.events.append(
                f"turn {self.turn}: carrier {who} killed near ({r},{c}); flag returns"
            )
        else:
            self.events.append(f"turn {self.turn}: {who} killed near ({r},{c})")

    def _heal(self, fighting: set[str]) -> None:
        for unit in self.units:
            if not unit.alive or unit.name in fighting or unit.hp >= MAX_HP:
                continue
            home = self.base if unit.side == "us" else self.flag_stand
            if self.grid.manhattan(unit.pos, home) <= BASE_HEAL_RADIUS:
                unit.hp += 1

    def snapshot(self) -> dict[str, tuple[int, int]]:
        return {u.name: self.grid.cell(u.pos) for u in self.units if u.alive}

    def over(self) -> bool:
        return (
            self.captured_at is not None
            or self.lost_at is not None
            or self.turn >= self.turn_limit
            or not self.alive("us")
        )

    def step(self) -> None:
        """Play one turn."""
        self.turn += 1
        self._our_turn()
        self._flags()
        if self.captured_at is None:
            self._their_turn()
            self._flags()
        if self.captured_at is None and self.lost_at is None:
            self._heal(self._combat())

    def play(self, record_frames: bool = False) -> GameResult:
        if record_frames:
            self.frames.append(self.snapshot())
        while not self.over():
            self.step()
            if record_frames:
                self.frames.append(self.snapshot())
        return self._result()

    # -- outcome -------------------------------------------------------------------------
    def _result(self) -> GameResult:
        captured = self.captured_at is not None
        ours, theirs = self.alive("us"), self.alive("them")
        our_total = sum(1 for u in self.units if u.side == "us")
        enemy_total = len(self.units) - our_total
        if captured:
            progress = 1.0
        elif self.pickup_turn is not None:
            progress = 0.5 + 0.4 * self.best_return
        else:
            progress = 0.45 * max(0.0, 1.0 - self.best_approach / self.start_gap)
        survival = len(ours) / our_total
        efficiency = 0.0
        if captured:
            fastest = 2 * min(self.state["route_lengths"].values())
            spare = max(1, self.turn_limit - fastest)
            efficiency = min(1.0, max(0.0, (self.turn_limit - self.turn) / spare))
        soft = 0.6 * progress + 0.25 * survival + 0.15 * efficiency
        if self.lost_at is not None:
            soft *= 0.5
        result = GameResult(
            captured=captured,
            flag_lost=self.lost_at is not None,
            turns_used=self.turn,
            turn_limit=self.turn_limit,
            pickup_turn=self.pickup_turn,
            capture_turn=self.captured_at,
            carrier_deaths=list(self.carrier_deaths),
            attackers=self.attackers_count,
            defenders=self.defenders_count,
            our_alive=len(ours),
            our_total=our_total,
            enemy_alive=len(theirs),
            enemy_total=enemy_total,
            progress=round(progress, 4),
            survival=round(survival, 4),
            efficiency=round(efficiency, 4),
            soft=round(min(1.0, max(0.0, soft)), 4),
            events=list(self.events),
            frames=self.frames,
        )
        result.summary = self._summary(result)
        return result

    def _summary(self, res: GameResult) -> str:
        parts: list[str] = []
        if res.captured:
            parts.append(f"flag captured at turn {res.capture_turn} of {res.turn_limit} (win)")
        elif res.flag_lost:
            parts.append(f"the enemy carried our flag home at turn {self.lost_at} (loss)")
        elif not self.alive("us"):
            parts.append(f"all our units were killed by turn {res.turns_used}")
        else:
            parts.append(f"turn limit {res.turn_limit} reached without a capture")
        if res.attackers == 0:
            parts.append("no unit attacked (defense held everyone back)")
        if res.pickup_turn is not None and not res.captured:
            parts.append(f"flag picked up at turn {res.pickup_turn}")
        for turn, (r, c) in res.carrier_deaths:
            parts.append(f"carrier killed at turn {turn} near ({r},{c})")
        if res.pickup_turn is None and res.attackers > 0:
            gap = int(self.best_approach)
            squares = "square" if gap == 1 else "squares"
            parts.append(f"attackers got no closer than {gap} {squares} to the flag")
        retreats = sum(1 for e in self.events if "retreats" in e)
        if retreats:
            parts.append(f"{retreats} retreat(s) to heal")
        parts.append(
            f"{res.our_alive}/{res.our_total} of our units survived, "
            f"{res.enemy_total - res.enemy_alive}/{res.enemy_total} enemies killed"
        )
        parts.append(
            f"{res.attackers} attacker(s) via the {'/'.join(self.lanes_taken) or '-'} "
            f"{'lanes' if len(self.lanes_taken) > 1 else 'lane'}, "
            f"{res.defenders} defender(s)"
        )
        parts.append(_opponent_note(self.state))
        return "; ".join(parts)


def _opponent_note(state: dict[str, Any]) -> str:
    style, lane = state["opponent"]["style"], state["opponent"]["lane"]
    return {
        "turtle": "the opponent turtled around its flag",
        "lane_guard": f"the opponent held the {lane} lane",
        "raider": f"the opponent raided through the {lane} lane",
        "hunter": "the opponent hunted our units",
    }[style]


def play(
    state: dict[str, Any], strategy: dict[str, Any], record_frames: bool = False
) -> GameResult:
    """Play one game of scenario `state` with a (schema-valid) strategy."""
    return Simulation(state, strategy).play(record_frames=record_frames)
