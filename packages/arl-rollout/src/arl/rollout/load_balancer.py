"""Routes generation calls to engine replicas: sticky by trajectory, else least in-flight, healthy only.

A multi-turn trajectory keeps hitting the replica that holds its prefix cache; a new trajectory goes to
the healthy replica with the fewest requests in flight. Stickiness is forgotten when the trajectory
releases. A replica marked unhealthy (it died) is never picked again; a trajectory stuck to it moves.
"""

from __future__ import annotations

from collections import OrderedDict

from arl.rollout.errors import NoHealthyReplicaError


class LoadBalancer:
    def __init__(self, num_replicas: int, max_sticky: int = 100_000) -> None:
        if num_replicas < 1:
            raise ValueError("LoadBalancer needs at least one replica")
        self._in_flight = [0] * num_replicas
        self._healthy = [True] * num_replicas
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._max_sticky = max_sticky

    def acquire(self, trajectory_id: str) -> int:
        """Pick a healthy replica for one call of `trajectory_id` and count it in flight."""
        replica = self._sticky.get(trajectory_id)
        if replica is None or not self._healthy[replica]:
            live = [i for i, ok in enumerate(self._healthy) if ok]
            if not live:
                raise NoHealthyReplicaError(f"all {len(self._healthy)} engine replicas are unhealthy")
            replica = min(live, key=self._in_flight.__getitem__)
            self._sticky[trajectory_id] = replica
            if len(self._sticky) > self._max_sticky:  # bound memory if callers never release
                self._sticky.popitem(last=False)
        else:
            self._sticky.move_to_end(trajectory_id)
        self._in_flight[replica] += 1
        return replica

    def release(self, replica: int) -> None:
        """One call on `replica` finished."""
        self._in_flight[replica] -= 1

    def forget(self, trajectory_id: str) -> None:
        """The trajectory is over; drop its stickiness."""
        self._sticky.pop(trajectory_id, None)

    def mark_unhealthy(self, replica: int) -> bool:
        """Leave `replica` out from now on; False if it already was."""
        was = self._healthy[replica]
        self._healthy[replica] = False
        return was

    @property
    def healthy(self) -> list[int]:
        """Indices of the replicas still in use."""
        return [i for i, ok in enumerate(self._healthy) if ok]

    @property
    def in_flight(self) -> list[int]:
        return list(self._in_flight)
